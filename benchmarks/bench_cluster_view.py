"""How fast is the cluster view on big clusters? Run by hand (not a test):

    python benchmarks/bench_cluster_view.py [--rounds 7] [--json]

Builds synthetic ``ray.nodes()`` records for 100, 1,000 and 10,000 TPU VMs (v6e 4x4,
v5p 2x2x4, v4 2x2x2 and single-host v6e 2x4 slices; ~5% of hosts dead, ~20% busy) and times:

- ``ours: classify all``: ``build_snapshot``, every slice of every shape in one pass
  (target: 10,000 VMs in under 50 ms, linear in the node count);
- ``ours: ready x4``: the same, plus ready counts for all four shapes from that snapshot;
- ``Ray: ready x4``: Ray 2.60's ``ray.util.tpu.get_num_ready_tpu_slices``, once per shape.
  Its Ray reads (``ray.is_initialized``, ``ray.nodes``,
  ``ray._private.state.available_resources_per_node``) are replaced by the synthetic data;
  no Ray cluster is started.

The ``ready`` column shows what each counts: Ray reads a host with every TPU in use as free,
so it counts more ready slices than there are.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import ray
import ray._private.state
import ray.util.tpu as ray_tpu
from rich.console import Console
from rich.table import Table

from tpuslice._tpu.labels import host_labels, host_resources
from tpuslice._tpu.topology import slice_shape
from tpuslice._view.cluster import build_snapshot

SIZES = (100, 1_000, 10_000)
SHAPES = (
    slice_shape("4x4", "v6e"),
    slice_shape("2x2x4", "v5p"),
    slice_shape("2x2x2", "v4"),
    slice_shape("2x4", "v6e"),  # one 8-chip VM
)
DEAD, BUSY = 0.05, 0.20
TARGET_MS = 50.0

Node = dict[str, Any]
Available = dict[str, dict[str, float]]


def synthetic_cluster(num_vms: int, seed: int = 0) -> tuple[list[Node], Available]:
    """``num_vms`` TPU VM records plus a CPU head, and their available resources."""
    rng = random.Random(seed)
    nodes: list[Node] = [_node("head", "10.0.0.1", {"CPU": 8.0}, {}, alive=True)]
    available: Available = {"head": {"CPU": 8.0}}
    index = 0
    while len(nodes) - 1 < num_vms:
        shape = SHAPES[index % len(SHAPES)]
        name = f"{shape.pod_type}-{index}"
        index += 1
        for worker in range(min(shape.num_hosts, num_vms - (len(nodes) - 1))):
            serial = len(nodes)
            node_id = f"{serial:056x}"
            address = f"10.{serial // 65536}.{serial // 256 % 256}.{serial % 256}"
            resources = {**host_resources(shape, name, worker), "CPU": 100.0}
            labels = host_labels(shape, name, worker)
            alive = rng.random() >= DEAD
            nodes.append(_node(node_id, address, resources, labels, alive))
            if alive:
                available[node_id] = _in_use(dict(resources), rng)
    return nodes, available


def _node(
    node_id: str, address: str, resources: dict[str, float], labels: dict[str, str], alive: bool
) -> Node:
    """A ``ray.nodes()`` record; a dead node reports no resources, as in Ray."""
    return {
        "NodeID": node_id,
        "Alive": alive,
        "alive": alive,
        "NodeManagerAddress": address,
        "Resources": resources if alive else {},
        "Labels": labels,
    }


def _in_use(available: dict[str, float], rng: random.Random) -> dict[str, float]:
    """Busy hosts: half with every TPU in use (Ray drops the key), half with one TPU."""
    if rng.random() < BUSY:
        if rng.random() < 0.5:
            del available["TPU"]
        else:
            available["TPU"] -= 1
    return available


@contextmanager
def ray_reads_replaced(nodes: list[Node], available: Available) -> Iterator[None]:
    """Make Ray 2.60's TPU utilities read the synthetic cluster instead of a GCS."""
    saved = (ray.is_initialized, ray.nodes, ray._private.state.available_resources_per_node)
    ray.is_initialized = lambda: True
    ray.nodes = lambda: nodes
    ray._private.state.available_resources_per_node = lambda: available
    try:
        yield
    finally:
        ray.is_initialized, ray.nodes, ray._private.state.available_resources_per_node = saved


def ours_classify(nodes: list[Node], available: Available) -> int:
    return len(build_snapshot(nodes, available).slices)


def ours_ready(nodes: list[Node], available: Available) -> int:
    snapshot = build_snapshot(nodes, available)
    return sum(len(snapshot.ready(shape)) for shape in SHAPES)


def ray_ready(nodes: list[Node], available: Available) -> int:
    with ray_reads_replaced(nodes, available):
        return sum(
            ray_tpu.get_num_ready_tpu_slices(s.topology, s.accelerator_type, 1) for s in SHAPES
        )


def true_ready(nodes: list[Node], available: Available) -> int:
    """Slices whose every host is there and alive with nothing in use (the right answer)."""
    by_slice: dict[str, list[Node]] = {}
    for node in nodes:
        if node["Labels"]:
            by_slice.setdefault(node["Labels"]["ray.io/tpu-slice-name"], []).append(node)
    hosts = {s.pod_type: s.num_hosts for s in SHAPES}
    return sum(
        len(members) == hosts[members[0]["Labels"]["ray.io/tpu-pod-type"]]
        and all(n["Alive"] and available[n["NodeID"]] == n["Resources"] for n in members)
        for members in by_slice.values()
    )


@dataclass
class Timing:
    what: str
    vms: int
    rounds: int
    min_ms: float
    median_ms: float
    max_ms: float
    us_per_vm: float
    result: int


def timed(what: str, fn: Callable[[list[Node], Available], int], vms: int, rounds: int) -> Timing:
    """Time ``fn`` on a fresh synthetic cluster of ``vms`` VMs, ``rounds`` times (GC on,
    collected between rounds so one round's garbage does not bill the next)."""
    nodes, available = synthetic_cluster(vms)
    times, result = [], 0
    for _ in range(rounds):
        gc.collect()
        started = time.perf_counter()
        result = fn(nodes, available)
        times.append((time.perf_counter() - started) * 1000)
    median = statistics.median(times)
    return Timing(what, vms, rounds, min(times), median, max(times), median * 1000 / vms, result)


BENCHES: dict[str, Callable[[list[Node], Available], int]] = {
    "ours: classify all": ours_classify,
    "ours: ready x4": ours_ready,
    "Ray: ready x4": ray_ready,
}


def run(rounds: int) -> list[Timing]:
    return [timed(what, fn, vms, rounds) for vms in SIZES for what, fn in BENCHES.items()]


def table(timings: list[Timing], truth: dict[int, int]) -> Table:
    out = Table(title=f"Cluster view, median of {timings[0].rounds} rounds", title_justify="left")
    for column in ("VMs", "what", "min ms", "median ms", "max ms", "µs/VM", "result"):
        out.add_column(column, justify="left" if column == "what" else "right")
    for t in timings:
        result = f"{t.result}" + (f" (true {truth[t.vms]})" if "ready" in t.what else "")
        out.add_row(
            f"{t.vms:,}",
            t.what,
            f"{t.min_ms:.2f}",
            f"{t.median_ms:.2f}",
            f"{t.max_ms:.2f}",
            f"{t.us_per_vm:.2f}",
            result,
        )
    return out


def verdict(timings: list[Timing]) -> str:
    ours = {t.vms: t for t in timings if t.what == "ours: classify all"}
    biggest = ours[max(SIZES)]
    met = "met" if biggest.median_ms < TARGET_MS else "MISSED"
    growth = biggest.us_per_vm / ours[min(SIZES)].us_per_vm
    return (
        f"target {max(SIZES):,} VMs < {TARGET_MS:.0f} ms: {met} (median "
        f"{biggest.median_ms:.1f} ms); per-VM cost at {max(SIZES):,} vs {min(SIZES):,} VMs: "
        f"x{growth:.2f} (1.0 = perfectly linear)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds per case (>= 5)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    if args.rounds < 5:
        parser.error("--rounds must be at least 5")
    timings = run(args.rounds)
    truth = {vms: true_ready(*synthetic_cluster(vms)) for vms in SIZES}
    if args.json:
        report = {"timings": [asdict(t) for t in timings], "true_ready": truth}
        print(json.dumps({**report, "verdict": verdict(timings)}, indent=2))
        return
    console = Console()
    console.print(table(timings, truth))
    console.print(verdict(timings))


if __name__ == "__main__":
    main()
