"""Waiting at scale: the cluster-wide queue with 1, 10 and 100 waiters on 10,000 TPU hosts.
Run by hand (not a test; pure, no Ray cluster is started):

    python benchmarks/bench_queue_scale.py [--duration 10]
        [--waiters 1,10,100] [--designs event,event-read,polling] [--seed 0] [--json]

An InMemoryCluster of 2,500 v6e 4x4 slices (10,000 hosts), every slice held by another
user at the start. Per design and waiter count W, on an asyncio loop in this process, in
real time, for ``--duration`` seconds:

- W drivers, each in a loop: enqueue a ticket for one v6e 4x4 slice, ask until granted
  (asks of 10 s), take the slice (busy again: its work runs until the releaser ends it),
  report it claimed, enqueue again.
- A releaser: every 50-100 ms, if more drivers ask than there are handed-back slices not
  yet granted (so no slice sits idle with nobody waiting for it), ends the work on a
  random busy slice (another user's or a driver's): removes its group, then reports the
  hand-back (``released``).

Reported: grants per second; cluster reads per second, each a snapshot of all 10,000
hosts (median time per read: CPU shared with the loop, on a shared 2-core machine);
calls to the queue (enqueue, ask, claimed, released) per second and per grant; and for
every grant of a slice handed back while its driver was asking, the time from the
hand-back to the answer reaching the driver (median, p95, max). Grants of a slice that was
already idle when its driver asked are counted apart (``at once``).

Designs:

- ``event``: :class:`~tpuslice._reserve.queue.service.QueueService` driven by
  :class:`~tpuslice._reserve.queue.runner.QueueRunner`, as the queue actor runs them: asks held,
  decisions on changes (reads in a thread), periodic looks while anyone waits; a slice
  handed back free is granted from the last read before the next one (as a hand-back
  that saw Ray's view show its slices free reports them).
- ``event-read``: the same, with every hand-back reported as not seen free, so each
  grant of a handed-back slice waits for a read of the cluster.
- ``polling``: an EMULATION of the old design, not its code: each driver polls every
  50 ms; a poll decides first if the last decision is older than 50 ms and none is under
  way (its read in a thread, as a threaded actor would; the other polls meanwhile are
  answered from the last decision), then answers. The same QueueService does the reads
  and the policy, so only the driving differs.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol

from rich.console import Console
from rich.table import Table

from tpuslice._reserve.queue.book import Answer, Granted, Waiting
from tpuslice._reserve.queue.runner import QueueRunner
from tpuslice._reserve.queue.service import QueueService, SliceKind, Ticket
from tpuslice._tpu.topology import slice_shape
from tpuslice._view.cluster import ClusterSnapshot
from tpuslice.testing.memory import InMemoryCluster, MemoryGroup

SLICES = 2_500
KIND = SliceKind(slice_shape("4x4", "v6e"), 1)
ASK_S = 10.0
"""How long an ask is held (the event design)."""
POLL_S = 0.05
"""The emulated old design's poll period, and the age at which a poll decides."""
TICK_S = (0.05, 0.1)
"""The releaser's period: uniform in this range."""
DESIGNS = ("event", "event-read", "polling")


class Busy:
    """The cluster, and the group holding each busy slice (another user's or a driver's)."""

    def __init__(self, cluster: InMemoryCluster) -> None:
        self.cluster = cluster
        self.groups: dict[str, MemoryGroup] = {}
        self.hold_all()

    def hold(self, name: str) -> None:
        """Someone takes a slice (every TPU of its first host: the slice shows busy)."""
        if name in self.groups:
            raise AssertionError(f"slice {name} was granted while it is held")
        chips = KIND.shape.chips_per_host
        self.groups[name] = self.cluster.take(name, 0, {"TPU": chips})

    def hold_all(self) -> None:
        """Make every slice busy again (between runs)."""
        for name in sorted(self.cluster.slice_hosts):
            if name not in self.groups:
                self.hold(name)

    def end_one(self, rng: random.Random) -> str:
        """The work on a random busy slice ends; returns the slice."""
        name = rng.choice(sorted(self.groups))
        self.cluster.remove_group(self.groups.pop(name))
        return name


class TimedReads:
    """The service's snapshot function: the cluster's own, timed."""

    def __init__(self, cluster: InMemoryCluster) -> None:
        self.cluster = cluster
        self.seconds: list[float] = []

    def __call__(self, per_chip: int) -> ClusterSnapshot:
        started = time.perf_counter()
        snapshot = self.cluster.snapshot(per_chip)
        self.seconds.append(time.perf_counter() - started)
        return snapshot


class Front(Protocol):
    """What drivers and the releaser call: the queue of one design."""

    service: QueueService

    @property
    def calls(self) -> int: ...

    async def enqueue(self, ticket: Ticket) -> None: ...

    async def ask(self, ticket: str) -> Answer: ...

    async def claimed(self, ticket: str) -> None: ...

    async def released(self, name: str) -> None: ...

    def stop(self) -> None: ...


class EventFront:
    """The event design: a runner holds each ask until its answer changes."""

    def __init__(self, service: QueueService, *, freed: bool = True) -> None:
        self.service = service
        self.runner = QueueRunner(service)
        self._freed = freed

    @property
    def calls(self) -> int:
        return self.runner.calls

    async def enqueue(self, ticket: Ticket) -> None:
        await self.runner.enqueue(ticket)

    async def ask(self, ticket: str) -> Answer:
        return await self.runner.wait(ticket, ASK_S)

    async def claimed(self, ticket: str) -> None:
        await self.runner.claimed(ticket)

    async def released(self, name: str) -> None:
        await self.runner.released([name], freed=self._freed)

    def stop(self) -> None:
        self.runner.stop()


class PollingFront:
    """The old design, emulated: every call is answered at once, from the last decision;
    a poll first decides (reading in a thread, one decision at a time) if the last
    decision is older than POLL_S; a driver told Waiting polls again after POLL_S."""

    def __init__(self, service: QueueService) -> None:
        self.service = service
        self._calls = 0
        self._decided = -math.inf
        self._deciding = False

    @property
    def calls(self) -> int:
        return self._calls

    async def enqueue(self, ticket: Ticket) -> None:
        self._calls += 1
        self.service.enqueue(ticket)

    async def ask(self, ticket: str) -> Answer:
        self._calls += 1
        if not self._deciding and time.monotonic() - self._decided >= POLL_S:
            await self._decide()
        answer = self.service.answer(ticket)
        if isinstance(answer, Waiting):
            await asyncio.sleep(POLL_S)
        return answer

    async def claimed(self, ticket: str) -> None:
        self._calls += 1
        self.service.claimed(ticket)

    async def released(self, name: str) -> None:
        self._calls += 1
        self.service.released([name])

    def stop(self) -> None:
        """Nothing runs between calls."""

    async def _decide(self) -> None:
        self._deciding = True
        try:
            self.service.apply(await asyncio.to_thread(self.service.reader()))
        finally:
            self._deciding = False
            self._decided = time.monotonic()


@dataclass
class Log:
    """What a run saw: hand-backs, asks in flight, grants and their latencies."""

    freed: dict[str, float] = field(default_factory=dict)
    """Slice -> when its hand-back was reported (until it is granted)."""
    asking: int = 0
    grants: int = 0
    at_once: int = 0
    latencies: list[float] = field(default_factory=list)

    def wanted(self) -> bool:
        """Whether some asking driver has no handed-back slice waiting for it."""
        return self.asking > len(self.freed)

    def granted(self, name: str, asked: float) -> None:
        """A grant of ``name`` reached a driver that started asking at ``asked``."""
        freed = self.freed.pop(name)
        self.grants += 1
        if freed >= asked:
            self.latencies.append(time.monotonic() - freed)
        else:
            self.at_once += 1


async def drive(front: Front, busy: Busy, log: Log, index: int) -> None:
    """One driver in steady state: enqueue, ask until granted, hold, claim, again."""
    for turn in itertools.count():
        ticket = f"driver-{index}-{turn}"
        await front.enqueue(Ticket(ticket, KIND, (1, 1), 0, f"driver {index}", ""))
        asked = time.monotonic()
        log.asking += 1
        answer: Answer = Waiting(0, (), "not asked yet")
        while isinstance(answer, Waiting):
            answer = await front.ask(ticket)
        log.asking -= 1
        if not isinstance(answer, Granted):
            raise AssertionError(f"{ticket} was answered {answer}")
        log.granted(answer.slices[0], asked)
        busy.hold(answer.slices[0])
        await front.claimed(ticket)


async def release(front: Front, busy: Busy, log: Log, until: float, rng: random.Random) -> None:
    """End the work on a busy slice every 50-100 ms while a driver wants one, until
    ``until`` (monotonic seconds)."""
    while time.monotonic() < until:
        await asyncio.sleep(rng.uniform(*TICK_S))
        if log.wanted():
            name = busy.end_one(rng)
            log.freed[name] = time.monotonic()
            await front.released(name)


@dataclass
class Result:
    """One run's counts, and its times in milliseconds (NaN where nothing was seen)."""

    design: str
    waiters: int
    seconds: float
    grants: int
    reads: int
    calls: int
    read_ms_median: float = math.nan
    after_hand_back: int = 0
    at_once: int = 0
    latency_ms_median: float = math.nan
    latency_ms_p95: float = math.nan
    latency_ms_max: float = math.nan

    def per_s(self, count: int) -> float:
        return count / self.seconds

    def timed(self, latencies: Sequence[float], reads: Sequence[float], at_once: int) -> Result:
        """This result with the latencies (hand-back to grant) and read times, in seconds."""
        ms = [s * 1000 for s in latencies]
        self.read_ms_median = statistics.median(reads) * 1000 if reads else math.nan
        self.after_hand_back, self.at_once = len(ms), at_once
        if ms:
            self.latency_ms_median = statistics.median(ms)
            self.latency_ms_p95 = percentile(ms, 0.95)
            self.latency_ms_max = max(ms)
        return self


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (NaN when there are none)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


async def measure(design: str, waiters: int, seconds: float, busy: Busy, seed: int) -> Result:
    """One run of the scenario (module docstring) for one design and waiter count."""
    reads = TimedReads(busy.cluster)
    front: Front
    if design.startswith("event"):
        front = EventFront(QueueService(reads), freed=design == "event")
    else:
        front = PollingFront(QueueService(reads))
    log = Log()
    drivers = [asyncio.ensure_future(drive(front, busy, log, i)) for i in range(waiters)]
    started = time.monotonic()
    await release(front, busy, log, started + seconds, random.Random(seed))
    elapsed = time.monotonic() - started
    result = summary(design, waiters, elapsed, (log.grants, front.service.reads, front.calls))
    await stopped(drivers)
    front.stop()
    return result.timed(log.latencies, reads.seconds, log.at_once)


async def stopped(drivers: Sequence[asyncio.Future[None]]) -> None:
    """Cancel the drivers; raise what any of them failed with meanwhile. A cancel can
    be lost in Python 3.11's ``asyncio.wait_for`` when the awaited ask is answered at
    the same moment (the driver then asks again), so the drivers are cancelled until
    every one has stopped."""
    pending = [task for task in drivers if not task.done()]
    while pending:
        for task in pending:
            task.cancel()
        await asyncio.wait(pending, timeout=0.5)
        pending = [task for task in pending if not task.done()]
    for outcome in await asyncio.gather(*drivers, return_exceptions=True):
        if isinstance(outcome, Exception):
            raise outcome


def summary(design: str, waiters: int, seconds: float, counts: tuple[int, int, int]) -> Result:
    grants, reads, calls = counts
    return Result(design, waiters, seconds, grants=grants, reads=reads, calls=calls)


def run(designs: Sequence[str], waiters: Sequence[int], seconds: float, seed: int) -> list[Result]:
    """Every design at every waiter count, each on the same cluster made busy again."""
    busy = Busy(InMemoryCluster([("v6e", "4x4", SLICES)]))
    results = []
    for design in designs:
        for count in waiters:
            busy.hold_all()
            results.append(asyncio.run(measure(design, count, seconds, busy, seed)))
    return results


def table(results: Sequence[Result]) -> Table:
    hosts = SLICES * KIND.shape.num_hosts
    title = f"Waiting at scale: {SLICES:,} slices of v6e 4x4 ({hosts:,} hosts), real time"
    out = Table(title=title, title_justify="left")
    columns = ("design", "waiters", "grants/s", "reads/s", "read ms", "calls/s", "calls/grant")
    for column in (*columns, "measured", "at once", "median ms", "p95 ms", "max ms"):
        out.add_column(column, justify="left" if column == "design" else "right")
    for r in results:
        per_grant = r.calls / r.grants if r.grants else math.nan
        out.add_row(
            "polling (emulated)" if r.design == "polling" else r.design,
            str(r.waiters),
            f"{r.per_s(r.grants):.1f}",
            f"{r.per_s(r.reads):.1f}",
            f"{r.read_ms_median:.0f}",
            f"{r.per_s(r.calls):.1f}",
            f"{per_grant:.1f}",
            str(r.after_hand_back),
            str(r.at_once),
            *(f"{v:.0f}" for v in (r.latency_ms_median, r.latency_ms_p95, r.latency_ms_max)),
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per run")
    parser.add_argument("--waiters", default="1,10,100", help="waiter counts, comma-separated")
    parser.add_argument(
        "--designs", default=",".join(DESIGNS), help="event, event-read and/or polling"
    )
    parser.add_argument("--seed", type=int, default=0, help="the releaser's random seed")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    designs = args.designs.split(",")
    if not set(designs) <= set(DESIGNS) or args.duration <= 0:
        parser.error(f"--designs must be among {', '.join(DESIGNS)}; --duration positive")
    waiters = [int(w) for w in args.waiters.split(",")]
    results = run(designs, waiters, args.duration, args.seed)
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
        return
    Console().print(table(results))


if __name__ == "__main__":
    main()
