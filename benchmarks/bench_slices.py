"""Whole-slice reservations and runs next to raw Ray and Ray 2.60's ``ray.util.tpu``.
Run by hand (not a test; it starts a simulated cluster, so only one at a time):

    python benchmarks/bench_slices.py [--generation v6e] [--topology 4x4]
        [--slices 4] [--rounds 7] [--json]

One SimulatedCluster (default 4 slices of v6e 4x4, 16 simulated TPU VMs). Three paths per
operation, ratios to the first:

- ``floor``: raw Ray. One placement group, one ``{"CPU": 1, "TPU": chips}`` bundle per host
  pinned by ``bundle_label_selector`` to the slice name and worker id, ``pg.ready()``, one
  trivial task per host in its bundle, results, removal.
- ``ray``: Ray 2.60's ``ray.util.tpu`` (``SlicePlacementGroup`` + ready, ``run_on_slice``).
- ``ours``: ``tpuslice.SlicePlacementGroup`` and ``tpuslice.run_on_slice``.

Operations: reserve 1, 2 and 4 slices (until every bundle is placed; the release is not
timed); a one-shot run on one slice (reserve, a task per host, results, release) in this
driver, and again with every call in a fresh driver process; a call on a slice reserved
beforehand (floor: raw tasks on a raw group of its own; ours runs in the slice's owner
processes, one per host, started by the first, untimed call); handing a held slice back
after one call (only the release is timed: ours stops its owners and has each host's agent
confirm the TPU free before the groups go; the floor removes its group); and, where the
slices can be cut (v6e 4x4: 2x4 halves), reserving a sub-slice (until its bundles are
placed): with the layout already recorded, and with every record of it dropped first (the
floor then reserves the slice whole, runs one chip-coordinates task per host, removes the
group and reserves the sub-slice's hosts; Ray and ours discover the layout their own way).

Method: worker processes are first started by a plain task on every host; then one cold
round (the first call of each path in this driver); then a few calls through each path on
every host; then ``--rounds`` rounds, interleaved: in round r each operation runs floor,
ray, ours in an order rotated by r (twice per round; five times for the cheap held-slice
call, once for fresh drivers). After each call everything is released and the
benchmark polls ``tpuslice.read_snapshot()`` (bounded) until every slice is idle and no
placement group is left. Ray's config is untouched: its ~100 ms resource-report period is
in the numbers (the first tasks into a fresh placement group wait for it).

Ray's one-shot ``run_on_slice`` keeps its slice until the driver exits, so in this driver
the benchmark removes the leaked group after each call (not timed), and the fresh-driver
operation runs each call in a new process (which first runs a plain task on every host so
its worker processes exist; only the call is timed). Every path gets the same treatment.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import json
import logging
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import ray
import ray.util.tpu as ray_tpu
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)
from rich.console import Console
from rich.table import Table

import tpuslice
from tpuslice import _ray, layouts, subslice
from tpuslice.cluster import SliceState, read_snapshot
from tpuslice.labels import SLICE_NAME_LABEL, WORKER_ID_LABEL
from tpuslice.testing import SimulatedCluster, live_placement_groups, remove_placement_groups
from tpuslice.topology import SliceShape, slice_shape

PATHS = ("floor", "ray", "ours")
RESERVE_SIZES = (1, 2, 4)
IDLE_BOUND_S = 30.0
CHILD_TIMEOUT_S = 120.0
WARM_CALLS = 3
TARGETS = {
    "one-shot": 1.1,  # ours one-shot / floor one-shot
    "reserve-1": 3.0,  # ours reserve 1 / floor reserve 1
    "reserve-n": 1.5,  # ours reserve N / ours reserve 1
    "held": 1.1,  # ours call on a held slice / raw tasks on the same group
}

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


def raw_group_on(setup: Setup, name: str) -> PlacementGroup:
    """One bundle per host of slice ``name``, pinned by label."""
    selectors = [
        {SLICE_NAME_LABEL: name, WORKER_ID_LABEL: str(w)} for w in range(setup.shape.num_hosts)
    ]
    bundles = [{"CPU": 1.0, "TPU": float(setup.shape.chips_per_host)} for _ in selectors]
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


def floor_reserve(setup: Setup, num_slices: int) -> Sample:
    started = now()
    pg = raw_group(setup, num_slices)
    try:
        ray.get(pg.ready())
        return Sample(now() - started)
    finally:
        remove_placement_group(pg)


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


def ray_reserve(setup: Setup, num_slices: int) -> Sample:
    started = now()
    spg = ray_tpu.SlicePlacementGroup(setup.topology, setup.generation, num_slices=num_slices)
    try:
        ray.get(spg.slice_placement_group.ready())
        return Sample(now() - started)
    finally:
        spg.shutdown()


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


def ours_reserve(setup: Setup, num_slices: int) -> Sample:
    started = now()
    with tpuslice.SlicePlacementGroup(setup.topology, setup.generation, num_slices=num_slices):
        return Sample(now() - started)


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


# --- a call on a slice reserved beforehand ----------------------------------------------------


class HeldSlices:
    """One slice reserved by each path for a round (ours, Ray's, and a raw group for the
    floor), each called once untimed: the first tasks into a fresh group wait on Ray's
    resource report, and ours starts its owner processes (one per host, holding each
    bundle's TPU, so the floor's tasks cannot share our group: it gets its own slice)."""

    def __init__(self, setup: Setup) -> None:
        self.setup = setup
        self._stack = ExitStack()
        self.ours: tpuslice.SlicePlacementGroup | None = None
        self.ray: ray_tpu.SlicePlacementGroup | None = None
        self.raw: PlacementGroup | None = None

    def __enter__(self) -> HeldSlices:
        with ExitStack() as stack:
            ours = stack.enter_context(tpuslice.SlicePlacementGroup(*self._args()))
            held = ray_tpu.SlicePlacementGroup(*self._args())
            stack.callback(held.shutdown)
            ray.get(held.slice_placement_group.ready())
            free = [s.name for s in read_snapshot().ready(self.setup.shape)]
            if not free:
                raise BenchError("the held-slice operation needs three idle slices")
            raw = raw_group_on(self.setup, free[0])
            stack.callback(remove_placement_group, raw)
            ray.get(raw.ready())
            self.ours, self.ray, self.raw = ours, held, raw
            for call in self.calls().values():
                call()
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc: object) -> None:
        self.ours = self.ray = self.raw = None
        self._stack.close()

    def _args(self) -> tuple[str, str]:
        return self.setup.topology, self.setup.generation

    def calls(self) -> dict[str, Callable[[], Sample]]:
        return {"floor": self.floor, "ray": self.ray_call, "ours": self.ours_call}

    def floor(self) -> Sample:
        assert self.raw is not None
        pg = self.raw
        shape = self.setup.shape
        started = now()
        results = ray.get(raw_tasks(pg, shape.num_hosts, shape.chips_per_host))
        return Sample(now() - started, results)

    def ray_call(self) -> Sample:
        started = now()
        results = ray.get(ray_tpu.run_on_slice(whoami, tpu_slice=self.ray))
        return Sample(now() - started, results)

    def ours_call(self) -> Sample:
        started = now()
        results = ray.get(tpuslice.run_on_slice(whoami, tpu_slice=self.ours))
        return Sample(now() - started, results)


# --- handing a slice back -------------------------------------------------------------------


def floor_hand_back(setup: Setup) -> Sample:
    """Reserve, one task per host (untimed); then time the removal of the group."""
    pg = raw_group(setup, 1)
    ray.get(pg.ready())
    ray.get(raw_tasks(pg, setup.shape.num_hosts, setup.shape.chips_per_host))
    started = now()
    remove_placement_group(pg)
    return Sample(now() - started)


def ray_hand_back(setup: Setup) -> Sample:
    held = ray_tpu.SlicePlacementGroup(setup.topology, setup.generation)
    ray.get(held.slice_placement_group.ready())
    ray.get(ray_tpu.run_on_slice(whoami, tpu_slice=held))
    started = now()
    held.shutdown()
    return Sample(now() - started)


def ours_hand_back(setup: Setup) -> Sample:
    """Ours also stops its owner processes and has each host's agent confirm that no
    process of the work still owns the TPU before the groups go."""
    spg = tpuslice.SlicePlacementGroup(setup.topology, setup.generation)
    ray.get(tpuslice.run_on_slice(whoami, tpu_slice=spg))
    started = now()
    spg.shutdown()
    return Sample(now() - started)


# --- fresh driver processes -------------------------------------------------------------------


def fresh_driver(setup: Setup, path: str) -> Sample:
    """Run one one-shot call of ``path`` in a new driver process; its report is JSON."""
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        path,
        "--address",
        setup.address,
        "--generation",
        setup.generation,
        "--topology",
        setup.topology,
        "--slice-name",
        setup.names[0],
    ]
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


def child_main(args: argparse.Namespace) -> None:
    """The fresh driver: connect, start this job's worker processes, time one call."""
    ray.init(address=args.address, log_to_driver=False, logging_level=logging.WARNING)
    warm_hosts(times=1)
    # Load every path's modules before the timing, as Ray's and the floor's already are:
    # tpuslice loads its modules on first use, and with PYTHONDONTWRITEBYTECODE=1 (set on
    # this machine) each new process also compiles them (~100-170 ms measured).
    import tpuslice.agent
    import tpuslice.owners
    import tpuslice.run

    _ = (tpuslice.run_on_slice, ray_tpu.run_on_slice)
    shape = slice_shape(args.topology, args.generation)
    setup = Setup(args.generation, args.topology, shape, (args.slice_name,), args.address)
    sample = ONE_SHOT[args.child](setup)
    print(json.dumps({"seconds": sample.seconds, "results": sample.results}), flush=True)
    ray.shutdown()


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
    count, shape = len(setup.names), setup.shape
    pg = raw_group(setup, count)
    try:
        ray.get(pg.ready())
        for _ in range(WARM_CALLS):
            ray.get(raw_tasks(pg, count * shape.num_hosts, shape.chips_per_host))
    finally:
        remove_placement_group(pg)
    settle(setup)
    held = ray_tpu.SlicePlacementGroup(setup.topology, setup.generation, num_slices=count)
    try:
        for _ in range(WARM_CALLS):
            ray.get(ray_tpu.run_on_slice(whoami, tpu_slice=held))
    finally:
        held.shutdown()
    settle(setup)
    with tpuslice.SlicePlacementGroup(setup.topology, setup.generation, num_slices=count) as spg:
        for _ in range(WARM_CALLS):
            ray.get(tpuslice.run_on_slice(whoami, tpu_slice=spg))
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
        _ray.kv_delete(layouts.KEY_PREFIX + name, layouts.NAMESPACE)
        _ray.kv_delete(subslice.kv_key(name).decode(), subslice.KV_NAMESPACE)
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
    elif layouts.load(read_snapshot().slices[setup.names[0]]) is None:
        with tpuslice.subslice_placement_group(sub, setup.generation):
            pass
        settle(setup)


def floor_subslice(setup: Setup, sub: str, learn: bool) -> Sample:
    prepare_subslice(setup, sub, learn)
    known = None if learn else layouts.load(read_snapshot().slices[setup.names[0]])
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


def operations(setup: Setup) -> list[Operation]:
    ops = [
        Operation(
            f"reserve-{n}",
            f"reserve {n} slice{'s' if n > 1 else ''}",
            {
                "floor": lambda n=n: floor_reserve(setup, n),
                "ray": lambda n=n: ray_reserve(setup, n),
                "ours": lambda n=n: ours_reserve(setup, n),
            },
        )
        for n in RESERVE_SIZES
        if n <= len(setup.names)
    ]
    held = HeldSlices(setup)
    ops += [
        Operation(
            "one-shot",
            "one-shot, this driver",
            {path: lambda path=path: ONE_SHOT_HERE[path](setup) for path in PATHS},
        ),
        Operation(
            "one-shot-fresh",
            "one-shot, fresh driver",
            {path: lambda path=path: fresh_driver(setup, path) for path in PATHS},
            cold=False,
            passes=1,
        ),
        Operation("held", "call on a held slice", held.calls(), hold=held, cold=False, passes=5),
        Operation(
            "hand-back",
            "hand a held slice back",
            {
                "floor": lambda: floor_hand_back(setup),
                "ray": lambda: ray_hand_back(setup),
                "ours": lambda: ours_hand_back(setup),
            },
            cold=False,
        ),
    ]
    sub = sub_topology(setup)
    if sub is not None:
        for learn, key, title in (
            (False, "subslice", f"reserve a {sub} sub-slice"),
            (True, "subslice-learn", f"reserve a {sub} sub-slice, layout unknown"),
        ):
            ops.append(
                Operation(
                    key,
                    title,
                    {
                        "floor": lambda learn=learn: floor_subslice(setup, sub, learn),
                        "ray": lambda learn=learn: ray_subslice(setup, sub, learn),
                        "ours": lambda learn=learn: ours_subslice(setup, sub, learn),
                    },
                )
            )
    return ops


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


def run_all(
    setup: Setup, rounds: int, progress: Callable[[str], None], only: Sequence[str] = ()
) -> Records:
    records: Records = {}
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


def in_worker_order(results: Sequence[HostResult]) -> bool:
    return [worker for _, worker, _ in results] == list(range(len(results))) and (
        len({name for name, _, _ in results}) == 1
    )


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
    out = []
    for (op, path), record in records.items():
        ms = [s.seconds * 1000 for s in record.samples]
        median = medians[op, path]
        with_results = [s.results for s in record.samples if s.results is not None]
        pids = pid_counts(record.samples)
        out.append(
            Row(
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
            )
        )
    return out


@dataclass
class Target:
    what: str
    goal: float
    value: float
    ray_value: float | None
    met: bool
    floor_value: float | None = None
    """The same ratio for the floor, where it has one (reserving N slices / 1)."""


def targets(table: Sequence[Row]) -> list[Target]:
    """The goals whose operations ran (all of them unless ``--only`` chose some)."""
    by = {(r.op, r.path): r for r in table}
    sizes = [n for n in RESERVE_SIZES if (f"reserve-{n}", "ours") in by]

    def ratio(what: str, goal: float, op: str) -> Target | None:
        if (op, "ours") not in by:
            return None
        ours, theirs = by[op, "ours"].x_floor, by[op, "ray"].x_floor
        return Target(what, goal, ours, theirs, ours <= goal)

    def growth() -> Target | None:
        if len(sizes) < 2 or sizes[0] != 1:
            return None
        biggest = f"reserve-{sizes[-1]}"

        def over(path: str) -> float:
            return by[biggest, path].median_ms / by["reserve-1", path].median_ms

        goal = TARGETS["reserve-n"]
        what = f"reserve {sizes[-1]} slices / reserve 1 slice"
        return Target(what, goal, over("ours"), over("ray"), over("ours") <= goal, over("floor"))

    found = [
        ratio("one-shot run on one slice / floor (this driver)", TARGETS["one-shot"], "one-shot"),
        ratio(
            "one-shot run on one slice / floor (fresh driver)",
            TARGETS["one-shot"],
            "one-shot-fresh",
        ),
        ratio("reserve 1 slice / raw placement-group reserve", TARGETS["reserve-1"], "reserve-1"),
        growth(),
        ratio("call on a held slice / raw tasks on the same group", TARGETS["held"], "held"),
    ]
    return [t for t in found if t is not None]


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


def render(table: Sequence[Row], found: Sequence[Target], info: dict[str, Any]) -> Table:
    out = Table(
        title=(
            f"{info['slices']} x {info['generation']} {info['topology']} slices "
            f"({info['hosts']} simulated hosts), {info['rounds']} interleaved rounds; "
            "n samples per path; ms"
        ),
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
    "process reused; fresh drivers excluded). in order: calls whose results came back in "
    "TPU worker order.",
    "n: samples per path, from every round (2 per round; 5 for held-slice calls, 1 for fresh "
    "drivers).",
    "Ray's one-shot run_on_slice keeps its slice until the driver exits: in this driver the "
    "benchmark removes the leaked group after each call (untimed); 'fresh driver' runs every "
    "call of every path in a new driver process (it first runs a plain task per host so its "
    "worker processes exist; only the call is timed).",
    "one-shot: ours gives the slice back from a background thread once the tasks end "
    "(outside the timing); the floor's removal (one GCS call) is inside its timing.",
    "held: floor = raw tasks into the same placement group as ours; Ray's call runs on its "
    "own reservation of another slice.",
)


def verdicts(found: Sequence[Target]) -> list[str]:
    return [
        f"{'met   ' if t.met else 'MISSED'} {t.what}: ours {t.value:.2f}x (goal <= {t.goal}x)"
        + (f"; Ray {t.ray_value:.2f}x" if t.ray_value is not None else "")
        + (f"; raw Ray itself {t.floor_value:.2f}x" if t.floor_value is not None else "")
        for t in found
    ]


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
        "settle_ms_median": round(statistics.median(SETTLING.waits) * 1000, 1),
        "cleanups": SETTLING.cleanups,
        "fresh_driver_wall_s_median": (
            round(statistics.median(SETTLING.child_walls), 2) if SETTLING.child_walls else None
        ),
        "notes": list(NOTES),
    }


# --- main ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def simulated(generation: str, topology: str, count: int, err: Console) -> Iterator[Setup]:
    """The one simulated cluster, connected; shut down on the way out, whatever happens."""
    err.print(f"starting {count} x {generation} {topology} (about 1.2 s per host)")
    with SimulatedCluster([(generation, topology, count)], connect=True) as sim:
        shape = slice_shape(topology, generation)
        err.print(f"cluster up in {sim.startup_seconds:.1f} s")
        yield Setup(generation, topology, shape, tuple(sorted(sim.slices)), sim.address)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--generation", default="v6e", help="TPU generation (default v6e)")
    parser.add_argument("--topology", default="4x4", help="slice topology (default 4x4)")
    parser.add_argument("--slices", type=int, default=4, help="slices in the cluster (4)")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds (>= 5; 7)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--only",
        type=lambda text: [k for k in text.split(",") if k],
        default=[],
        help="run only these operations (keys such as reserve-1,subslice,subslice-learn)",
    )
    parser.add_argument("--child", choices=PATHS, help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--slice-name", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rounds < 5:
        parser.error("--rounds must be at least 5")
    if args.slices < 1:
        parser.error("--slices must be at least 1")
    return args


def main() -> None:
    args = parse_args()
    if args.child:
        child_main(args)
        return
    err = Console(stderr=True)
    host = machine()  # before the cluster starts: its load average is the machine's own
    started = now()
    with simulated(args.generation, args.topology, args.slices, err) as setup:
        records = run_all(setup, args.rounds, lambda message: err.print(message), args.only)
    info = {
        "generation": args.generation,
        "topology": args.topology,
        "slices": args.slices,
        "hosts": args.slices * setup.shape.num_hosts,
        "rounds": args.rounds,
        "wall_s": round(now() - started, 1),
    }
    table = rows(records)
    found = targets(table)
    if args.json:
        print(json.dumps(report_json(records, table, found, info, host), indent=2))
        return
    console = Console(width=max(Console().width, 124))
    console.print(render(table, found, info))
    for line in (*verdicts(found), *NOTES):
        console.print(line, highlight=False)
    console.print(f"machine: {host}; wall {info['wall_s']} s", highlight=False)


if __name__ == "__main__":
    main()
