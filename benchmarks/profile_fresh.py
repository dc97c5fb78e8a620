"""Where a fresh driver's first reservation and first call spend their time, phase by
phase, next to the raw Ray floor's fresh driver, in one run.

Usage: ``python benchmarks/profile_fresh.py [--host-cpus 1] [--slices 1] [--rounds 3]
[--hog]``

A SimulatedCluster of 4 x v6e 4x4 slices; each round starts one new driver process per
path (the floor, then ours), which connects, reserves ``--slices`` slices, runs one
trivial call per host, takes the results and exits. Ours is timed by wrapping, in the
child driver only, the library functions each phase goes through:

- ``imports``: ``import ray`` and ``import tpuslice`` (the floor: ``import ray``);
- ``connect``: ``ray.init``;
- ``queue``: the queue's ``join`` and ``wait`` calls (admission; the floor has none);
- ``cluster read``: reading the cluster view in the driver (none when the grant carries
  the view);
- ``agent lookups`` and ``owner probe``: finding the hosts' agents and asking them
  whether a process owns the TPU;
- ``placement``: creating the groups and waiting until they are placed;
- ``submit``: ``launch``, which exports the function on its first use;
- ``first results``: from the submission to the results (the workers' process starts,
  the tasks' scheduling into new groups, the calls);
- ``other``: the rest of the wall time.

Medians over ``--rounds``, ms.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

PHASES = (
    "imports",
    "connect",
    "queue",
    "cluster read",
    "agent lookups",
    "owner probe",
    "placement",
    "submit",
    "first results",
    "other",
)


def _timed(spent: dict[str, float], phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[phase] += time.perf_counter() - started

    return wrapper


def _patch(cls: type, name: str, spent: dict[str, float], phase: str) -> None:
    """Time a class's method (or static method) under ``phase``."""
    raw = inspect.getattr_static(cls, name)
    if isinstance(raw, staticmethod):
        setattr(cls, name, staticmethod(_timed(spent, phase, raw.__func__)))
    else:
        setattr(cls, name, _timed(spent, phase, raw))


def child(path: str, address: str, slices: int) -> None:
    """One fresh driver: time its phases and print them as JSON."""
    spent: dict[str, float] = defaultdict(float)
    start = time.perf_counter()
    import ray

    if path == "ours":
        import tpuslice
        from tpuslice._reserve import claim, ops
        from tpuslice._reserve.queue import agents, place
        from tpuslice._run import run

        spent["imports"] = time.perf_counter() - start
        place.QueuePlace.join = _timed(spent, "queue", place.QueuePlace.join)  # type: ignore[method-assign]
        place.QueuePlace.wait = _timed(spent, "queue", place.QueuePlace.wait)  # type: ignore[method-assign]
        _patch(ops.RayOps, "snapshot", spent, "cluster read")
        agents.Agents.handles = _timed(spent, "agent lookups", agents.Agents.handles)  # type: ignore[method-assign]
        claim.Reserver._free_of_owners = _timed(  # type: ignore[method-assign]
            spent, "owner probe", claim.Reserver._free_of_owners
        )
        _patch(ops.RayOps, "create_group", spent, "placement")
        _patch(ops.RayOps, "wait_placed", spent, "placement")
        run.launch = _timed(spent, "submit", run.launch)
    else:
        spent["imports"] = time.perf_counter() - start
    mark = time.perf_counter()
    ray.init(address=address, log_to_driver=False)
    spent["connect"] = time.perf_counter() - mark

    @ray.remote(num_cpus=0)
    def hello() -> int:
        return os.getpid()

    if path == "ours":
        spg = tpuslice.SlicePlacementGroup("4x4", "v6e", num_slices=slices)
        refs = tpuslice.run_on_slice(hello, tpu_slice=spg)
        submitted = time.perf_counter()
        ray.get(refs)
        spent["first results"] = time.perf_counter() - submitted
        total = time.perf_counter() - start
        timed = dict(spent)  # the shutdown's agent calls below are not part of the run
        spg.shutdown()
        spent = defaultdict(float, timed)
    else:
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        names = sorted(
            {
                n["Labels"]["ray.io/tpu-slice-name"]
                for n in ray.nodes()
                if n["Alive"] and "ray.io/tpu-slice-name" in n["Labels"]
            }
        )[:slices]
        mark = time.perf_counter()
        bundles = [{"TPU": 4} for _ in names for _ in range(4)]
        selectors = [
            {"ray.io/tpu-slice-name": name, "ray.io/tpu-worker-id": str(w)}
            for name in names
            for w in range(4)
        ]
        pg = placement_group(bundles, bundle_label_selector=selectors)
        ray.get(pg.ready())
        spent["placement"] = time.perf_counter() - mark
        mark = time.perf_counter()
        refs = [
            hello.options(
                resources={"TPU": 4},
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, i),
            ).remote()
            for i in range(len(bundles))
        ]
        spent["submit"] = time.perf_counter() - mark
        mark = time.perf_counter()
        ray.get(refs)
        spent["first results"] = time.perf_counter() - mark
        total = time.perf_counter() - start
        remove_placement_group(pg)
    spent["other"] = total - sum(spent.values())
    print("PHASES " + json.dumps({"total": total, **spent}), flush=True)


def fresh(path: str, address: str, slices: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", path, "--address", address, "--slices", str(slices)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("PHASES "))
    return {k: float(v) for k, v in json.loads(line[len("PHASES ") :]).items()}


def wait_idle(timeout_s: float = 60.0) -> None:
    """Until every slice is idle and no group is left (bounded)."""
    import tpuslice
    from tpuslice.testing import live_placement_groups

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        snapshot = tpuslice.read_snapshot()
        if not live_placement_groups() and all(
            s.state.value == "ready" for s in snapshot.slices.values()
        ):
            return
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host-cpus", type=int, default=1, help="CPUs per simulated host (1)")
    parser.add_argument("--slices", type=int, default=1, help="slices per reservation (1)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (3)")
    parser.add_argument("--hog", action="store_true", help="a one-core busy loop throughout")
    parser.add_argument("--child", choices=("floor", "ours"), help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.address, args.slices)
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_contention import cpu_hog

    from tpuslice.testing import SimulatedCluster

    load = os.getloadavg()[0]
    rows: dict[str, dict[str, list[float]]] = {p: defaultdict(list) for p in ("floor", "ours")}
    with (
        SimulatedCluster(
            [("v6e", "4x4", 4)], cpus_per_host=args.host_cpus, connect=True
        ) as cluster,
        contextlib.ExitStack() as during,
    ):
        if args.hog:
            during.enter_context(cpu_hog())
        for _ in range(args.rounds):
            for path in ("floor", "ours"):
                wait_idle()
                for phase, seconds in fresh(path, cluster.address, args.slices).items():
                    rows[path][phase].append(seconds)
    print(
        f"fresh driver, reserve {args.slices} slice(s) + first call; {args.host_cpus} CPU(s) "
        f"per host; load {load:.1f} at the start{'; CPU hog' if args.hog else ''}; "
        f"medians of {args.rounds}, ms"
    )
    print(f"{'phase':<16} {'floor':>9} {'ours':>9}")
    for phase in ("total", *PHASES):
        cells = [
            f"{statistics.median(rows[p][phase]) * 1000:>9.1f}"
            if rows[p].get(phase)
            else f"{'':>9}"
            for p in ("floor", "ours")
        ]
        print(f"{phase:<16} {' '.join(cells)}")


if __name__ == "__main__":
    main()
