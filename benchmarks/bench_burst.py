"""Reservations that start together in one driver, side by side.
Run by hand (not a test; it starts a simulated cluster, so only one at a time):

    python benchmarks/bench_burst.py [--threads 6] [--rounds 7] [--hold 0.5] [--json]

One SimulatedCluster of 4 slices of v6e 4x4 (16 simulated TPU VMs). In each round,
``--threads`` threads of this driver each ask for one slice at the same moment, hold it
``--hold`` seconds, and hand it back: a driver that starts several jobs at once (a sweep,
a tuner, a notebook's threads). More threads than slices make the last ones wait for a
hand-back. Paths, in an order rotated each round, on the same cluster:

- ``floor``: raw Ray. Thread *i* creates a placement group of one ``{"CPU": 1, "TPU": 4}``
  bundle per host, pinned by label to slice *i* mod 4 (an assignment no real driver
  knows ahead), waits for it to place, and removes it after the hold. Waiters are left
  pending in Ray's own scheduler.
- ``ray``: Ray 2.60's ``ray.util.tpu.SlicePlacementGroup`` per thread, ``ready()``,
  ``shutdown()``.
- ``ours``: ``tpuslice.SlicePlacementGroup`` per thread, as a ``with`` block.

Reported per path: the round's makespan (first ask to the last hand-back's end) next to
the ideal (waves of holds: ceil(threads / slices) x hold) and each thread's wait (ask to
held), as medians over the rounds, and the failures of all rounds summed (a thread still
running when its round gives up counts as one). Before each round the benchmark polls
(bounded) until every slice is idle and no placement group is left.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
import ray.util.tpu as ray_tpu
from ray.util.placement_group import remove_placement_group
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).parent))
from bench_slices import Setup, machine, raw_group_on, settle, simulated, warm_hosts

import tpuslice

PATHS = ("floor", "ray", "ours")
JOIN_BOUND_S = 300.0
"""How long a round may take before the benchmark gives up on it."""


def floor_job(setup: Setup, index: int, hold: float) -> float:
    """Reserve slice ``index`` mod N by label, hold, remove; the wait until placed."""
    started = time.perf_counter()
    pg = raw_group_on(setup, setup.names[index % len(setup.names)])
    try:
        ray.get(pg.ready(), timeout=JOIN_BOUND_S)
        waited = time.perf_counter() - started
        time.sleep(hold)  # the job's work
        return waited
    finally:
        remove_placement_group(pg)


def ray_job(setup: Setup, index: int, hold: float) -> float:
    """Ray 2.60: a slice placement group, ready, hold, shutdown."""
    started = time.perf_counter()
    spg = ray_tpu.SlicePlacementGroup(setup.topology, setup.generation)
    try:
        ray.get(spg.placement_group.ready(), timeout=JOIN_BOUND_S)
        waited = time.perf_counter() - started
        time.sleep(hold)
        return waited
    finally:
        spg.shutdown()


def ours_job(setup: Setup, index: int, hold: float) -> float:
    """tpuslice: a slice placement group as a with block."""
    started = time.perf_counter()
    with tpuslice.SlicePlacementGroup(setup.topology, setup.generation):
        waited = time.perf_counter() - started
        time.sleep(hold)
    return waited


JOBS: dict[str, Callable[[Setup, int, float], float]] = {
    "floor": floor_job,
    "ray": ray_job,
    "ours": ours_job,
}


def burst(setup: Setup, path: str, threads: int, hold: float) -> dict[str, Any]:
    """One round: every thread asks at once; the makespan, waits and failures."""
    waits: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    go = threading.Event()

    def job(index: int) -> None:
        go.wait()
        try:
            waited = JOBS[path](setup, index, hold)
            with lock:
                waits.append(waited)
        except Exception as exc:  # noqa: BLE001  (a failure is a result here)
            with lock:
                failures.append(f"{type(exc).__name__}: {exc}"[:160])

    workers = [threading.Thread(target=job, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    started = time.perf_counter()
    go.set()
    for worker in workers:
        worker.join(max(0.0, started + JOIN_BOUND_S - time.perf_counter()))
    makespan = time.perf_counter() - started
    stuck = sum(worker.is_alive() for worker in workers)
    failures += [f"still running after {JOIN_BOUND_S:.0f} s"] * stuck
    return {"makespan": makespan, "waits": waits, "failures": failures}


def run(
    setup: Setup, threads: int, hold: float, rounds: int, say: Callable[[str], None]
) -> dict[str, Any]:
    """Every path, ``rounds`` times, in an order rotated each round (one cold round first,
    not counted)."""
    warm_hosts(2)
    results: dict[str, list[dict[str, Any]]] = {p: [] for p in PATHS}
    for number in range(rounds + 1):
        order = PATHS[number % 3 :] + PATHS[: number % 3]
        for path in order:
            settle(setup)
            outcome = burst(setup, path, threads, hold)
            say(
                f"round {number} {path}: {outcome['makespan']:.2f} s, "
                f"{len(outcome['failures'])} failed"
            )
            if number:  # the first round is the cold one
                results[path].append(outcome)
    settle(setup)
    return results


def summary(results: dict[str, Any], threads: int, hold: float, slices: int) -> dict[str, Any]:
    ideal = math.ceil(threads / slices) * hold
    out: dict[str, Any] = {"ideal_makespan_s": ideal}
    floor = statistics.median(r["makespan"] for r in results["floor"])
    for path, rounds in results.items():
        makespans = [r["makespan"] for r in rounds]
        waits = [w for r in rounds for w in r["waits"]]
        out[path] = {
            "makespan_median_s": round(statistics.median(makespans), 3),
            "makespan_min_s": round(min(makespans), 3),
            "makespan_max_s": round(max(makespans), 3),
            "x_floor": round(statistics.median(makespans) / floor, 2),
            "wait_median_s": round(statistics.median(waits), 3) if waits else None,
            "wait_max_s": round(max(waits), 3) if waits else None,
            "failures": sum(len(r["failures"]) for r in rounds),
            "first_failure": next((f for r in rounds for f in r["failures"]), None),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=6, help="threads per round (6)")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds (7)")
    parser.add_argument("--hold", type=float, default=0.5, help="seconds each job holds (0.5)")
    parser.add_argument("--slices", type=int, default=4, help="v6e 4x4 slices (4)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    err = Console(stderr=True)
    host = machine()
    with simulated("v6e", "4x4", args.slices, err) as setup:
        results = run(setup, args.threads, args.hold, args.rounds, err.print)
    found = summary(results, args.threads, args.hold, args.slices)
    if args.json:
        print(json.dumps({"machine": host, "args": vars(args), "summary": found}, indent=2))
        return
    table = Table(title=f"{args.threads} threads, {args.slices} slices, hold {args.hold} s")
    for column in (
        "path",
        "makespan med",
        "min",
        "max",
        "x floor",
        "wait med",
        "wait max",
        "failed",
    ):
        table.add_column(column, justify="right")
    for path in PATHS:
        row = found[path]
        table.add_row(
            path,
            *(
                f"{row[k]:.2f}" if row[k] is not None else "-"
                for k in ("makespan_median_s", "makespan_min_s", "makespan_max_s")
            ),
            f"{row['x_floor']:.2f}",
            *(
                f"{row[k]:.2f}" if row[k] is not None else "-"
                for k in ("wait_median_s", "wait_max_s")
            ),
            str(row["failures"]),
        )
    console = Console()
    console.print(table)
    console.print(f"ideal makespan {found['ideal_makespan_s']:.2f} s; machine {host}")
    for path in PATHS:
        if found[path]["first_failure"]:
            console.print(f"{path} first failure: {found[path]['first_failure']}")


if __name__ == "__main__":
    main()
