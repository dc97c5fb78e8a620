"""Recovering from a host whose TPU hangs every process that opens it, with and without
suspect hosts and health checks.

Usage: ``python benchmarks/bench_suspect.py [--rounds 3] [--json]``

One SimulatedCluster of 2 slices of v4 2x2x2 (4 simulated hosts). Host 1 of the first
slice, ``v4-16-a``, has a wedged TPU (:meth:`SimulatedCluster.wedge_tpu`: every process
that opens it hangs, owning it, as with a bad chip). A resilient run opens the TPU on
every host and then steps for 2 s with a heartbeat; a rank that has not beaten 5 s after
the start is stuck (``startup_timeout_s=5``), one silent for 2 s hangs
(``heartbeat_timeout_s=2``), and the run may retry 2 hangs (``max_retries_hang=2``).
Two scenarios, each run both ways, alternating, ``--rounds`` times:

- ``spare``: ``v4-16-b`` is idle too. With the feature, attempt 1's hang marks the host
  suspect and the retry runs on ``v4-16-b``. Without it, the retry is free to land on
  ``v4-16-a`` again (the claim takes the first idle slice).
- ``only``: ``v4-16-b`` is held by someone else, so ``v4-16-a`` is the only slice to be
  had. With the feature, the retry is given the suspect slice only as a last resort (its
  reservation timeout is 31 s, so at once), checks it first, and gives up when the check
  fails twice; without it, every retry hangs until the budget runs out.

"Without" is tpuslice with the feature turned off: suspect records last 1 ms (so nothing
is avoided) and no health check. Reported: seconds from the call to its result or its
error, how it ended, and the slices its attempts ran on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import ray
from ray.util.placement_group import placement_group, remove_placement_group

import tpuslice
from tpuslice._host import suspects
from tpuslice._tpu.labels import SLICE_NAME_LABEL
from tpuslice.testing import SimulatedCluster

V4 = {"topology": "2x2x2", "accelerator_version": "v4"}
WEDGED = ("v4-16-a", 1)
STEP_S = 2.0


@ray.remote
def train() -> str:
    """Open the TPU (libtpu's start, without JAX's import), then step for 2 s with a
    heartbeat."""
    from tpuslice.testing.libtpu import open_tpu

    open_tpu()
    deadline = time.monotonic() + STEP_S
    while time.monotonic() < deadline:
        tpuslice.heartbeat()
        time.sleep(0.05)
    return tpuslice.current_host().slice_name


@dataclass
class Sample:
    scenario: str
    feature: bool
    seconds: float
    ended: str
    slices: list[str] = field(default_factory=list)


@contextlib.contextmanager
def held(slice_name: str) -> Iterator[None]:
    """Someone else holds every host of the slice."""
    pg = placement_group(
        [{"TPU": 4}] * 2, bundle_label_selector=[{SLICE_NAME_LABEL: slice_name}] * 2
    )
    ray.get(pg.ready(), timeout=60)
    try:
        yield
    finally:
        remove_placement_group(pg)


def one_run(sim: SimulatedCluster, scenario: str, feature: bool) -> Sample:
    suspects.clear_all()
    suspects.set_cooldown(600.0 if feature else 0.001)
    sim.wedge_tpu(*WEDGED)
    events: list[tpuslice.AttemptEvent] = []
    started = time.monotonic()
    context = held("v4-16-b") if scenario == "only" else contextlib.nullcontext()
    try:
        with context:
            try:
                tpuslice.run_resilient(
                    train,
                    **V4,
                    head_reservation_timeout_s=31,
                    heartbeat_timeout_s=2.0,
                    startup_timeout_s=5.0,
                    max_retries_hang=2,
                    backoff_s=(0.1, 0.2),
                    health_check=feature,
                    on_event=events.append,
                )
                ended = "succeeded"
            except tpuslice.RetriesExhaustedError as exc:
                ended = type(exc).__name__
    finally:
        sim.repair_host(*WEDGED)
    seconds = time.monotonic() - started
    slices = [",".join(e.slice_names) for e in events if e.kind == "started"]
    wait_idle()
    return Sample(scenario, feature, seconds, ended, slices)


def wait_idle(timeout: float = 60.0) -> None:
    """Until both slices are free again (the hung processes killed and handed back)."""
    suspects.clear_all()
    deadline = time.monotonic() + timeout
    while tpuslice.get_num_ready_tpu_slices("2x2x2", "v4") < 2:
        if time.monotonic() > deadline:
            raise TimeoutError("the slices did not come back")
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    samples: list[Sample] = []
    with SimulatedCluster(["v4:2x2x2:2"], connect=True) as sim:
        for round_ in range(args.rounds):
            for scenario in ("spare", "only"):
                order = (True, False) if round_ % 2 == 0 else (False, True)
                for feature in order:
                    sample = one_run(sim, scenario, feature)
                    samples.append(sample)
                    print(
                        f"{scenario:5} {'with' if feature else 'without':7} "
                        f"{sample.seconds:6.1f} s  {sample.ended:22} {' '.join(sample.slices)}",
                        flush=True,
                    )
    if args.json:
        print(json.dumps([asdict(s) for s in samples], indent=2))
        return
    print("\nmedians:")
    for scenario in ("spare", "only"):
        for feature in (True, False):
            mine = [s for s in samples if s.scenario == scenario and s.feature == feature]
            ends = sorted({s.ended for s in mine})
            print(
                f"  {scenario:5} {'with' if feature else 'without':7} "
                f"{statistics.median(s.seconds for s in mine):6.1f} s  ended: {', '.join(ends)}"
            )


if __name__ == "__main__":
    main()
