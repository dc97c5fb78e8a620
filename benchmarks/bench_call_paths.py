"""What each way of running a call on a TPU host costs: the candidates for tpuslice's one
execution path, side by side in one run.

Usage: ``python benchmarks/bench_call_paths.py [--host-cpus 1] [--rounds 5] [--json]``

A local Ray cluster (``ray.cluster_utils.Cluster``) with two hosts of ``TPU: 4`` and
``--host-cpus`` CPUs each, and a head with no TPU; no tpuslice code runs in it, so the
figures are Ray's own. Each round makes a new placement group of one ``{"TPU": 4}``
bundle per host and runs one call per host, then removes the group. Candidates:

- ``task``: a task in its bundle holding its ``TPU`` (Ray 2.60's ``run_on_slice``, and
  tpuslice's path);
- ``task+marker``: the same with a ``runtime_env`` of one environment variable, which
  would keep TPU calls in workers of their own;
- ``actor``: an actor created in its bundle holding its ``TPU``, then called.

For each: a fresh driver's first call (a new driver process per round, connected and
with its group placed, timed from the call to its results), a warm driver's first call
into a new group, and a later call on the same group. Medians of ``--rounds``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import ray
from ray.cluster_utils import Cluster
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

HOSTS = 2
MARKER = {"env_vars": {"BENCH_TPU_CALLS": "1"}}
CANDIDATES = ("task", "task+marker", "actor")

CHILD = """
import sys, time, ray
sys.path.insert(0, sys.argv[3])
import bench_call_paths as b
ray.init(address=sys.argv[1], log_to_driver=False)
pg = b.group()
started = time.perf_counter()
b.first_call(sys.argv[2], pg)
print("SECONDS", time.perf_counter() - started, flush=True)
"""


@ray.remote(num_cpus=0)
def pid() -> int:
    return os.getpid()


@ray.remote(num_cpus=0, max_restarts=0)
class Host:
    def pid(self) -> int:
        return os.getpid()


def group() -> PlacementGroup:
    pg = placement_group([{"TPU": 4}] * HOSTS, strategy="STRICT_SPREAD")
    ray.get(pg.ready())
    return pg


def _options(pg: PlacementGroup, i: int, marker: bool) -> dict[str, Any]:
    extra: dict[str, Any] = {"runtime_env": MARKER} if marker else {}
    return {
        "resources": {"TPU": 4},
        "scheduling_strategy": PlacementGroupSchedulingStrategy(pg, i),
        **extra,
    }


def first_call(candidate: str, pg: PlacementGroup) -> Callable[[], list[int]]:
    """Run the candidate's first call on every host of ``pg``; return its next call."""
    if candidate == "actor":
        options = [_options(pg, i, False) for i in range(HOSTS)]
        actors = [Host.options(**o).remote() for o in options]  # type: ignore[attr-defined]
        ray.get([a.pid.remote() for a in actors])
        return lambda: ray.get([a.pid.remote() for a in actors])
    marker = candidate == "task+marker"

    def call() -> list[int]:
        return ray.get([pid.options(**_options(pg, i, marker)).remote() for i in range(HOSTS)])

    call()
    return call


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def fresh(address: str, candidate: str) -> float:
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(
        [sys.executable, "-c", CHILD, address, candidate, here],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    return float(next(line for line in out.splitlines() if line.startswith("SECONDS")).split()[1])


def run(host_cpus: int, rounds: int) -> dict[str, dict[str, float]]:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    for _ in range(HOSTS):
        cluster.add_node(num_cpus=host_cpus, resources={"TPU": 4})
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        samples: dict[str, dict[str, list[float]]] = {
            c: {"fresh": [], "warm_first": [], "later": []} for c in CANDIDATES
        }
        for candidate in CANDIDATES:  # warm this driver's workers once
            pg = group()
            first_call(candidate, pg)
            remove_placement_group(pg)
        for r in range(rounds):
            order = CANDIDATES[r % 3 :] + CANDIDATES[: r % 3]
            for candidate in order:
                samples[candidate]["fresh"].append(fresh(cluster.address, candidate))
                pg = group()
                started = time.perf_counter()
                again = first_call(candidate, pg)
                samples[candidate]["warm_first"].append(time.perf_counter() - started)
                samples[candidate]["later"].append(timed(again))
                remove_placement_group(pg)
        return {
            c: {k: statistics.median(v) * 1000 for k, v in rows.items()}
            for c, rows in samples.items()
        }
    finally:
        ray.shutdown()
        cluster.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host-cpus", type=int, default=1, help="CPUs of each host (1)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (5)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    medians = run(args.host_cpus, args.rounds)
    if args.json:
        print(json.dumps({"host_cpus": args.host_cpus, "load": load, "ms": medians}, indent=2))
        return
    print(f"{HOSTS} hosts of {args.host_cpus} CPU(s); load {load:.1f} at the start; medians, ms")
    print(f"{'candidate':<12} {'fresh driver':>13} {'warm, new group':>16} {'later call':>11}")
    for candidate, row in medians.items():
        print(
            f"{candidate:<12} {row['fresh']:>13.1f} {row['warm_first']:>16.1f} "
            f"{row['later']:>11.1f}"
        )


if __name__ == "__main__":
    main()
