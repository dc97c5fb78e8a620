"""More drivers than slices: a shared cluster's queue, side by side (issue 15).
Run by hand (not a test; it starts simulated clusters, so only one at a time):

    python benchmarks/bench_contention.py [--paths floor,ours,ray] [--hold 2] [--jobs 3]
        [--host-cpus 8] [--exit-when-done] [--hog] [--json]

The run the issue asks for, as users run it (one CPU per host, each driver gone when its
jobs are, and optionally a busy core besides):

    python benchmarks/bench_contention.py --host-cpus 1 --exit-when-done [--hog] \
        --paths ours-fresh,floor-fresh,ours,floor

A SimulatedCluster of 4 slices of v6e 4x4 (16 simulated TPU VMs, ``--host-cpus`` CPUs
each, 8 by default). Six driver processes start together; each runs ``--jobs`` (3)
one-shot jobs in a row, each job holding its slice(s) for ``--hold`` seconds (a task per
host that sleeps). Four drivers ask for 1 slice per job, two for 2. Library defaults
throughout (a job that fails ends its driver, as a user's script would stop). By default
a driver done with its jobs stays connected until every driver is done: a driver's exit
has Ray stop its worker process on each of the 16 hosts, which here share 2 cores (on
TPU VMs each host stops its own), and that load would otherwise fall on the hand-backs
and grants of the jobs still running. With ``--exit-when-done`` each driver exits as soon
as its own jobs are done, as a user's script does, and that load is part of the
measure. With ``--hog`` a process spinning a busy loop takes one core for the whole of
each path, as another user's work on the machine would.

Paths, one after the other; a path whose name ends in ``-fresh`` runs first thing on its
own freshly started cluster of the same shape (the cluster before it is shut down), and
the paths after it run on that cluster too:

- ``ours``: ``tpuslice.run_on_slice`` (the queue grants slices; drivers wait in it).
- ``ours-fresh``: the same, as the first work on a fresh cluster, so tpuslice's own
  services (the queue actor, each host's agent) start during it.
- ``ours-2tenants`` (only when asked for): ``ours`` with the drivers split between two
  tenants of weights 1 and 2 (``tenant=`` on each one-shot), the same demand from each
  (the drivers of each size dealt in turn to each tenant), and quotas set for the path
  only: both tenants with a weight and no slices, so both borrow, in the same standing,
  and the queue orders them by weighted usage. Reported: each tenant's slice-seconds
  (each job's slices times its grant to its hand-back's end) while every driver still had
  jobs to submit, its share against its weight's, Jain's fairness index over the
  weight-normalised shares, and the makespan against ``ours``'s in the same run (put
  ``ours`` in ``--paths`` too, and give enough ``--jobs`` for the split to show).
- ``ray``: Ray 2.60's ``ray.util.tpu.run_on_slice``; its one-shot reservation leaks until
  the driver exits, so each job shuts it down after the results (as a user would have to).
- ``floor``: raw Ray, no slice integrity: one placement group of one ``{"TPU": 4}``
  bundle per host wanted (STRICT_SPREAD), left pending in Ray's own scheduler until it
  places, a task per bundle, removal. It shows what Ray's machinery costs, not a valid
  SPMD placement (its bundles may straddle slices).
- ``floor-fresh``: the floor as the first work on a fresh cluster, so that
  ``--paths ours-fresh,floor-fresh`` compares each on a cluster of its own.

Reported per path: the machine's 1-minute load average at its start; jobs done and
failed; makespan (first submit to last job end) over the ideal (total slice-seconds /
slices = 12 s at 2 s holds and 3 jobs a driver); each job's wait (submit to its first
task starting), longest and mean, next to a strict first-come-first-served schedule of
the same jobs with zero overheads; and, sampled every 50 ms from the cluster's
resources:

- held-idle slice-seconds: a slice whose head resource is taken while all its TPUs are
  free (claimed, no work on it), all of it and in spans of at least 0.5 s (holding some
  slices while waiting for more shows as such spans; shorter ones are claims and
  hand-backs seen half-done, each host's resources reaching the GCS view on its own);
- idle-while-waiting slice-seconds: at each sample, the slices wholly idle (head
  resource free, no TPU in use on any host) up to the slices wanted by the jobs submitted
  and not yet started, integrated over the path (:func:`idle_while_waiting`); next to
  the same on the strict-FCFS zero-overhead replay of the run's own arrivals and job
  lengths (:func:`replay_idle_while_waiting`), the excess over it, and that excess per
  slice handed over (each done job's slices, summed).

Also reported: for the tpuslice paths, each job's phases from the driver's own trace (see
:func:`phases`: to the queue's grant, grant to held, held to the first task, the
hand-back, and a freed slice's gap to its next grant); and for every path, the CPU
seconds spent meanwhile by each kind of process (queue actor, host agents, raylets, GCS,
dashboard agents, the hog, ...; processes that ended during the path are missed, the
drivers among them).

The verdicts hold each tpuslice path (but the two-tenant one: fair share is not FCFS)
against the floor of the same run (``floor-fresh`` for a ``-fresh`` path when both ran):
makespan at most 1.15x the floor's; longest wait at most the floor's; no job waiting more
than 2 s beyond the FCFS replay; idle-while-waiting beyond the replay's under 1
slice-second per slice handed over.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from rich.console import Console

DRIVERS = (1, 1, 1, 1, 2, 2)
"""Slices per job of each driver."""
JOBS_PER_DRIVER = 3
SLICES = 4
HOSTS_PER_SLICE = 4
CHIPS_PER_HOST = 4
PATHS = ("floor", "ours", "ray")
TWO_TENANTS = "ours-2tenants"
OURS = ("ours", TWO_TENANTS)
"""The tpuslice paths (they differ in the tenants), without ``-fresh``."""
KNOWN_PATHS = (*PATHS, TWO_TENANTS)
FRESH = "-fresh"
"""A path named with this suffix runs first thing on a freshly started cluster."""
HOST_CPUS = 8
"""Logical CPUs of each simulated host, unless ``--host-cpus`` says otherwise."""
HOG_CODE = "while True: pass"
"""What the ``--hog`` process runs: a busy loop on one core."""
TENANT_WEIGHTS = (1.0, 2.0)
"""The two-tenant path's tenants' weights in fair share."""
FCFS_SLACK_S = 2.0
"""The target: no job waits longer than strict FCFS with no overheads would, plus this."""
TIE_S = 0.05
"""In the replay, jobs submitted within this long of each other count as submitted
together, and are taken in the order the run started them. A request takes about this
long to reach any arbiter (the submit-to-queue times of the runs in RESULTS.md are 10-40
ms: a read of the cluster, then a call), so no FCFS can order them more finely, and the
order the run gave them is one that strict FCFS could have given."""
MAKESPAN_TARGET = 1.15
"""The target: a tpuslice path's makespan over the floor's, in the same run."""
IWW_TARGET = 1.0
"""The target: idle-while-waiting slice-seconds beyond the FCFS replay's, per slice
handed over, below this."""
PATH_TIMEOUT_S = 900.0


@dataclass
class Job:
    driver: int
    index: int
    slices: int
    submit: float
    start: float | None = None
    end: float | None = None
    skew: float = 0.0
    """From the job's first task starting to its last."""
    error: str = ""
    granted: float | None = None
    """tpuslice paths: when the queue granted the slices (the driver's poll saw it)."""
    reserved: float | None = None
    """tpuslice paths: when the reservation was held (every group placed)."""
    back_start: float | None = None
    """tpuslice paths: when the one-shot's hand-back began (its tasks had ended)."""
    back_end: float | None = None
    """tpuslice paths: when the hand-back ended (every group removed)."""
    confirm_s: float | None = None
    """tpuslice paths: of the hand-back, the agents' confirmation that the TPUs are free."""
    view_s: float | None = None
    """tpuslice paths: of the hand-back, the wait for Ray's view to show the hosts free."""
    slices_held: list[str] = field(default_factory=list)
    tenant: str = ""
    """The two-tenant path: whom the job was charged to (else the default tenant)."""


@dataclass
class PathResult:
    path: str
    jobs: list[Job] = field(default_factory=list)
    weights: dict[str, float] = field(default_factory=dict)
    """The two-tenant path: each tenant's weight."""
    held_idle_slice_s: float = 0.0
    held_idle_long_slice_s: float = 0.0
    idle_samples: list[tuple[float, int]] = field(default_factory=list)
    """``(time, slices wholly idle)`` every 50 ms during the path (:class:`IdleSampler`)."""
    load_1m: float = 0.0
    """The machine's 1-minute load average when the path started."""
    cpu_s: dict[str, float] = field(default_factory=dict)
    """CPU seconds spent during the path, by kind of process (see :func:`cpu_spent`)."""

    @property
    def done(self) -> list[Job]:
        return [j for j in self.jobs if j.end is not None and not j.error]

    def summary(self, hold: float, jobs: int) -> dict[str, Any]:
        done = self.done
        waits = [j.start - j.submit for j in done if j.start is not None]
        first = min((j.submit for j in self.jobs), default=0.0)
        last = max((j.end for j in done if j.end is not None), default=first)
        ideal = ideal_makespan(hold, jobs)
        tenants = {"tenants": tenant_report(self.jobs, self.weights)} if self.weights else {}
        excess, worst_job = beyond_fcfs(self.jobs)
        return {
            "path": self.path,
            "load_1m": self.load_1m,
            "jobs_done": len(done),
            "jobs_failed": sum(1 for j in self.jobs if j.error),
            "errors": sorted({j.error for j in self.jobs if j.error}),
            "makespan_s": last - first,
            "makespan_over_ideal": (last - first) / ideal,
            "longest_wait_s": max(waits, default=0.0),
            "mean_wait_s": sum(waits) / len(waits) if waits else 0.0,
            "mean_run_s": _mean([j.end - j.start for j in done if j.start and j.end]),
            "mean_start_skew_s": _mean([j.skew for j in done]),
            **phases(done),
            "beyond_fcfs_s": excess,
            "beyond_fcfs_job": worst_job,
            "held_idle_slice_s": self.held_idle_slice_s,
            "held_idle_long_slice_s": self.held_idle_long_slice_s,
            **iww_report(done, self.idle_samples),
            "cpu_s": self.cpu_s,
            **tenants,
        }


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def phases(done: list[Job]) -> dict[str, float]:
    """The tpuslice paths' per-job phases (means, seconds), from the driver's trace:

    - ``to_grant``: submit to the queue's grant seen by the driver;
    - ``grant_to_held``: grant to the reservation held (claims and workers placed);
    - ``held_to_start``: held to the first task starting;
    - ``end_to_back``: the tasks' end (the driver has the results) to the hand-back's
      start (the releaser noticed);
    - ``back``: the hand-back itself (owners stopped, TPUs confirmed free, groups removed),
      and of it ``back_confirm`` (the agents' confirmation) and ``back_view`` (the wait
      for Ray's view to show the hosts free);
    - ``slice_gap``: per slice, from one job's hand-back end to the next job's grant of it
      (how long a freed slice waited for the queue to hand it on).
    """
    traced = [j for j in done if j.reserved is not None]
    if not traced:
        return {}

    def mean(pairs: list[tuple[float | None, float | None]]) -> float:
        return _mean([b - a for a, b in pairs if a is not None and b is not None])

    gaps: list[float] = []
    by_slice: dict[str, list[Job]] = {}
    for job in traced:
        for name in job.slices_held:
            by_slice.setdefault(name, []).append(job)
    for jobs in by_slice.values():
        jobs.sort(key=lambda j: j.reserved or 0.0)
        for before, after in itertools.pairwise(jobs):
            if before.back_end is not None and after.granted is not None:
                gaps.append(after.granted - before.back_end)
    return {
        "to_grant_s": mean([(j.submit, j.granted) for j in traced]),
        "grant_to_held_s": mean([(j.granted, j.reserved) for j in traced]),
        "held_to_start_s": mean([(j.reserved, j.start) for j in traced]),
        "end_to_back_s": mean([(j.end, j.back_start) for j in traced]),
        "back_s": mean([(j.back_start, j.back_end) for j in traced]),
        "back_confirm_s": _mean([j.confirm_s for j in traced if j.confirm_s is not None]),
        "back_view_s": _mean([j.view_s for j in traced if j.view_s is not None]),
        "slice_gap_s": _mean(gaps),
    }


def ideal_makespan(hold: float, jobs: int = JOBS_PER_DRIVER) -> float:
    """Total slice-seconds of work over the slices."""
    return sum(n * jobs * hold for n in DRIVERS) / SLICES


# --- paths and clusters (pure) --------------------------------------------------------------


def base_path(path: str) -> str:
    """What a path runs, without its ``-fresh`` (which says only where it runs)."""
    return path.removesuffix(FRESH)


def cluster_groups(paths: Sequence[str]) -> list[list[str]]:
    """The paths split by the cluster each runs on: a ``-fresh`` path starts a new
    cluster unless it is first (the first cluster is fresh already), and the paths after
    it run on that cluster too.

    Args:
        paths: The paths, in the order they run.

    Returns:
        One list of paths per cluster, in order.
    """
    groups: list[list[str]] = []
    for path in paths:
        if not groups or path.endswith(FRESH):
            groups.append([])
        groups[-1].append(path)
    return groups


# --- two tenants (pure) --------------------------------------------------------------------


def driver_tenants(drivers: Sequence[int], tenants: int) -> list[int]:
    """Each driver's tenant (an index), so that every tenant has the same demand: the
    drivers of each size are dealt in turn, each size starting where the last left off.

    Args:
        drivers: Slices per job of each driver.
        tenants: How many tenants.

    Returns:
        The tenant of each driver, in driver order.
    """
    dealt = [0] * len(drivers)
    turn = 0
    for size in sorted(set(drivers)):
        for d, n in enumerate(drivers):
            if n == size:
                dealt[d] = turn % tenants
                turn += 1
    return dealt


def held_span(job: Job) -> tuple[float, float] | None:
    """When a job held its slices: from the queue's grant (else its first task) to the
    hand-back's end (else the job's end); ``None`` if it never ran."""
    begin = job.granted if job.granted is not None else job.start
    end = job.back_end if job.back_end is not None else job.end
    if begin is None or end is None or job.error:
        return None
    return begin, end


def contention_window(jobs: Sequence[Job]) -> tuple[float, float]:
    """While every driver still had jobs to ask for: from the first submit to the earliest
    grant of a driver's last job (after it that driver asks for nothing more, so its
    tenant's demand falls below the other's).

    Args:
        jobs: Every job of the path, each with its driver.

    Returns:
        ``(start, end)``, seconds.
    """
    start = min(j.submit for j in jobs)
    last: dict[int, Job] = {}
    for job in jobs:
        if job.driver not in last or job.index > last[job.driver].index:
            last[job.driver] = job
    # A driver whose last job failed stopped asking when it asked for that job.
    ends = [span[0] if (span := held_span(j)) else j.submit for j in last.values()]
    return start, max(start, min(ends, default=start))


def slice_seconds_by_tenant(
    jobs: Sequence[Job], window: tuple[float, float] | None = None
) -> dict[str, float]:
    """Each tenant's slice-seconds: every job's slices times its held span, cut to
    ``window`` if given.

    Args:
        jobs: The jobs.
        window: ``(start, end)``; ``None``: all of each span.

    Returns:
        Tenant -> slice-seconds (every tenant of ``jobs``, 0 if it held nothing).
    """
    used = {j.tenant: 0.0 for j in jobs}
    for job in jobs:
        span = held_span(job)
        if span is None:
            continue
        begin, end = span
        if window is not None:
            begin, end = max(begin, window[0]), min(end, window[1])
        used[job.tenant] += job.slices * max(0.0, end - begin)
    return used


def shares(
    slice_seconds: Mapping[str, float], weights: Mapping[str, float]
) -> dict[str, dict[str, float]]:
    """Each tenant's share of the slice-seconds against its weight's share.

    Args:
        slice_seconds: Tenant -> slice-seconds used.
        weights: Tenant -> weight (the tenants compared).

    Returns:
        Tenant -> ``slice_s``, ``share`` (of the total; 0 if nothing was used),
        ``weight``, ``weight_share`` and ``ratio`` (share over weight share: 1 is fair).
    """
    total = sum(slice_seconds.get(t, 0.0) for t in weights)
    weight_total = sum(weights.values())
    out = {}
    for tenant, weight in weights.items():
        used = slice_seconds.get(tenant, 0.0)
        share = used / total if total > 0 else 0.0
        weight_share = weight / weight_total
        out[tenant] = {
            "slice_s": used,
            "share": share,
            "weight": weight,
            "weight_share": weight_share,
            "ratio": share / weight_share,
        }
    return out


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index: ``(sum x)^2 / (n * sum x^2)``; 1 when every value is equal,
    ``1/n`` when one has everything. Over weight-normalised shares (share over weight
    share), 1 means each tenant got exactly its weight's share.

    Args:
        values: One value per tenant, each 0 or more.

    Returns:
        The index; 1 for no values or all zero (nothing to be unfair about).
    """
    squares = sum(x * x for x in values)
    if not values or squares == 0:
        return 1.0
    return sum(values) ** 2 / (len(values) * squares)


def tenant_report(jobs: Sequence[Job], weights: Mapping[str, float]) -> dict[str, Any]:
    """The two-tenant path's split: while every driver still had jobs to ask for (the
    headline: both tenants' demand as given), and over the whole path (where equal
    demand, all of it served, makes the split equal whatever the order)."""
    window = contention_window(jobs)
    in_window = shares(slice_seconds_by_tenant(jobs, window), weights)
    whole = shares(slice_seconds_by_tenant(jobs), weights)
    return {
        "window_s": window[1] - window[0],
        "window": in_window,
        "jain": jain_index([s["ratio"] for s in in_window.values()]),
        "whole_run": whole,
        "whole_run_jain": jain_index([s["ratio"] for s in whole.values()]),
    }


def fcfs_schedule(hold: float, jobs: int = JOBS_PER_DRIVER) -> dict[str, float]:
    """A strict first-come-first-served schedule of the same drivers, zero overheads: jobs
    start in submit order (ties: driver order), each as soon as enough slices are free
    and every job submitted before it has started. Each driver submits its next job
    when its last one ends."""
    free = SLICES
    running: list[tuple[float, int, int]] = []  # (end, driver, slices)
    pending: list[tuple[float, int, int]] = [(0.0, d, n) for d, n in enumerate(DRIVERS)]
    left = {d: jobs for d in range(len(DRIVERS))}
    now, waits, last = 0.0, [], 0.0
    while pending or running:
        pending.sort()
        if pending and pending[0][0] <= now and pending[0][2] <= free:
            submit, driver, n = pending.pop(0)
            free -= n
            waits.append(now - submit)
            running.append((now + hold, driver, n))
            continue
        running.sort()
        end, driver, n = running.pop(0)
        now = max(now, end)
        free += n
        last = max(last, end)
        left[driver] -= 1
        if left[driver]:
            pending.append((end, driver, n))
        if pending and pending[0][0] > now and not running:
            now = pending[0][0]
    return {
        "makespan_s": last,
        "longest_wait_s": max(waits),
        "mean_wait_s": sum(waits) / len(waits),
    }


class ReplayRun(NamedTuple):
    """One job in :func:`fcfs_replay_runs`: when it was submitted, started and ended
    there, and how many slices it took."""

    submit: float
    start: float
    end: float
    slices: int


def fcfs_replay_runs(jobs: list[Job]) -> dict[tuple[int, int], ReplayRun]:
    """What strict FCFS with no overheads would have made of a run, on that run's own
    arrivals and job lengths: each driver's first submit as it happened, each job as long
    as it ran (its first task's start to its end), each next job submitted the moment the
    last one ends, and a job started as soon as enough slices are free and every job
    submitted before it has started (jobs submitted within :data:`TIE_S` of the earliest
    one waiting: in the order the run started them, so a slice may be kept those few ms
    for one not yet submitted, which favours the run by as much). The schedule of
    :func:`fcfs_schedule` has every driver submit at one instant and every job last the
    same, so every slice frees at once; a real run's drivers start a little apart and
    their jobs end apart, and a job needing 2 slices then waits for the second.

    Args:
        jobs: The run's jobs; a driver's jobs after one that failed are left out.

    Returns:
        (driver, job index) -> that job in the replay.
    """
    by_driver: dict[int, list[Job]] = {}
    for job in sorted(jobs, key=lambda j: (j.driver, j.index)):
        line = by_driver.setdefault(job.driver, [])
        if job.start is None or job.end is None or job.error or len(line) != job.index:
            continue
        line.append(job)
    free = SLICES
    pending = [(line[0].submit, d, 0) for d, line in by_driver.items() if line]
    running: list[tuple[float, int, int]] = []  # (end, driver, index)
    runs: dict[tuple[int, int], ReplayRun] = {}
    now = min((p[0] for p in pending), default=0.0)

    def started(entry: tuple[float, int, int]) -> tuple[float, int]:
        start = by_driver[entry[1]][entry[2]].start
        assert start is not None
        return start, entry[1]

    while pending or running:
        pending.sort()
        if pending and pending[0][0] <= now:
            tied = [p for p in pending if p[0] <= pending[0][0] + TIE_S]
            head = min(tied, key=started)
            submit, driver, index = head
            job = by_driver[driver][index]
            if job.slices <= free:
                pending.remove(head)
                free -= job.slices
                assert job.start is not None and job.end is not None
                start = max(now, submit)
                end = start + job.end - job.start
                runs[driver, index] = ReplayRun(submit, start, end, job.slices)
                running.append((end, driver, index))
                continue
        moments = [r[0] for r in running] + [p[0] for p in pending if p[0] > now]
        now = min(moments)
        for end, driver, index in sorted(running):
            if end <= now:
                running.remove((end, driver, index))
                free += by_driver[driver][index].slices
                if index + 1 < len(by_driver[driver]):
                    pending.append((end, driver, index + 1))
    return runs


def fcfs_replay(jobs: list[Job]) -> dict[tuple[int, int], float]:
    """What strict FCFS with no overheads would have made each job of a run wait (see
    :func:`fcfs_replay_runs`).

    Args:
        jobs: The run's jobs; a driver's jobs after one that failed are left out.

    Returns:
        (driver, job index) -> its wait in the replay, seconds.
    """
    return {key: run.start - run.submit for key, run in fcfs_replay_runs(jobs).items()}


def beyond_fcfs(jobs: list[Job]) -> tuple[float, str]:
    """How much longer than :func:`fcfs_replay` the worst job waited, and which it was.

    Args:
        jobs: The run's jobs.

    Returns:
        The largest excess in seconds (0 when no job waited longer), and the job, as
        ``driver d job i: waited W s, FCFS F s``.
    """
    replay = fcfs_replay(jobs)
    worst, which = 0.0, ""
    for job in jobs:
        key = (job.driver, job.index)
        if key not in replay or job.start is None:
            continue
        excess = job.start - job.submit - replay[key]
        if excess > worst or not which:
            worst = max(excess, 0.0)
            which = (
                f"driver {job.driver} job {job.index}: waited {job.start - job.submit:.1f} s, "
                f"FCFS {replay[key]:.1f} s"
            )
    return worst, which


# --- idle while waiting (pure) -------------------------------------------------------------


def idle_while_waiting(
    idle: Sequence[tuple[float, int]], waits: Sequence[tuple[float, float, int]]
) -> float:
    """Slice-seconds a slice stood idle while a request it could serve waited: the
    integral of ``min(idle slices, slices wanted by the requests waiting)`` over time.

    Args:
        idle: ``(time, slices wholly idle from then on)``, sorted by time: samples, each
            held until the next; the integral runs from the first to the last.
        waits: ``(submit, start, slices)`` of each request: it waits from its submit
            until its start.

    Returns:
        The slice-seconds (0 with fewer than two samples).
    """
    if len(idle) < 2:
        return 0.0
    first, last = idle[0][0], idle[-1][0]
    edges = {t for t, _ in idle} | {t for s, e, _ in waits for t in (s, e) if first < t < last}
    total, k = 0.0, 0
    for begin, end in itertools.pairwise(sorted(edges)):
        while k + 1 < len(idle) and idle[k + 1][0] <= begin:
            k += 1
        wanted = sum(n for submit, start, n in waits if submit <= begin < start)
        total += min(idle[k][1], wanted) * (end - begin)
    return total


def busy_timeline(runs: Sequence[tuple[float, float, int]]) -> list[tuple[float, int]]:
    """The slices busy from each moment a run starts or ends on, given each run's
    ``(start, end, slices)``: a step function, one entry per moment, sorted by time."""
    change: dict[float, int] = {}
    for start, end, slices in runs:
        change[start] = change.get(start, 0) + slices
        change[end] = change.get(end, 0) - slices
    busy, timeline = 0, []
    for moment in sorted(change):
        busy += change[moment]
        timeline.append((moment, busy))
    return timeline


def replay_idle_while_waiting(jobs: list[Job]) -> float:
    """:func:`idle_while_waiting` in :func:`fcfs_replay_runs` of the run's jobs: a slice
    is idle there whenever no replayed job runs on it, from the first submit on.

    Args:
        jobs: The run's jobs; a driver's jobs after one that failed are left out.

    Returns:
        The replay's idle-while-waiting slice-seconds.
    """
    runs = list(fcfs_replay_runs(jobs).values())
    if not runs:
        return 0.0
    busy = busy_timeline([(r.start, r.end, r.slices) for r in runs])
    idle = [(min(r.submit for r in runs), SLICES)] + [(t, SLICES - n) for t, n in busy]
    return idle_while_waiting(idle, [(r.submit, r.start, r.slices) for r in runs])


def iww_report(done: list[Job], samples: Sequence[tuple[float, int]]) -> dict[str, float]:
    """A path's idle-while-waiting: measured from its idle samples and its done jobs'
    waits, the replay's, the excess, and the excess per slice handed over."""
    measured = idle_while_waiting(
        samples, [(j.submit, j.start, j.slices) for j in done if j.start is not None]
    )
    replay = replay_idle_while_waiting(done)
    handed_over = sum(j.slices for j in done)
    return {
        "iww_slice_s": measured,
        "iww_replay_slice_s": replay,
        "iww_beyond_replay_slice_s": measured - replay,
        "slices_handed_over": handed_over,
        "iww_beyond_per_slice_s": (measured - replay) / handed_over if handed_over else 0.0,
    }


# --- a driver process ----------------------------------------------------------------------


@ray.remote(num_cpus=0)
def hold_task(seconds: float) -> float:
    started = time.time()
    time.sleep(seconds)
    return started


def child_main(args: argparse.Namespace) -> None:
    """One driver: wait for the common start, run its jobs, print them as JSON; then,
    unless ``--exit-when-done``, wait for the parent's word before exiting."""
    ray.init(address=args.address, log_to_driver=False, logging_level="ERROR")
    from ray.util import tpu as _ray_tpu  # noqa: F401

    import tpuslice  # noqa: F401  (loaded before the start, as a user's script would be)

    jobs: list[Job] = []
    if args.path in OURS:
        trace_phases(jobs)
    warm_every_host()
    print("ready", flush=True)
    start_at = float(sys.stdin.readline())
    while time.time() < start_at:
        time.sleep(0.005)
    for index in range(args.jobs):
        job = Job(args.driver, index, args.slices, time.time(), tenant=args.tenant or "")
        jobs.append(job)
        try:
            starts = run_job(args.path, args.slices, args.hold, args.tenant)
            job.start, job.end = min(starts), time.time()
            job.skew = max(starts) - min(starts)
        except Exception as exc:  # noqa: BLE001  (reported, ends this driver)
            job.error = f"{type(exc).__name__}: {str(exc)[:200]}"
            break
    deadline = time.time() + 30  # the last one-shot's hand-back, for its trace
    while any(j.reserved and not j.back_end for j in jobs) and time.time() < deadline:
        time.sleep(0.01)
    print(json.dumps([asdict(j) for j in jobs]), flush=True)
    if not args.exit_when_done:
        sys.stdin.readline()  # stay connected until every driver is done (module docstring)


def driver_report(proc: subprocess.Popen[str]) -> str | None:
    """A driver's JSON line, once it printed it (``None`` if it exited first)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("["):
            return line
    return None


def trace_phases(jobs: list[Job]) -> None:
    """Record each job's grant, hold and hand-back times in this driver (jobs run one
    after another, so the latest job is the one being reserved)."""
    from tpuslice._reserve import claim, reserve
    from tpuslice._run import run

    wait_for_grant = claim.Reserver._wait_for_grant
    reserve_slices = run.reserve_slices  # what a one-shot reserves through
    shutdown = reserve.SliceHandle.shutdown
    confirm_released = reserve.confirm_released
    wait_freed = reserve.wait_freed
    owner: dict[int, Job] = {}

    def traced_confirm(*args: Any, **kwargs: Any) -> None:
        begun = time.time()
        confirm_released(*args, **kwargs)
        if jobs:
            jobs[-1].confirm_s = time.time() - begun

    def traced_wait_freed(*args: Any, **kwargs: Any) -> bool:
        begun = time.time()
        freed: bool = wait_freed(*args, **kwargs)
        if jobs:
            jobs[-1].view_s = time.time() - begun
        return freed

    def traced_wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        granted = wait_for_grant(self, *args, **kwargs)
        if jobs:
            jobs[-1].granted = time.time()
        return granted

    def traced_reserve(*args: Any, **kwargs: Any) -> Any:
        spg = reserve_slices(*args, **kwargs)
        if jobs:
            jobs[-1].reserved = time.time()
            jobs[-1].slices_held = list(spg.slice_names)
            owner[id(spg)] = jobs[-1]
        return spg

    def traced_shutdown(self: Any) -> None:
        job = owner.pop(id(self), None)
        if job is not None:
            job.back_start = time.time()
        shutdown(self)
        if job is not None:
            job.back_end = time.time()

    claim.Reserver._wait_for_grant = traced_wait  # type: ignore[method-assign]
    run.reserve_slices = traced_reserve  # type: ignore[assignment]
    reserve.SliceHandle.shutdown = traced_shutdown  # type: ignore[method-assign]
    reserve.confirm_released = traced_confirm
    reserve.wait_freed = traced_wait_freed


def warm_every_host() -> None:
    """Start this driver's worker process on every TPU host (Ray's workers are per job),
    so the jobs do not pay for starting them: a real driver's would be long warm."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("TPU")]
    ray.get(
        [
            hold_task.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
            ).remote(0.0)
            for node in nodes
        ]
    )


def run_job(path: str, num_slices: int, hold: float, tenant: str | None = None) -> list[float]:
    if path in OURS:
        import tpuslice

        refs = tpuslice.run_on_slice(
            hold_task,
            hold,
            topology="4x4",
            accelerator_version="v6e",
            num_slices=num_slices,
            tenant=tenant,
        )
        return list(ray.get(refs))
    if path == "ray":
        from ray.util import tpu

        made: list[Any] = []

        class Recorded(tpu.SlicePlacementGroup):  # type: ignore[misc]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                made.append(self)

        tpu.SlicePlacementGroup = Recorded  # run_on_slice looks it up at each call
        refs = tpu.run_on_slice(
            hold_task, hold, topology="4x4", accelerator_version="v6e", num_slices=num_slices
        )
        try:
            return list(ray.get(refs))
        finally:
            for spg in made:  # its one-shot reservation leaks until the driver exits
                spg.shutdown()
    pg = placement_group(
        [{"TPU": CHIPS_PER_HOST}] * (HOSTS_PER_SLICE * num_slices), strategy="STRICT_SPREAD"
    )
    try:
        ray.get(pg.ready())
        refs = [
            hold_task.options(
                resources={"TPU": CHIPS_PER_HOST},
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, i),
            ).remote(hold)
            for i in range(HOSTS_PER_SLICE * num_slices)
        ]
        return list(ray.get(refs))
    finally:
        remove_placement_group(pg)


# --- the parent ------------------------------------------------------------------------------


class IdleSampler:
    """Reads the cluster's resources every ``period`` s. Adds up held-idle slice-seconds:
    slices whose head resource is taken while every TPU of theirs is free (claimed, no
    work on it), all of them, and those in spans of at least ``long_s`` (a request
    holding slices while it waits for more shows as such a span; the short ones are
    claims and hand-backs seen half-done, since each host's resources reach the GCS view
    on their own). And records, in :attr:`samples`, each reading's time and the slices
    wholly idle then (head resource free, no TPU in use on any host), for
    :func:`idle_while_waiting`."""

    def __init__(self, period: float = 0.05, long_s: float = 0.5) -> None:
        self.period = period
        self.long_s = long_s
        self.slice_seconds = 0.0
        self.long_slice_seconds = 0.0
        self.samples: list[tuple[float, int]] = []
        """``(time.time(), slices wholly idle)`` of each reading."""
        self._spans: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> IdleSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        for span in self._spans.values():
            self._end(span)

    def _end(self, span: float) -> None:
        if span >= self.long_s:
            self.long_slice_seconds += span

    def _run(self) -> None:
        nodes = {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}
        while not self._stop.wait(self.period):
            slices = self._read(nodes)
            now = time.time()
            idle = 0
            for name, hosts in slices.items():
                head_taken = any(h for h, _ in hosts)
                tpus_free = all(f for _, f in hosts)
                if tpus_free and not head_taken:
                    idle += 1
                if head_taken and tpus_free:
                    self.slice_seconds += self.period
                    self._spans[name] = self._spans.get(name, 0.0) + self.period
                elif name in self._spans:
                    self._end(self._spans.pop(name))
            self.samples.append((now, idle))

    @staticmethod
    def _read(nodes: Mapping[str, Any]) -> dict[str, list[tuple[bool, bool]]]:
        """Each slice's hosts, each as ``(head resource taken, every TPU free)``."""
        from tpuslice._tpu import _ray

        available = _ray.available_resources_per_node()
        slices: dict[str, list[tuple[bool, bool]]] = {}
        for node_id, node in nodes.items():
            name = node.get("Labels", {}).get("ray.io/tpu-slice-name")
            if not name:
                continue
            free = available.get(node_id, {})
            head = [r for r in node["Resources"] if r.startswith("TPU-") and r.endswith("-head")]
            head_taken = bool(head) and free.get(head[0], 0) < 1
            tpu_free = free.get("TPU", 0) >= node["Resources"].get("TPU", 0)
            slices.setdefault(name, []).append((head_taken, tpu_free))
        return slices


CPU_KINDS = (
    ("queue actor", "SliceQueueActor"),
    ("host agents", "HostAgent"),
    ("drivers", "bench_contention.py --child"),
    ("raylets", "raylet"),
    ("gcs", "gcs_server"),
    ("dashboard agents", "DashboardAgent"),
    ("dashboard agents", "dashboard/agent.py"),
    ("runtime env agents", "RuntimeEnvAgent"),
    ("runtime env agents", "runtime_env/agent"),
    ("dashboard", "dashboard/dashboard.py"),
    ("ray workers", "ray::"),
    ("cpu hog", HOG_CODE),
)


def cpu_by_kind() -> dict[int, tuple[str, float]]:
    """Every process's kind (by its command line; see ``CPU_KINDS``) and CPU seconds so far."""
    tick = os.sysconf("SC_CLK_TCK")
    found: dict[int, tuple[str, float]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kind = next((k for k, needle in CPU_KINDS if needle in cmd), "other")
        found[int(entry.name)] = (kind, (int(fields[11]) + int(fields[12])) / tick)
    return found


def cpu_spent(before: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds per kind since ``before`` (processes that ended meanwhile are missed)."""
    spent: dict[str, float] = {}
    for pid, (kind, seconds) in cpu_by_kind().items():
        earlier = before.get(pid)
        used = seconds - earlier[1] if earlier and earlier[0] == kind else seconds
        spent[kind] = spent.get(kind, 0.0) + used
    return {k: round(v, 1) for k, v in sorted(spent.items(), key=lambda kv: -kv[1])}


def compile_tpuslice() -> None:
    """Compile tpuslice's modules to bytecode, as installing a package does (Ray's came
    compiled): with ``PYTHONDONTWRITEBYTECODE`` set, as on this machine, every driver,
    worker and agent would otherwise compile them from source at each start."""
    import compileall

    import tpuslice

    compileall.compile_dir(os.path.dirname(tpuslice.__file__), quiet=1)


@contextlib.contextmanager
def cpu_hog() -> Iterator[None]:
    """A process spinning a busy loop on one core for the block's duration (another
    user's work on the machine); killed by its pid whatever ends the block."""
    hog = subprocess.Popen([sys.executable, "-c", HOG_CODE], stdin=subprocess.DEVNULL)
    try:
        yield
    finally:
        hog.kill()
        hog.wait()


def run_path(
    address: str,
    path: str,
    hold: float,
    jobs: int,
    err: Console,
    weights: Mapping[str, float] | None = None,
    exit_when_done: bool = False,
) -> PathResult:
    """Run one path's drivers; with ``weights``, the drivers are split between those
    tenants (:func:`driver_tenants`), whose quotas the caller has set; with
    ``exit_when_done``, each driver exits once its own jobs are done."""
    load_1m = os.getloadavg()[0]
    names = list(weights or {})
    dealt = driver_tenants(DRIVERS, len(names)) if names else []
    # Each driver's stderr goes to a file: a pipe nobody reads until the end would stop a
    # driver that logs more than it holds.
    files = contextlib.ExitStack()
    logs = [files.enter_context(tempfile.TemporaryFile("w+")) for _ in DRIVERS]  # noqa: SIM115  (closed below)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--child",
                "--address",
                address,
                "--path",
                base_path(path),
                "--driver",
                str(d),
                "--slices",
                str(n),
                "--hold",
                str(hold),
                "--jobs",
                str(jobs),
                *(["--tenant", names[dealt[d]]] if names else []),
                *(["--exit-when-done"] if exit_when_done else []),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        for (d, n), log in zip(enumerate(DRIVERS), logs, strict=True)
    ]

    def failed(proc: subprocess.Popen[str], log: Any, what: str) -> RuntimeError:
        log.seek(0)
        return RuntimeError(f"{path} driver {what}: {log.read()[-2000:]}")

    result = PathResult(path, weights=dict(weights or {}), load_1m=load_1m)
    try:
        for proc, log in zip(procs, logs, strict=True):  # every driver connected and warm
            assert proc.stdout is not None and proc.stdin is not None
            if proc.stdout.readline().strip() != "ready":
                raise failed(proc, log, "did not start")
        start_at = time.time() + 0.5
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(f"{start_at}\n")
            proc.stdin.flush()
        cpu_before = cpu_by_kind()
        deadline = time.monotonic() + PATH_TIMEOUT_S
        with IdleSampler() as sampler, ThreadPoolExecutor(len(procs)) as pool:
            reading = [pool.submit(driver_report, proc) for proc in procs]
            try:
                reports = [f.result(timeout=deadline - time.monotonic()) for f in reading]
            except BaseException:
                for proc in procs:  # ends the readers too
                    proc.kill()
                raise
        for proc, log, report in zip(procs, logs, reports, strict=True):
            proc.communicate(None if exit_when_done else "exit\n", timeout=60)
            if proc.returncode != 0 or report is None:
                raise failed(proc, log, "failed")
            result.jobs += [Job(**j) for j in json.loads(report)]
    finally:
        for proc in procs:  # none is left running, whatever failed
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        files.close()
    result.held_idle_slice_s = sampler.slice_seconds
    result.held_idle_long_slice_s = sampler.long_slice_seconds
    result.idle_samples = sampler.samples
    result.cpu_s = cpu_spent(cpu_before)
    err.print(f"{path}: {result.summary(hold, jobs)}")
    return result


def tenant_weights(ordinal: int) -> dict[str, float]:
    """The two-tenant path's tenants and weights; named afresh for each such path of a
    run, as the queue remembers each tenant's use for as long as it lives."""
    return {f"bench{ordinal}-w{w:g}": w for w in TENANT_WEIGHTS}


@contextlib.contextmanager
def quotas_set(weights: Mapping[str, float]) -> Iterator[None]:
    """The cluster's quotas for the two-tenant path: each tenant a weight and no slices,
    so both borrow (the same standing), on slices no quota covers (so their work need not
    be preemptible); the record is deleted after, so other paths queue as before."""
    from tpuslice._tpu import _ray
    from tpuslice._tpu.keys import NAMESPACE, QUOTAS_KEY
    from tpuslice._view.quotas import Quotas, TenantQuota

    quotas = Quotas({t: TenantQuota(weight=w) for t, w in weights.items()})
    _ray.kv_put(QUOTAS_KEY, quotas.to_json(), NAMESPACE)
    try:
        yield
    finally:
        _ray.kv_delete(QUOTAS_KEY, NAMESPACE)


def settle() -> None:
    from tpuslice.testing import live_placement_groups, remove_placement_groups

    deadline = time.time() + 30
    while live_placement_groups() and time.time() < deadline:
        remove_placement_groups()
        time.sleep(0.2)


def run_paths(paths: Sequence[str], args: argparse.Namespace, err: Console) -> list[dict[str, Any]]:
    """Run the paths in order, each group of them on a freshly started cluster of its
    own (:func:`cluster_groups`), and return each path's summary with its jobs."""
    from tpuslice.testing import SimulatedCluster

    summaries = []
    two_tenant_paths = itertools.count(1)
    for group in cluster_groups(paths):
        with SimulatedCluster(
            [("v6e", "4x4", SLICES)], cpus_per_host=args.host_cpus, connect=True
        ) as sim:
            err.print(f"cluster up in {sim.startup_seconds:.1f} s, for {', '.join(group)}")
            for path in group:
                weights = None
                with contextlib.ExitStack() as during:
                    if args.hog:
                        during.enter_context(cpu_hog())
                    if base_path(path) == TWO_TENANTS:
                        weights = tenant_weights(next(two_tenant_paths))
                        during.enter_context(quotas_set(weights))
                    result = run_path(
                        sim.address, path, args.hold, args.jobs, err, weights, args.exit_when_done
                    )
                summaries.append(
                    {
                        **result.summary(args.hold, args.jobs),
                        "jobs": [asdict(j) for j in result.jobs],
                    }
                )
                settle()
    return summaries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--hold", type=float, default=2.0)
    parser.add_argument("--jobs", type=int, default=JOBS_PER_DRIVER, help="jobs per driver")
    parser.add_argument(
        "--host-cpus", type=int, default=HOST_CPUS, help="logical CPUs of each simulated host"
    )
    parser.add_argument(
        "--exit-when-done",
        action="store_true",
        help="each driver exits once its own jobs are done (default: once every driver's are)",
    )
    parser.add_argument(
        "--hog", action="store_true", help="a busy loop on one core during each path"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tenant", help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--driver", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--slices", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args)
        return
    paths = args.paths.split(",")
    unknown = [p for p in paths if base_path(p) not in KNOWN_PATHS]
    if unknown:
        parser.error(
            f"unknown path(s) {', '.join(unknown)}; valid: {', '.join(KNOWN_PATHS)}, "
            f"each also as NAME{FRESH}"
        )
    compile_tpuslice()
    err = Console(stderr=True)
    err.print(f"load average at start: {os.getloadavg()}")
    summaries = run_paths(paths, args, err)
    fcfs = fcfs_schedule(args.hold, args.jobs)
    report = {
        "jobs_per_driver": args.jobs,
        "host_cpus": args.host_cpus,
        "exit_when_done": args.exit_when_done,
        "hog": args.hog,
        "ideal_makespan_s": ideal_makespan(args.hold, args.jobs),
        "fcfs": fcfs,
        "paths": summaries,
        "two_tenants": two_tenant_summary(summaries),
        "verdicts": verdicts(summaries),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for line in report_lines(report):
        print(line)


def report_lines(report: dict[str, Any]) -> list[str]:
    """The report in text: the FCFS model, a Markdown table of the paths, the verdicts
    and the two-tenant tables."""
    fcfs = report["fcfs"]
    lines = [
        f"{report['host_cpus']} CPUs per simulated host; drivers exit "
        + ("each when its jobs are done" if report["exit_when_done"] else "when all are done")
        + ("; a one-core CPU hog during each path" if report["hog"] else ""),
        f"ideal makespan {report['ideal_makespan_s']:.1f} s; strict FCFS with no overheads: "
        f"makespan {fcfs['makespan_s']:.1f} s, longest wait {fcfs['longest_wait_s']:.1f} s, "
        f"mean wait {fcfs['mean_wait_s']:.2f} s",
        "| path | load 1m | jobs done | failed | makespan | / ideal | longest wait | mean wait "
        "| held-idle slice-s (all) | (spans >= 0.5 s) | idle-while-waiting slice-s "
        "| FCFS replay | beyond | per slice handed over |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for s in report["paths"]:
        lines.append(
            f"| {s['path']} | {s['load_1m']:.2f} | {s['jobs_done']} | {s['jobs_failed']} | "
            f"{s['makespan_s']:.1f} s | {s['makespan_over_ideal']:.2f}x | "
            f"{s['longest_wait_s']:.1f} s | {s['mean_wait_s']:.2f} s | "
            f"{s['held_idle_slice_s']:.2f} | {s['held_idle_long_slice_s']:.2f} | "
            f"{s['iww_slice_s']:.2f} | {s['iww_replay_slice_s']:.2f} | "
            f"{s['iww_beyond_replay_slice_s']:.2f} | {s['iww_beyond_per_slice_s']:.3f} |"
        )
    lines += [f"{s['path']} failed: {error}" for s in report["paths"] for error in s["errors"]]
    lines += report["verdicts"]
    return lines + two_tenant_lines(report["two_tenants"])


def two_tenant_summary(summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each two-tenant path's split, and its makespan over the first ``ours`` path's."""
    ours = next((s for s in summaries if s["path"] == "ours"), None)
    out = []
    for s in summaries:
        if "tenants" not in s:
            continue
        over = s["makespan_s"] / ours["makespan_s"] if ours and ours["makespan_s"] else None
        out.append(
            {
                "path": s["path"],
                **s["tenants"],
                "makespan_s": s["makespan_s"],
                "ours_makespan_s": ours["makespan_s"] if ours else None,
                "makespan_over_ours": over,
            }
        )
    return out


def two_tenant_lines(found: list[dict[str, Any]]) -> list[str]:
    """The two-tenant paths' tables, in Markdown."""
    lines = []
    for t in found:
        lines += [
            "",
            f"{t['path']}: while every driver still had jobs to ask for "
            f"({t['window_s']:.1f} s), and over the whole path",
            "| tenant | weight | slice-s | share | weight share | ratio "
            "| whole path: slice-s | share | ratio |",
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|",
        ]
        for tenant, w in t["window"].items():
            a = t["whole_run"][tenant]
            lines.append(
                f"| {tenant} | {w['weight']:g} | {w['slice_s']:.1f} | {w['share']:.3f} | "
                f"{w['weight_share']:.3f} | {w['ratio']:.2f} | {a['slice_s']:.1f} | "
                f"{a['share']:.3f} | {a['ratio']:.2f} |"
            )
        over = t["makespan_over_ours"]
        lines += [
            f"Jain's index over share / weight share: {t['jain']:.3f} (whole path "
            f"{t['whole_run_jain']:.3f})",
            f"makespan {t['makespan_s']:.1f} s against ours {t['ours_makespan_s'] or 0:.1f} s"
            + (f" ({over:.2f}x)" if over is not None else " (ours not run)"),
        ]
    return lines


def floor_for(path: str, summaries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The floor a path is held against: of the same freshness (``floor-fresh`` for a
    ``-fresh`` path) if it ran, else the other; ``None`` if no floor ran."""
    floors = {s["path"]: s for s in summaries if base_path(s["path"]) == "floor"}
    fresh, stale = floors.get("floor" + FRESH), floors.get("floor")
    return (fresh or stale) if path.endswith(FRESH) else (stale or fresh)


def verdicts(summaries: list[dict[str, Any]]) -> list[str]:
    """Each tpuslice path but the two-tenant one (fair share is not FCFS) against the
    targets: makespan and longest wait against the floor's (:func:`floor_for`), each
    job's wait against the FCFS replay plus :data:`FCFS_SLACK_S`, and idle-while-waiting
    beyond the replay's per slice handed over against :data:`IWW_TARGET`."""
    lines = []
    for s in summaries:
        if base_path(s["path"]) not in OURS or base_path(s["path"]) == TWO_TENANTS:
            continue
        name = s["path"]
        floor = floor_for(name, summaries)
        if floor is not None:
            ratio = s["makespan_s"] / floor["makespan_s"]
            lines.append(
                f"{_met(ratio <= MAKESPAN_TARGET)} {name}: makespan {ratio:.2f}x {floor['path']}'s"
                f" (goal <= {MAKESPAN_TARGET}x)"
            )
            lines.append(
                f"{_met(s['longest_wait_s'] <= floor['longest_wait_s'])} {name}: longest wait "
                f"{s['longest_wait_s']:.1f} s (goal <= {floor['path']}'s "
                f"{floor['longest_wait_s']:.1f} s)"
            )
        lines.append(
            f"{_met(s['beyond_fcfs_s'] <= FCFS_SLACK_S)} {name}: at most "
            f"{s['beyond_fcfs_s']:.1f} s beyond strict FCFS with no overheads on the run's own "
            f"arrivals and job lengths, submits within {TIE_S * 1000:.0f} ms taken in the run's "
            f"order (goal <= {FCFS_SLACK_S:.0f} s; worst: {s['beyond_fcfs_job']})"
        )
        lines.append(
            f"{_met(s['iww_beyond_per_slice_s'] < IWW_TARGET)} {name}: idle while waiting "
            f"{s['iww_beyond_replay_slice_s']:.2f} slice-s beyond the FCFS replay's, "
            f"{s['iww_beyond_per_slice_s']:.3f} per slice handed over "
            f"(goal < {IWW_TARGET:g} slice-second per slice handed over)"
        )
    return lines


def _met(ok: bool) -> str:
    return "met   " if ok else "MISSED"


if __name__ == "__main__":
    main()
