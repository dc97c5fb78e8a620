"""Whole-slice reservations and runs next to raw Ray and Ray 2.60's ``ray.util.tpu``.
Run by hand (not a test; it starts a simulated cluster, so only one at a time):

    python benchmarks/bench_slices.py [--generation v6e] [--topology 4x4]
        [--slices 4] [--host-cpus 8] [--hog] [--rounds 7] [--json]
        [--only reserve-1-run,fresh-reserve-run,fresh-reserve-N-run]

One SimulatedCluster (default 4 slices of v6e 4x4, 16 simulated TPU VMs, ``--host-cpus``
logical CPUs each, 8 by default). With ``--hog`` a process spinning a busy loop takes one
core (``cpu_hog`` of ``bench_contention.py``, imported from this folder) from just after
the cluster is up until the last round ends, as another user's work on the machine would.
The report's header states the CPUs per host, whether the hog ran and the machine's load
average at the start (taken before the cluster starts). Three paths per operation, ratios
to the first:

- ``floor``: raw Ray. One placement group, one ``{"CPU": 1, "TPU": chips}`` bundle per host
  pinned by ``bundle_label_selector`` to the slice name and worker id, ``pg.ready()``, one
  trivial task per host in its bundle, results, removal.
- ``ray``: Ray 2.60's ``ray.util.tpu`` (``SlicePlacementGroup`` + ready, ``run_on_slice``).
- ``ours``: ``tpuslice.SlicePlacementGroup`` and ``tpuslice.run_on_slice``. Ours runs
  every call as Ray 2.60 does: one Ray task per host in its bundle, holding the bundle's
  TPU, in the job's worker processes (it starts no process of its own: no per-host owner
  processes, no spares).

Operations (keys for ``--only``; N is 4 slices, or all there are if fewer; ``--only``
takes N literally too, e.g. ``reserve-N-run``):

- ``reserve-1``, ``-2``, ``-4``: reserve that many slices, timed until every bundle is
  placed; the release is not timed.
- ``reserve-1-run``, ``reserve-N-run``: a held reservation's first use. Timed from before
  the reservation to the results of the first call on it: floor = raw group + ready + one
  raw task per host; Ray = ``SlicePlacementGroup`` + ready + ``run_on_slice(tpu_slice=)``;
  ours = ``SlicePlacementGroup`` + ``run_on_slice(tpu_slice=)`` (a task per host in its
  bundle, as Ray's). Release not timed.
- ``reserve-N-after-shutdown``: each path reserves N slices, calls once and shuts them
  down (untimed; how long that shutdown took is kept and reported as its hand-back), then
  at once, with no settling between, reserves N slices again, timed until placed.
- ``fresh-reserve-run``, ``fresh-reserve-N-run``: a new driver process per call, which
  loads every path's modules first, then times ``ray.init`` (every path alike) + reserve 1
  slice (N slices) + the first call + results, as ``reserve-1-run`` (``reserve-N-run``)
  does in this driver. It starts no worker process beforehand: a new driver has none.
  ``fresh-reserve-N-run`` runs only where N > 1.
- ``hand-over``: another driver (a new process) holds one slice through the same path and
  has called on it once, every other slice is held by a raw group, and this driver asks
  for one slice and waits; the other driver then shuts its reservation down. Timed from
  the start of that shutdown to the results of this driver's first call on the slice
  (wall clock, across the two processes): a slice changing hands between drivers.
- ``one-shot``: reserve, a task per host, results, release, in this driver;
  ``one-shot-fresh``: the same in a fresh driver process per call.
- ``held``: a call on a slice reserved beforehand and called once, untimed (each path on
  a slice of its own; floor: raw tasks on a raw group).
- ``hand-back``: hand a held slice back after one call (only the release is timed: ours
  has each host's agent confirm the TPU free, stopping any process of the work that still
  holds it, then removes the groups; the floor removes its group).
- ``subslice``, ``subslice-learn``: where the slices can be cut (v6e 4x4: 2x4 halves),
  reserve a sub-slice (until its bundles are placed): with the layout already recorded,
  and with every record of it dropped first (the floor then reserves the slice whole, runs
  one chip-coordinates task per host, removes the group and reserves the sub-slice's
  hosts; Ray and ours discover the layout their own way).

Method: worker processes are first started by a plain task on every host; then one cold
round (the first call of each path in this driver, fresh drivers excepted); then a few
calls through each path on every host of one reservation; then ``--rounds`` rounds,
interleaved: in round r each operation runs floor, ray, ours in an order rotated by r
(twice per round; five times for the cheap held-slice call, once for fresh drivers). After
each call everything is released and the benchmark polls ``tpuslice.read_snapshot()``
(bounded) until every slice is idle and no placement group is left. Ray's config is
untouched: its ~100 ms resource-report period is in the numbers (the first tasks into a
fresh placement group wait for it).

Ray's one-shot ``run_on_slice`` keeps its slice until the driver exits, so in this driver
the benchmark removes the leaked group after each call (not timed), and ``one-shot-fresh``
runs each call in a new process (which first runs a plain task on every host so its
worker processes exist; only the call is timed). Every path gets the same treatment.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import itertools
import json
import logging
import math
import os
import platform
import select
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import ray
import ray.util.tpu as ray_tpu
from bench_contention import compile_tpuslice, cpu_hog
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)
from rich.console import Console
from rich.table import Table

import tpuslice
from tpuslice._run import layout_records
from tpuslice._tpu import _ray, keys, subslice
from tpuslice._tpu.labels import SLICE_NAME_LABEL, WORKER_ID_LABEL
from tpuslice._tpu.topology import SliceShape, slice_shape
from tpuslice._view import layouts
from tpuslice._view.cluster import SliceState, read_snapshot
from tpuslice.testing import SimulatedCluster, live_placement_groups, remove_placement_groups

PATHS = ("floor", "ray", "ours")
RESERVE_SIZES = (1, 2, 4)
IDLE_BOUND_S = 30.0
CHILD_TIMEOUT_S = 120.0
WARM_CALLS = 3
MANY_SLICES = 4
"""N of the reserve-N + run operations: this many slices, or all there are if fewer."""
HOST_CPUS = 8
"""Logical CPUs of each simulated host, unless ``--host-cpus`` says otherwise (the
SimulatedCluster default, which this benchmark always used)."""
GOALS: list[tuple[str, str, float, str]] = [
    ("reserve-1-run", "floor", 1.1, "reserve 1 slice + first run"),
    ("reserve-{n}-run", "floor", 1.1, "reserve {slices} + first run"),
    ("fresh-reserve-run", "floor", 1.2, "connect + reserve 1 slice + first run"),
    ("fresh-reserve-run", "ray", 1.0, "connect + reserve 1 slice + first run"),
    ("fresh-reserve-{n}-run", "floor", 1.2, "connect + reserve {slices} + first run"),
    ("fresh-reserve-{n}-run", "ray", 1.0, "connect + reserve {slices} + first run"),
    ("one-shot", "floor", 1.1, "one-shot run on one slice (this driver)"),
    ("one-shot-fresh", "floor", 1.1, "one-shot run on one slice (fresh driver)"),
    ("reserve-{n}-after-shutdown", "floor", 2.0, "reserve {slices} right after a shutdown"),
    ("held", "floor", 1.0, "call on a held slice"),
]
"""Each goal: the operation ({n} is the N of reserve-N), the path its ratio divides by,
the most ours' median may be as a multiple of that path's median, and what it is."""

HostResult = tuple[str, int, int]
"""What the trivial task returns: slice name, TPU worker id (the host's env), worker pid."""


@ray.remote
def whoami() -> HostResult:
    """The trivial task: where it ran and in which worker process."""
    return os.environ.get("TPU_NAME", ""), int(os.environ.get("TPU_WORKER_ID", "-1")), os.getpid()


@ray.remote
def ping() -> int:
    """Starts a worker process on a host; a different function from the timed one, so
    every path's timed call ships and loads its function the same way."""
    return os.getpid()


class BenchError(RuntimeError):
    """The benchmark could not run as designed."""


@dataclass(frozen=True)
class Setup:
    generation: str
    topology: str
    shape: SliceShape
    names: tuple[str, ...]
    """Slice names in name order (ours picks the first idle ones; the floor uses them)."""
    address: str


@dataclass
class Sample:
    seconds: float
    results: list[HostResult] | None = None
    fresh_pids: bool = False
    """Results from a fresh driver: their worker pids say nothing about reuse here."""
    handback_s: float | None = None
    """The untimed shutdown of the path's previous reservation just before the timing."""


def now() -> float:
    return time.perf_counter()


# --- floor: raw placement groups and tasks -------------------------------------------------


def raw_group(setup: Setup, num_slices: int) -> PlacementGroup:
    """One bundle per host of the first ``num_slices`` slices, pinned by label."""
    selectors = [
        {SLICE_NAME_LABEL: name, WORKER_ID_LABEL: str(worker)}
        for name in setup.names[:num_slices]
        for worker in range(setup.shape.num_hosts)
    ]
    bundles = [{"CPU": 1.0, "TPU": float(setup.shape.chips_per_host)} for _ in selectors]
    return placement_group(bundles, strategy="SPREAD", bundle_label_selector=selectors)


def raw_group_on(setup: Setup, name: str, *, head: bool = False) -> PlacementGroup:
    """One bundle per host of slice ``name``, pinned by label; ``head``: bundle 0 also
    takes the slice's head resource, so no other reservation picks the slice."""
    selectors = [
        {SLICE_NAME_LABEL: name, WORKER_ID_LABEL: str(w)} for w in range(setup.shape.num_hosts)
    ]
    bundles = [{"CPU": 1.0, "TPU": float(setup.shape.chips_per_host)} for _ in selectors]
    if head:
        bundles[0][setup.shape.head_resource] = 1.0
    return placement_group(bundles, strategy="SPREAD", bundle_label_selector=selectors)


def raw_tasks(pg: PlacementGroup, count: int, tpu: float) -> list[ray.ObjectRef]:
    """One trivial task per bundle, as Ray's ``run_on_slice`` would start them."""
    return [
        whoami.options(
            num_cpus=0,
            resources={"TPU": tpu},
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=i
            ),
        ).remote()
        for i in range(count)
    ]


def floor_hold(setup: Setup, num_slices: int) -> PlacementGroup:
    pg = raw_group(setup, num_slices)
    return placed(pg, pg, remove_placement_group)


def floor_call(pg: PlacementGroup) -> list[HostResult]:
    results: list[HostResult] = ray.get(raw_tasks(pg, pg.bundle_count, pg.bundle_specs[0]["TPU"]))
    return results


def floor_one_shot(setup: Setup) -> Sample:
    started = now()
    pg = raw_group(setup, 1)
    try:
        ray.get(pg.ready())
        results = ray.get(raw_tasks(pg, setup.shape.num_hosts, setup.shape.chips_per_host))
    finally:
        remove_placement_group(pg)
    return Sample(now() - started, results)


# --- ray: Ray 2.60's ray.util.tpu ------------------------------------------------------------


def ray_hold(setup: Setup, num_slices: int) -> ray_tpu.SlicePlacementGroup:
    spg = ray_tpu.SlicePlacementGroup(setup.topology, setup.generation, num_slices=num_slices)
    return placed(spg, spg.slice_placement_group, ray_tpu.SlicePlacementGroup.shutdown)


def ray_call(spg: ray_tpu.SlicePlacementGroup) -> list[HostResult]:
    results: list[HostResult] = ray.get(ray_tpu.run_on_slice(whoami, tpu_slice=spg))
    return results


def ray_one_shot(setup: Setup, remove_leak: bool = True) -> Sample:
    """Ray's one-shot call. It leaks its worker group until the driver exits, so in a
    long-lived driver the group is removed after the timing; a fresh driver exits."""
    started = now()
    try:
        refs = ray_tpu.run_on_slice(
            whoami, topology=setup.topology, accelerator_version=setup.generation
        )
        results = ray.get(refs)
        return Sample(now() - started, results)
    finally:
        if remove_leak:
            remove_placement_groups()


# --- ours: tpuslice --------------------------------------------------------------------------


def ours_hold(setup: Setup, num_slices: int) -> tpuslice.SlicePlacementGroup:
    """Returns once every slice is claimed and placed."""
    return tpuslice.SlicePlacementGroup(setup.topology, setup.generation, num_slices=num_slices)


def ours_call(spg: tpuslice.SlicePlacementGroup) -> list[HostResult]:
    """One task per host in its bundle, holding the bundle's TPU, as Ray's call does."""
    results: list[HostResult] = ray.get(tpuslice.run_on_slice(whoami, tpu_slice=spg))
    return results


def ours_one_shot(setup: Setup) -> Sample:
    started = now()
    refs = tpuslice.run_on_slice(
        whoami, topology=setup.topology, accelerator_version=setup.generation
    )
    results = ray.get(refs)
    return Sample(now() - started, results)


ONE_SHOT: dict[str, Callable[[Setup], Sample]] = {
    "floor": floor_one_shot,
    "ray": lambda setup: ray_one_shot(setup, remove_leak=False),
    "ours": ours_one_shot,
}
"""One-shot calls as a fresh driver makes them (Ray's leak ends when that driver exits)."""


# --- held reservations: reserve, call, release ------------------------------------------------


def placed(handle: Any, group: PlacementGroup, release: Callable[[Any], None]) -> Any:
    """``handle`` once ``group`` is placed; released if the wait fails."""
    try:
        ray.get(group.ready())
    except BaseException:
        release(handle)
        raise
    return handle


@dataclass(frozen=True)
class Hold:
    """One path's held reservation in three steps. Every held-slice operation is built
    from them, so each path is timed the same way."""

    reserve: Callable[[Setup, int], Any]
    """Reserves that many slices; returns once every bundle is placed."""
    call: Callable[[Any], list[HostResult]]
    """``whoami`` once on every host of the reservation; the results."""
    release: Callable[[Any], None]


HOLDS = {
    "floor": Hold(floor_hold, floor_call, remove_placement_group),
    "ray": Hold(ray_hold, ray_call, ray_tpu.SlicePlacementGroup.shutdown),
    "ours": Hold(ours_hold, ours_call, tpuslice.SlicePlacementGroup.shutdown),
}


def reserve_only(hold: Hold, setup: Setup, num_slices: int) -> Sample:
    """Timed until every bundle is placed; the release is not."""
    started = now()
    handle = hold.reserve(setup, num_slices)
    seconds = now() - started
    hold.release(handle)
    return Sample(seconds)


def reserve_and_run(hold: Hold, setup: Setup, num_slices: int) -> Sample:
    """Timed from before the reservation to the results of its first call; the release
    is not."""
    started = now()
    handle = hold.reserve(setup, num_slices)
    try:
        results = hold.call(handle)
        return Sample(now() - started, results)
    finally:
        hold.release(handle)


def used_then_released(hold: Hold, setup: Setup, num_slices: int) -> float:
    """Reserve, one call, release: the seconds the release took."""
    handle = hold.reserve(setup, num_slices)
    try:
        hold.call(handle)
    finally:
        started = now()
        hold.release(handle)
    return now() - started


def hand_back(hold: Hold, setup: Setup, num_slices: int) -> Sample:
    """Only the release of a reservation used once is timed. Ours has each host's agent
    confirm that no process of the work still owns the TPU (stopping any that does), then
    removes the groups; the floor removes its group."""
    return Sample(used_then_released(hold, setup, num_slices))


def reserve_after_shutdown(hold: Hold, setup: Setup, num_slices: int) -> Sample:
    """A reservation used once and shut down (untimed, its duration kept), then at once
    the same path's new reservation of as many slices, timed until placed."""
    handback = used_then_released(hold, setup, num_slices)
    sample = reserve_only(hold, setup, num_slices)
    sample.handback_s = handback
    return sample


# --- a call on a slice reserved beforehand ----------------------------------------------------


class HeldSlices:
    """One slice reserved by each path for a round (ours, Ray's, and a raw group for the
    floor, each on a slice of its own), each called once untimed: the first tasks into a
    fresh group wait on Ray's resource report. The paths reserve in an order rotated each
    round, so no path always picks its slice first."""

    def __init__(self, setup: Setup) -> None:
        self.setup = setup
        self._stack = ExitStack()
        self.handles: dict[str, Any] = {}
        self._rounds = 0

    def __enter__(self) -> HeldSlices:
        turn = self._rounds % len(PATHS)
        self._rounds += 1
        with ExitStack() as stack:
            for path in [*PATHS[turn:], *PATHS[:turn]]:
                self.handles[path] = self._reserve(path, stack)
            for path in PATHS:
                self.call(path)
            self._stack = stack.pop_all()
        return self

    def _reserve(self, path: str, stack: ExitStack) -> Any:
        if path != "floor":
            handle = HOLDS[path].reserve(self.setup, 1)
            stack.callback(HOLDS[path].release, handle)
            return handle
        free = [s.name for s in read_snapshot().ready(self.setup.shape)]
        if not free:
            raise BenchError("the held-slice operation needs three idle slices")
        raw = raw_group_on(self.setup, free[0], head=True)
        stack.callback(remove_placement_group, raw)
        if not ray.wait([raw.ready()], timeout=IDLE_BOUND_S)[0]:
            raise BenchError(f"the floor's group on {free[0]} did not place")
        return raw

    def __exit__(self, *exc: object) -> None:
        self.handles = {}
        self._stack.close()

    def calls(self) -> dict[str, Callable[[], Sample]]:
        return {path: functools.partial(self.call, path) for path in PATHS}

    def call(self, path: str) -> Sample:
        handle = self.handles[path]
        started = now()
        results = HOLDS[path].call(handle)
        return Sample(now() - started, results)


# --- a slice changing hands between drivers ---------------------------------------------------

WAITING_S = 1.0
"""How long this driver's reservation waits before the other driver hands its slice back:
long enough to be waiting (in the queue, or in Ray's scheduler), on every path."""


def hand_over(hold: Hold, path: str, setup: Setup) -> Sample:
    """Another driver holds ``setup.names[0]`` (the other slices are held by raw groups);
    this driver asks for one slice, and the other hands its slice back. Timed from the
    start of that hand-back to the results of this driver's first call on the slice."""
    if len(setup.names) < 2:
        raise BenchError("hand-over needs at least two slices")
    others = [whole_slice_group(setup, name) for name in setup.names[1:]]
    try:
        ray.get([pg.ready() for pg in others])
        with tempfile.TemporaryFile("w+") as errors:
            try:
                return hand_over_from_child(hold, path, setup, errors)
            except BenchError as exc:
                errors.seek(0)
                raise BenchError(f"{exc}; it said:\n{errors.read()[-2000:]}") from exc
    finally:
        for pg in others:
            remove_placement_group(pg)


def whole_slice_group(setup: Setup, name: str) -> PlacementGroup:
    """Every host's TPU of slice ``name`` and its head resource (which Ray's reservation
    looks for first), pinned by label."""
    selectors = [
        {SLICE_NAME_LABEL: name, WORKER_ID_LABEL: str(w)} for w in range(setup.shape.num_hosts)
    ]
    bundles = [{"TPU": float(setup.shape.chips_per_host)} for _ in selectors]
    bundles[0][setup.shape.head_resource] = 1.0
    return placement_group(bundles, strategy="SPREAD", bundle_label_selector=selectors)


def hand_over_from_child(hold: Hold, path: str, setup: Setup, errors: Any) -> Sample:
    """:func:`hand_over` once the other slices are held; the child's stderr to ``errors``."""
    child = subprocess.Popen(
        child_command(setup, path, "hand-over"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=errors,
        text=True,
    )
    try:
        assert child.stdin is not None and child.stdout is not None
        if line_within(child.stdout, CHILD_TIMEOUT_S).strip() != "held":
            raise BenchError(f"hand-over: the other driver for {path} did not hold its slice")
        got: dict[str, Any] = {}

        def reserve_and_call() -> None:
            handle = hold.reserve(setup, 1)
            try:
                got["results"] = hold.call(handle)
                got["done"] = time.time()
            finally:
                hold.release(handle)

        waiter = threading.Thread(target=reserve_and_call, daemon=True)
        waiter.start()
        time.sleep(WAITING_S)
        child.stdin.write("go\n")
        child.stdin.flush()
        began = json.loads(line_within(child.stdout, CHILD_TIMEOUT_S) or "{}").get("began")
        if began is None:
            raise BenchError(f"hand-over: the other driver for {path} did not hand back")
        waiter.join(CHILD_TIMEOUT_S)
        if "done" not in got:
            raise BenchError(f"hand-over: {path} got no slice within {CHILD_TIMEOUT_S:.0f} s")
        return Sample(got["done"] - began, got["results"])
    finally:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.communicate(timeout=CHILD_TIMEOUT_S)
        child.kill()


def line_within(stream: Any, seconds: float) -> str:
    """The next line of a child's output, or ``""`` if none comes within ``seconds``."""
    ready, _, _ = select.select([stream], [], [], seconds)
    return str(stream.readline()) if ready else ""


def child_hand_over(setup: Setup, path: str) -> None:
    """The other driver of :func:`hand_over`: hold one slice and call on it once, say
    ``held``, and on the next line of stdin hand the slice back, saying when it began."""
    connect(setup.address)
    hold = HOLDS[path]
    handle = hold.reserve(setup, 1)
    hold.call(handle)
    print("held", flush=True)
    sys.stdin.readline()
    began = time.time()
    hold.release(handle)
    print(json.dumps({"began": began}), flush=True)


# --- fresh driver processes -------------------------------------------------------------------


def child_command(setup: Setup, path: str, child_op: str, num_slices: int = 1) -> list[str]:
    """The command line of a new driver process running ``child_op`` through ``path``; it
    is given the names of the first ``num_slices`` slices, and reserves that many."""
    return [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        path,
        "--child-op",
        child_op,
        "--address",
        setup.address,
        "--generation",
        setup.generation,
        "--topology",
        setup.topology,
        "--slice-names",
        ",".join(setup.names[:num_slices]),
    ]


def fresh_driver(setup: Setup, path: str, child_op: str, num_slices: int = 1) -> Sample:
    """Run one ``child_op`` call of ``path`` (on ``num_slices`` slices, where it reserves)
    in a new driver process; its report is JSON."""
    command = child_command(setup, path, child_op, num_slices)
    started = now()
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, check=False
    )
    SETTLING.child_walls.append(now() - started)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = "\n".join(done.stderr.splitlines()[-15:])
        raise BenchError(f"fresh driver for {path} failed (exit {done.returncode}):\n{tail}")
    report = json.loads(lines[-1])
    results = [(str(n), int(w), int(p)) for n, w, p in report["results"]]
    return Sample(report["seconds"], results, fresh_pids=True)


def connect(address: str) -> None:
    ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)


def child_one_shot(setup: Setup, path: str) -> Sample:
    """Connect and start this driver's worker processes, untimed; time one one-shot."""
    connect(setup.address)
    warm_hosts(times=1)
    return ONE_SHOT[path](setup)


def child_reserve_run(setup: Setup, path: str) -> Sample:
    """A new user's first steps, all timed: connect, reserve as many slices as the driver
    was given names of (the floor reserves those), the first call, its results (the
    release is not). No worker process is started first: a new driver has none, so its
    first tasks start them."""
    started = now()
    connect(setup.address)
    connected = now() - started
    sample = reserve_and_run(HOLDS[path], setup, len(setup.names))
    return Sample(connected + sample.seconds, sample.results)


CHILD_OPS: dict[str, Callable[[Setup, str], Sample]] = {
    "one-shot": child_one_shot,
    "reserve-run": child_reserve_run,
}
"""What a fresh driver times, by the ``--child-op`` it is given."""


def child_main(args: argparse.Namespace) -> None:
    """The fresh driver: load every path's modules, then run and time one call."""
    # Load every path's modules before any timing, as Ray's and the floor's already are:
    # tpuslice loads its modules on first use, and with PYTHONDONTWRITEBYTECODE=1 (set on
    # this machine) each new process also compiles them (~100-170 ms measured).
    import tpuslice._reserve.queue.agents
    import tpuslice._reserve.reserve
    import tpuslice._run.run

    _ = (tpuslice.run_on_slice, ray_tpu.run_on_slice)
    shape = slice_shape(args.topology, args.generation)
    names = tuple(args.slice_names.split(","))
    setup = Setup(args.generation, args.topology, shape, names, args.address)
    if args.child_op == "hand-over":
        child_hand_over(setup, args.child)
        return
    sample = CHILD_OPS[args.child_op](setup, args.child)
    print(json.dumps({"seconds": sample.seconds, "results": sample.results}), flush=True)
    # No ray.shutdown() here: at exit, tpuslice's hooks (registered after ray.init's) run
    # before Ray's own and end a one-shot's background hand-back first; an explicit
    # shutdown races that thread, and a thread that calls Ray after it ends the process.


# --- warming and settling -----------------------------------------------------------------------


def warm_hosts(times: int) -> None:
    """A plain task (no placement group) on every TPU host, so this driver's worker
    processes exist before anything is timed."""
    nodes = [
        node["NodeID"]
        for node in ray.nodes()
        if node["Alive"] and (node.get("Labels") or {}).get(SLICE_NAME_LABEL)
    ]
    for _ in range(times):
        affinity = [NodeAffinitySchedulingStrategy(node, soft=False) for node in nodes]
        ray.get([ping.options(num_cpus=0, scheduling_strategy=s).remote() for s in affinity])


def warm_paths(setup: Setup) -> None:
    """A few calls through each path on every host of every slice."""
    for hold in HOLDS.values():
        handle = hold.reserve(setup, len(setup.names))
        try:
            for _ in range(WARM_CALLS):
                hold.call(handle)
        finally:
            hold.release(handle)
        settle(setup)


@dataclass
class Settling:
    """What it took to get back to an idle cluster after the calls."""

    waits: list[float] = field(default_factory=list)
    cleanups: list[str] = field(default_factory=list)
    child_walls: list[float] = field(default_factory=list)
    """Whole life of each fresh driver process (start, connect, warm, call, exit)."""


SETTLING = Settling()


def settle(setup: Setup, bound: float = IDLE_BOUND_S) -> None:
    """Wait until the cluster view shows every slice idle and no placement group is left.
    Past the bound, remove what is left (and record it) rather than let it skew the rest."""
    started = now()
    while not _idle(setup):
        if now() - started > bound:
            removed = remove_placement_groups()
            SETTLING.cleanups.append(f"not idle after {bound:.0f} s; removed {removed} group(s)")
            started = now()
            bound = IDLE_BOUND_S
            if not removed:
                raise BenchError(f"slices still busy {bound:.0f} s after removing every group")
        time.sleep(0.02)
    SETTLING.waits.append(now() - started)


def _idle(setup: Setup) -> bool:
    slices = read_snapshot().slices
    ready = all(name in slices and slices[name].state is SliceState.READY for name in setup.names)
    return ready and not live_placement_groups()


# --- sub-slices ----------------------------------------------------------------------------


@ray.remote(num_cpus=0)
def chip_coordinates() -> list[list[int]]:
    """What Ray's and our discovery ask each host: its chips' physical coordinates."""
    from libtpu.sdk import slice as tpu_slice

    return [chip.coordinates() for chip in tpu_slice.get_chip_coordinates()]


def sub_topology(setup: Setup) -> str | None:
    """The biggest sub-slice of more than one host the slices can be cut into, if any."""
    if setup.shape.num_hosts < 4:
        return None
    subs = [
        t
        for t in subslice.subslice_topologies(setup.topology)
        if 1 < math.prod(subslice.worker_dims(t)) < setup.shape.num_hosts
    ]
    valid = [t for t in subs if t in setup.shape.generation.topologies]
    return valid[-1] if valid else None


def forget_layouts(setup: Setup) -> None:
    """Drop every record of the slices' layouts: both KV records, both in-process copies."""
    for name in setup.names:
        layouts.forget(name)
        _ray.kv_delete(keys.LAYOUT_KEY_PREFIX + name, keys.NAMESPACE)
        _ray.kv_delete(subslice.kv_key(name).decode(), keys.RAY_SUBSLICE_NAMESPACE)
        with ray_tpu._tpu_subslice_cache_lock:
            ray_tpu._tpu_subslice_cache.pop(name, None)


def floor_subslice_group(setup: Setup, sub: str, physical: dict[int, int]) -> PlacementGroup:
    """Bundles pinned to the hosts of sub-slice 0 of the first slice, lowest worker first."""
    workers = subslice.members(physical, setup.topology, sub)[0]
    selectors = [{SLICE_NAME_LABEL: setup.names[0], WORKER_ID_LABEL: str(w)} for w in workers]
    bundles = [{"CPU": 1.0, "TPU": float(setup.shape.chips_per_host)} for _ in selectors]
    return placement_group(bundles, strategy="STRICT_SPREAD", bundle_label_selector=selectors)


def floor_learn(setup: Setup) -> dict[int, int]:
    """The raw minimum of learning a layout: the whole first slice reserved, one
    coordinates task per host, the group removed."""
    pg = raw_group_on(setup, setup.names[0])
    try:
        ray.get(pg.ready())
        refs = [
            chip_coordinates.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, i)
            ).remote()
            for i in range(setup.shape.num_hosts)
        ]
        answers = ray.get(refs)
    finally:
        remove_placement_group(pg)
    # As Ray's and ours do: wait until the hosts show free before asking for some of them
    # (a group asked for earlier waits for Ray's retry of pending groups instead).
    deadline = now() + IDLE_BOUND_S
    while read_snapshot().slices[setup.names[0]].state is not SliceState.READY:
        if now() > deadline:
            raise BenchError(f"{setup.names[0]} not idle {IDLE_BOUND_S:.0f} s after discovery")
        time.sleep(0.005)
    return {w: subslice.physical_position(c, setup.topology) for w, c in enumerate(answers)}


def prepare_subslice(setup: Setup, sub: str, learn: bool) -> None:
    """Untimed: drop every record (``learn``), or make sure the layout is recorded."""
    if learn:
        forget_layouts(setup)
    elif layout_records.load(read_snapshot().slices[setup.names[0]]) is None:
        with tpuslice.subslice_placement_group(sub, setup.generation):
            pass
        settle(setup)


def floor_subslice(setup: Setup, sub: str, learn: bool) -> Sample:
    prepare_subslice(setup, sub, learn)
    known = None if learn else layout_records.load(read_snapshot().slices[setup.names[0]])
    started = now()
    physical = floor_learn(setup) if known is None else known.physical
    pg = floor_subslice_group(setup, sub, physical)
    try:
        ray.get(pg.ready())
        return Sample(now() - started)
    finally:
        remove_placement_group(pg)


def ray_subslice(setup: Setup, sub: str, learn: bool) -> Sample:
    prepare_subslice(setup, sub, learn)
    started = now()
    sg = ray_tpu.subslice_placement_group(sub, setup.generation)
    try:
        ray.get(sg.placement_group.ready())
        return Sample(now() - started)
    finally:
        sg.shutdown()


def ours_subslice(setup: Setup, sub: str, learn: bool) -> Sample:
    prepare_subslice(setup, sub, learn)
    started = now()
    with tpuslice.subslice_placement_group(sub, setup.generation):
        return Sample(now() - started)


# --- operations and rounds ----------------------------------------------------------------------


@dataclass
class Operation:
    key: str
    title: str
    calls: dict[str, Callable[[], Sample]]
    hold: AbstractContextManager[Any] | None = None
    """Entered around a round's calls (the held slices); else each call settles alone."""
    cold: bool = True
    """Whether the cold round runs it (a fresh driver's every call is its first)."""
    passes: int = 2
    """Samples per path per round (all paths, interleaved); more where a call is cheap."""


def many_slices(count: int) -> int:
    """N of the reserve-N + run operations in a cluster of ``count`` slices."""
    return min(MANY_SLICES, count)


def slices(count: int) -> str:
    return f"{count} slice{'s' if count > 1 else ''}"


def through_holds(
    key: str,
    title: str,
    timed: Callable[[Hold, Setup, int], Sample],
    setup: Setup,
    num_slices: int,
    **options: Any,
) -> Operation:
    """An operation timed the same way through each path's held reservations."""
    calls: dict[str, Callable[[], Sample]] = {
        path: functools.partial(timed, HOLDS[path], setup, num_slices) for path in PATHS
    }
    return Operation(key, title, calls, **options)


def in_fresh_drivers(
    key: str, title: str, child_op: str, setup: Setup, num_slices: int = 1
) -> Operation:
    """Every call of every path in a new driver process (each is that driver's first),
    on ``num_slices`` slices where the call reserves."""
    calls: dict[str, Callable[[], Sample]] = {
        path: functools.partial(fresh_driver, setup, path, child_op, num_slices) for path in PATHS
    }
    return Operation(key, title, calls, cold=False, passes=1)


def reservation_ops(setup: Setup) -> list[Operation]:
    """Reserving: alone, with the first run, right after a shutdown, in a new driver."""
    count, many = len(setup.names), many_slices(len(setup.names))
    ops = [
        through_holds(f"reserve-{n}", f"reserve {slices(n)}", reserve_only, setup, n)
        for n in RESERVE_SIZES
        if n <= count
    ]
    ops += [
        through_holds(
            f"reserve-{n}-run", f"reserve {slices(n)}, first run", reserve_and_run, setup, n
        )
        for n in sorted({1, many})
    ]
    title = f"reserve {slices(many)} right after a shutdown"
    ops.append(
        through_holds(f"reserve-{many}-after-shutdown", title, reserve_after_shutdown, setup, many)
    )
    title = "fresh driver: connect, reserve 1 slice, first run"
    ops.append(in_fresh_drivers("fresh-reserve-run", title, "reserve-run", setup))
    if many > 1:
        title = f"fresh driver: connect, reserve {slices(many)}, first run"
        key = f"fresh-reserve-{many}-run"
        ops.append(in_fresh_drivers(key, title, "reserve-run", setup, many))
    if count >= 2:
        calls: dict[str, Callable[[], Sample]] = {
            path: functools.partial(hand_over, HOLDS[path], path, setup) for path in PATHS
        }
        title = "another driver's slice handed over, first run"
        ops.append(Operation("hand-over", title, calls, cold=False, passes=1))
    return ops


def operations(setup: Setup) -> list[Operation]:
    held = HeldSlices(setup)
    ops = [
        *reservation_ops(setup),
        Operation(
            "one-shot",
            "one-shot, this driver",
            {path: lambda path=path: ONE_SHOT_HERE[path](setup) for path in PATHS},
        ),
        in_fresh_drivers("one-shot-fresh", "one-shot, fresh driver", "one-shot", setup),
        Operation("held", "call on a held slice", held.calls(), hold=held, cold=False, passes=5),
        through_holds("hand-back", "hand a held slice back", hand_back, setup, 1, cold=False),
    ]
    return ops + subslice_ops(setup)


def subslice_ops(setup: Setup) -> list[Operation]:
    """Where the slices can be cut: a sub-slice with its layout recorded, and unknown."""
    sub = sub_topology(setup)
    if sub is None:
        return []
    return [
        Operation(
            key,
            title,
            {
                "floor": lambda learn=learn: floor_subslice(setup, sub, learn),
                "ray": lambda learn=learn: ray_subslice(setup, sub, learn),
                "ours": lambda learn=learn: ours_subslice(setup, sub, learn),
            },
        )
        for learn, key, title in (
            (False, "subslice", f"reserve a {sub} sub-slice"),
            (True, "subslice-learn", f"reserve a {sub} sub-slice, layout unknown"),
        )
    ]


ONE_SHOT_HERE: dict[str, Callable[[Setup], Sample]] = {
    "floor": floor_one_shot,
    "ray": ray_one_shot,
    "ours": ours_one_shot,
}


@dataclass
class Record:
    """Every sample of one operation through one path."""

    title: str
    cold: Sample | None = None
    samples: list[Sample] = field(default_factory=list)


Records = dict[tuple[str, str], Record]


def run_round(
    setup: Setup, op: Operation, order: Sequence[str], keep: Callable[..., None], passes: int
) -> None:
    with op.hold if op.hold is not None else nullcontext():
        for _, path in itertools.product(range(passes), order):
            gc.collect()
            sample = op.calls[path]()
            keep(op.key, path, sample)
            if op.hold is None:
                settle(setup)
    if op.hold is not None:
        settle(setup)


def operation_keys(keys: Sequence[str], many: int) -> list[str]:
    """``--only``'s keys with a literal N read as ``many`` (``reserve-N-run`` is
    ``reserve-4-run`` on 4 slices; ``fresh-reserve-N-run`` on one slice is
    ``fresh-reserve-run``)."""
    found = [key.replace("-N-", f"-{many}-") for key in keys]
    return ["fresh-reserve-run" if key == "fresh-reserve-1-run" else key for key in found]


def run_all(
    setup: Setup, rounds: int, progress: Callable[[str], None], only: Sequence[str] = ()
) -> Records:
    records: Records = {}
    only = operation_keys(only, many_slices(len(setup.names)))
    ops = [op for op in operations(setup) if not only or op.key in only]
    if not ops:
        raise BenchError(f"--only {','.join(only)}: no such operation here")
    for op in ops:
        for path in PATHS:
            records[op.key, path] = Record(op.title)

    def keep_cold(key: str, path: str, sample: Sample) -> None:
        records[key, path].cold = sample

    def keep(key: str, path: str, sample: Sample) -> None:
        records[key, path].samples.append(sample)

    progress("starting worker processes on every host")
    warm_hosts(times=WARM_CALLS)
    settle(setup)
    progress("cold round: the first call of each path in this driver")
    for op in ops:
        if op.cold:
            run_round(setup, op, PATHS, keep_cold, passes=1)
    progress("warming every path on every host")
    warm_paths(setup)
    for r in range(rounds):
        progress(f"round {r + 1}/{rounds}")
        order = PATHS[r % len(PATHS) :] + PATHS[: r % len(PATHS)]
        for op in ops:
            run_round(setup, op, order, keep, op.passes)
    return records


# --- summary ------------------------------------------------------------------------------------


@dataclass
class Row:
    op: str
    title: str
    path: str
    samples: int
    cold_ms: float | None
    min_ms: float
    median_ms: float
    max_ms: float
    x_floor: float
    x_ray: float | None
    pids_per_host: int | None
    """Most distinct worker pids any one host showed over the rounds (1 = always the same
    process); ``None`` for fresh drivers, whose processes are new by design."""
    calls_per_host: int | None
    in_order: str | None
    """Calls whose results came back in TPU worker order, of all calls."""
    handback_ms: float | None = None
    """Median of the untimed shutdown just before each timing (after-shutdown only)."""


def in_worker_order(results: Sequence[HostResult]) -> bool:
    """Slice by slice, each slice's hosts in TPU worker order."""
    names = list(dict.fromkeys(name for name, _, _ in results))
    if not names:
        return False
    hosts = len(results) // len(names)
    expected = [(name, worker) for name in names for worker in range(hosts)]
    return [(name, worker) for name, worker, _ in results] == expected


def pid_counts(samples: Sequence[Sample]) -> tuple[int, int] | None:
    """(most distinct pids on one host, calls per host) over in-driver samples."""
    seen: dict[tuple[str, int], list[int]] = {}
    for sample in samples:
        if sample.results is None or sample.fresh_pids:
            continue
        for name, worker, pid in sample.results:
            seen.setdefault((name, worker), []).append(pid)
    if not seen:
        return None
    return max(len(set(p)) for p in seen.values()), max(len(p) for p in seen.values())


def rows(records: Records) -> list[Row]:
    medians = {key: statistics.median(s.seconds for s in r.samples) for key, r in records.items()}
    return [row(op, path, record, medians) for (op, path), record in records.items()]


def row(op: str, path: str, record: Record, medians: dict[tuple[str, str], float]) -> Row:
    ms = [s.seconds * 1000 for s in record.samples]
    median = medians[op, path]
    with_results = [s.results for s in record.samples if s.results is not None]
    pids = pid_counts(record.samples)
    handbacks = [s.handback_s * 1000 for s in record.samples if s.handback_s is not None]
    return Row(
        op=op,
        title=record.title,
        path=path,
        samples=len(ms),
        cold_ms=record.cold.seconds * 1000 if record.cold else None,
        min_ms=min(ms),
        median_ms=statistics.median(ms),
        max_ms=max(ms),
        x_floor=median / medians[op, "floor"],
        x_ray=median / medians[op, "ray"] if path == "ours" else None,
        pids_per_host=pids[0] if pids else None,
        calls_per_host=pids[1] if pids else None,
        in_order=(
            f"{sum(map(in_worker_order, with_results))}/{len(with_results)}"
            if with_results
            else None
        ),
        handback_ms=statistics.median(handbacks) if handbacks else None,
    )


@dataclass
class Target:
    what: str
    against: str
    """The path the goal's ratio divides by: ``floor`` or ``ray``."""
    goal: float
    value: float
    """Ours' median / that path's median."""
    ours_x_floor: float
    ray_x_floor: float
    met: bool


def targets(table: Sequence[Row], many: int) -> list[Target]:
    """The goals whose operations ran (all of them unless ``--only`` chose some); ``many``
    is the N of the reserve-N operations."""
    by = {(r.op, r.path): r for r in table}
    found = []
    for template, against, goal, what in GOALS:
        if "{n}" in template and many == 1:
            continue
        op = template.format(n=many)
        if (op, "ours") not in by:
            continue
        ours, theirs = by[op, "ours"], by[op, "ray"]
        value = ours.x_floor if against == "floor" else ours.x_ray
        assert value is not None
        described = what.format(slices=slices(many))
        found.append(
            Target(described, against, goal, value, ours.x_floor, theirs.x_floor, value <= goal)
        )
    return found


def machine() -> dict[str, Any]:
    lines = Path("/proc/meminfo").read_text().splitlines()
    meminfo = dict(line.split(":", 1) for line in lines)
    return {
        "nproc": os.cpu_count(),
        "memory_gib": round(int(meminfo["MemTotal"].split()[0]) / 2**20, 1),
        "python": platform.python_version(),
        "ray": ray.__version__,
        "tpuslice": tpuslice.__version__,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


COLUMNS = (
    "operation",
    "path",
    "n",
    "cold",
    "min",
    "median",
    "max",
    "x floor",
    "x Ray",
    "pids/host",
    "in order",
)


def header(info: dict[str, Any]) -> str:
    """The run's conditions: the cluster, the rounds, the CPUs per host, the hog and the
    machine's load average at the start."""
    load = ", ".join(f"{x:.2f}" for x in info["load_average_at_start"])
    return (
        f"{info['slices']} x {info['generation']} {info['topology']} slices "
        f"({info['hosts']} simulated hosts, {info['host_cpus']} CPU"
        f"{'s' if info['host_cpus'] != 1 else ''} each), "
        f"{info['rounds']} interleaved rounds; "
        + ("a one-core CPU hog throughout; " if info["hog"] else "no CPU hog; ")
        + f"load average at start {load} (1, 5, 15 min); n samples per path; ms"
    )


def render(table: Sequence[Row], found: Sequence[Target], info: dict[str, Any]) -> Table:
    out = Table(
        title=header(info),
        title_justify="left",
    )
    for column in COLUMNS:
        out.add_column(column, justify="left" if column in ("operation", "path") else "right")
    previous = ""
    for row in table:
        pids = f"{row.pids_per_host}/{row.calls_per_host}" if row.pids_per_host else "-"
        out.add_row(
            row.title if row.title != previous else "",
            row.path,
            str(row.samples),
            _ms(row.cold_ms),
            _ms(row.min_ms),
            _ms(row.median_ms),
            _ms(row.max_ms),
            f"{row.x_floor:.2f}",
            "-" if row.x_ray is None else f"{row.x_ray:.2f}",
            pids,
            row.in_order or "-",
            end_section=row.path == PATHS[-1],
        )
        previous = row.title
    return out


NOTES = (
    "x floor: median / the floor's median for the same operation; x Ray: ours / Ray's.",
    "cold: the first call of each path in this driver (worker processes already started).",
    "pids/host: most distinct worker pids one host showed / calls per host (1 = one warm "
    "process reused; fresh drivers excluded). in order: calls whose results came back slice "
    "by slice in TPU worker order.",
    "ours runs every call as Ray 2.60 does: one Ray task per host in its bundle, holding "
    "the bundle's TPU (no owner processes, no spares).",
    "n: samples per path, from every round (2 per round; 5 for held-slice calls, 1 for fresh "
    "drivers).",
    "reserve N, first run: timed from before the reservation (floor: raw group + ready; "
    "Ray: SlicePlacementGroup + ready; ours: SlicePlacementGroup) to the results of one call "
    "on every host of it; the release is not timed.",
    "right after a shutdown: each path reserves N slices, calls once and shuts them down "
    "(untimed; its duration is the hand-back line), then at once reserves N slices again, "
    "timed until placed.",
    "Ray's one-shot run_on_slice keeps its slice until the driver exits: in this driver the "
    "benchmark removes the leaked group after each call (untimed); 'one-shot, fresh driver' "
    "runs every call of every path in a new driver process (it first runs a plain task per "
    "host so its worker processes exist; only the call is timed).",
    "fresh driver, connect + reserve + run: a new driver per call, its modules loaded first; "
    "timed: ray.init (every path alike), reserve 1 slice (or N), the first call, its "
    "results. No worker process is started beforehand (a new driver has none).",
    "one-shot: ours gives the slice back from a background thread once the tasks end "
    "(outside the timing); the floor's removal (one GCS call) is inside its timing.",
    "held: each path calls on a slice of its own, reserved and called once before the "
    "timing: floor = raw tasks into a raw group; Ray's and ours on their own reservations.",
    "hand-back: ours has each host's agent confirm the TPU free, then removes the groups; "
    "the floor removes its group.",
    "handed over: another driver (a new process) holds one slice through the same path, "
    "every other slice is held by a raw group, and this driver waits for a slice; timed "
    "(wall clock across the two processes) from the start of the other's shutdown to the "
    "results of this driver's first call on the slice.",
)


def handback_lines(table: Sequence[Row]) -> list[str]:
    """Per operation that records one, each path's untimed shutdown before its timing."""
    found: dict[str, list[str]] = {}
    for r in table:
        if r.handback_ms is not None:
            found.setdefault(r.title, []).append(f"{r.path} {r.handback_ms:.1f}")
    return [
        f"hand-back just before '{title}' (untimed, median ms): {', '.join(each)}"
        for title, each in found.items()
    ]


def verdicts(found: Sequence[Target]) -> list[str]:
    """One line per goal, naming the ratio it is about (x floor or x Ray)."""
    lines = []
    for t in found:
        unit = "x floor" if t.against == "floor" else "x Ray"
        context = f"Ray {t.ray_x_floor:.2f}x floor"
        if t.against != "floor":
            context = f"ours {t.ours_x_floor:.2f}x floor, {context}"
        lines.append(
            f"{'met   ' if t.met else 'MISSED'} {t.what}: ours {t.value:.2f}{unit} "
            f"(goal <= {t.goal}{unit}); {context}"
        )
    return lines


def report_json(
    records: Records,
    table: Sequence[Row],
    found: Sequence[Target],
    info: dict[str, Any],
    host: dict[str, Any],
) -> dict[str, Any]:
    samples = {
        f"{op}/{path}": [round(s.seconds * 1000, 3) for s in r.samples]
        for (op, path), r in records.items()
    }
    return {
        "config": info,
        "machine": host,
        "rows": [asdict(r) for r in table],
        "targets": [asdict(t) for t in found],
        "verdicts": verdicts(found),
        "samples_ms": samples,
        "handback_ms_median": {
            f"{r.op}/{r.path}": round(r.handback_ms, 1) for r in table if r.handback_ms is not None
        },
        "settle_ms_median": round(statistics.median(SETTLING.waits) * 1000, 1),
        "cleanups": SETTLING.cleanups,
        "fresh_driver_wall_s_median": (
            round(statistics.median(SETTLING.child_walls), 2) if SETTLING.child_walls else None
        ),
        "notes": [*handback_lines(table), *NOTES],
    }


# --- main ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def simulated(
    generation: str, topology: str, count: int, err: Console, host_cpus: int = HOST_CPUS
) -> Iterator[Setup]:
    """The one simulated cluster (``host_cpus`` logical CPUs per host), connected; shut
    down on the way out, whatever happens."""
    err.print(
        f"starting {count} x {generation} {topology}, {host_cpus} CPU"
        f"{'s' if host_cpus != 1 else ''} per host "
        "(about 1.2 s per host)"
    )
    with SimulatedCluster(
        [(generation, topology, count)], cpus_per_host=host_cpus, connect=True
    ) as sim:
        shape = slice_shape(topology, generation)
        err.print(f"cluster up in {sim.startup_seconds:.1f} s")
        yield Setup(generation, topology, shape, tuple(sorted(sim.slices)), sim.address)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--generation", default="v6e", help="TPU generation (default v6e)")
    parser.add_argument("--topology", default="4x4", help="slice topology (default 4x4)")
    parser.add_argument("--slices", type=int, default=4, help="slices in the cluster (4)")
    parser.add_argument(
        "--host-cpus",
        type=int,
        default=HOST_CPUS,
        help=f"logical CPUs of each simulated host ({HOST_CPUS})",
    )
    parser.add_argument(
        "--hog", action="store_true", help="a busy loop on one core during the rounds"
    )
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds (>= 5; 7)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--only",
        type=lambda text: [k for k in text.split(",") if k],
        default=[],
        help=(
            "run only these operations (keys such as reserve-1,reserve-4-run,"
            "reserve-4-after-shutdown,fresh-reserve-run,fresh-reserve-4-run,subslice; "
            "N for 4 or all slices if fewer, as in reserve-N-run)"
        ),
    )
    parser.add_argument("--child", choices=PATHS, help=argparse.SUPPRESS)
    parser.add_argument("--child-op", choices=(*CHILD_OPS, "hand-over"), help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--slice-names", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rounds < 5:
        parser.error("--rounds must be at least 5")
    if args.slices < 1:
        parser.error("--slices must be at least 1")
    if args.host_cpus < 1:
        parser.error("--host-cpus must be at least 1")
    return args


def main() -> None:
    args = parse_args()
    if args.child:
        child_main(args)
        return
    compile_tpuslice()
    err = Console(stderr=True)
    host = machine()  # before the cluster starts: its load average is the machine's own
    started = now()
    with (
        simulated(args.generation, args.topology, args.slices, err, args.host_cpus) as setup,
        cpu_hog() if args.hog else nullcontext(),  # after the cluster is up, to the end
    ):
        records = run_all(setup, args.rounds, lambda message: err.print(message), args.only)
    info = {
        "generation": args.generation,
        "topology": args.topology,
        "slices": args.slices,
        "hosts": args.slices * setup.shape.num_hosts,
        "host_cpus": args.host_cpus,
        "hog": args.hog,
        "load_average_at_start": host["load_average_at_start"],
        "rounds": args.rounds,
        "wall_s": round(now() - started, 1),
    }
    table = rows(records)
    found = targets(table, many_slices(args.slices))
    if args.json:
        print(json.dumps(report_json(records, table, found, info, host), indent=2))
        return
    console = Console(width=max(Console().width, 124))
    console.print(render(table, found, info))
    for line in (*verdicts(found), *handback_lines(table), *NOTES):
        console.print(line, highlight=False)
    console.print(f"machine: {host}; wall {info['wall_s']} s", highlight=False)


if __name__ == "__main__":
    main()
