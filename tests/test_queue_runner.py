"""The queue's event loop (QueueRunner) on an in-memory cluster, in real time. Pure.

An ask is held until its ticket is granted, can never be, or leaves, and is answered as
soon as the decision that grants it is made; a hand-back is decided at once, with no
periodic look; cluster reads follow the changes, not the number of waiters; order,
dead drivers and an unreadable cluster are handled through the runner. Each test runs
its own loop (``asyncio.run``) and waits for what it expects with a bound; the one fixed
wait is the idle test's window of observation, timed from the periodic looks it saw.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable, Collection, Coroutine
from typing import Any

import pytest

from tpuslice._reserve.queue import runner as queue_runner
from tpuslice._reserve.queue.book import Answer, Granted, Never, Unknown, Waiting
from tpuslice._reserve.queue.runner import QueueRunner
from tpuslice._reserve.queue.service import QueueService, SliceKind, Ticket
from tpuslice._tpu.topology import slice_shape
from tpuslice._view.cluster import ClusterSnapshot
from tpuslice.testing.memory import InMemoryCluster, MemoryGroup

SLICE = SliceKind(slice_shape("4x4", "v6e"), 1)
QUIET_S = 60.0
"""A period of decisions no test lasts: only an event can make a decision."""
ASK_S = 30.0
"""How long asks are held: longer than any test, so an early answer is the runner's."""
BOUND_S = 5.0
"""How long a test waits for what should happen at once, before it fails."""


def ticket(name: str, *, count: int = 1, priority: int = 0, job: str = "") -> Ticket:
    return Ticket(name, SLICE, (count, count), priority, f"pid {name}", job)


def run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run a scenario on a fresh loop, bounded so a lost answer fails instead of hanging."""

    async def bounded() -> None:
        await asyncio.wait_for(scenario(), 4 * BOUND_S)

    asyncio.run(bounded())


async def until(condition: Callable[[], bool], within_s: float = BOUND_S) -> float:
    """Yield to the loop until ``condition`` holds; returns the seconds it took.

    Raises:
        AssertionError: it did not hold within ``within_s``.
    """
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < within_s, "the condition did not hold in time"
        await asyncio.sleep(0.005)
    return time.monotonic() - started


class Slices:
    """An in-memory cluster whose every slice another user holds, and a runner over it on
    real monotonic time (the cluster's FakeClock never moves on its own).

    Args:
        count: How many v6e 4x4 slices.
        every_s: The service's ``decide_every_s``.
        snapshot: Reads the cluster (default: the cluster's own snapshot).
        clock: The service's monotonic seconds.
    """

    def __init__(
        self,
        count: int,
        *,
        every_s: float = QUIET_S,
        snapshot: Callable[[int], ClusterSnapshot] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cluster = InMemoryCluster([("v6e", "4x4", count)])
        self.names = sorted(self.cluster.slice_hosts)
        self.held = {name: self._take(name) for name in self.names}
        self.dead: set[str] = set()
        self.service = QueueService(
            snapshot or self.cluster.snapshot,
            dead_jobs=self._dead_of,
            clock=clock,
            decide_every_s=every_s,
        )
        self.runner = QueueRunner(self.service)
        self.asks = 0
        self.calls = 0

    async def free(self, name: str) -> None:
        """The other user's work on ``name`` ends and its hand-back is reported."""
        self.cluster.remove_group(self.held.pop(name))
        self.calls += 1
        await self.runner.released([name])

    async def enqueue(self, entry: Ticket) -> None:
        self.calls += 1
        await self.runner.enqueue(entry)

    async def ask(self, name: str) -> Answer:
        """Ask, again while the answer is Waiting: a driver waiting for its grant."""
        while True:
            self.asks += 1
            self.calls += 1
            answer = await self.runner.wait(name, ASK_S)
            if not isinstance(answer, Waiting):
                return answer
            await asyncio.sleep(0)  # an ask answered at once must not starve the loop

    async def claim(self, name: str, answer: Answer) -> str:
        """Hold the granted slice (busy again) and report it claimed; returns its name."""
        assert isinstance(answer, Granted), answer
        (granted,) = answer.slices
        self.held[granted] = self._take(granted)
        self.calls += 1
        await self.runner.claimed(name)
        return granted

    async def settled(self) -> None:
        """Until no decision is due: every change so far has been decided."""
        await until(lambda: not self.service.due())

    def _take(self, name: str) -> MemoryGroup:
        return self.cluster.take(name, 0, {"TPU": SLICE.shape.chips_per_host})

    def _dead_of(self, jobs: Collection[str]) -> set[str]:
        return set(jobs) & self.dead


def test_an_ask_is_held_until_a_hand_back_and_answered_with_the_slice_at_once() -> None:
    async def scenario() -> None:
        slices = Slices(1)
        await slices.enqueue(ticket("a"))
        ask = asyncio.ensure_future(slices.ask("a"))
        await slices.settled()
        with pytest.raises(asyncio.TimeoutError):  # the slice is busy: the ask is held
            await asyncio.wait_for(asyncio.shield(ask), 0.2)
        await slices.free(slices.names[0])
        answer = await asyncio.wait_for(ask, BOUND_S)  # long before any periodic look
        assert isinstance(answer, Granted)
        assert answer.view[0].name == slices.names[0]
        assert slices.asks == 1

    run(scenario)


async def served_in_turn(waiters: int, frees: int) -> Slices:
    """``waiters`` drivers in steady state (enqueue, ask until granted, claim, enqueue
    again); ``frees`` slices are freed one at a time, each once the last grant is claimed
    and decided. Returns the world, for its counts."""
    slices = Slices(frees)
    grants: asyncio.Queue[str] = asyncio.Queue()

    async def serve(driver: str) -> None:
        for turn in itertools.count():
            name = f"{driver}/{turn}"
            await slices.enqueue(ticket(name))
            grants.put_nowait(await slices.claim(name, await slices.ask(name)))

    drivers = [asyncio.ensure_future(serve(f"d{i}")) for i in range(waiters)]
    await slices.settled()
    for name in slices.names:
        await slices.free(name)
        assert await asyncio.wait_for(grants.get(), BOUND_S) == name
        await slices.settled()
    assert grants.empty() and not any(d.done() for d in drivers)
    return slices


def test_reads_do_not_grow_with_waiters_and_each_ask_is_answered_by_its_grant() -> None:
    frees = 3
    one = asyncio.run(served_in_turn(1, frees))
    many = asyncio.run(served_in_turn(100, frees))
    # A read follows a change, never a waiter: the first enqueue, then per freed slice
    # its hand-back, the claim of its grant and the next enqueue. How many of those
    # coalesce into one read depends on thread timing, so the bound is the changes' count;
    # a read per waiter would be over a hundred.
    changes = 1 + 3 * frees
    assert one.service.reads <= changes
    assert many.service.reads <= changes
    for world, waiters in ((one, 1), (many, 100)):
        assert world.asks == waiters + frees  # one ask per waiter, and one per grant
        assert world.runner.calls == world.calls  # the runner counts every driver call


def test_an_ask_returns_at_its_timeout_with_its_place() -> None:
    async def scenario() -> None:
        slices = Slices(1)
        await slices.enqueue(ticket("first"))
        await slices.enqueue(ticket("second"))
        await slices.settled()
        started = time.monotonic()
        answer = await asyncio.wait_for(slices.runner.wait("second", 0.3), BOUND_S)
        assert time.monotonic() - started >= 0.3 - 0.01  # held for its time (clock ticks)
        assert isinstance(answer, Waiting)
        assert (answer.position, len(answer.ahead)) == (2, 1)
        assert "pid first" in answer.ahead[0]

    run(scenario)


def test_an_ask_that_can_never_be_granted_or_is_unknown_is_answered_at_once() -> None:
    async def scenario() -> None:
        slices = Slices(1)
        await slices.enqueue(ticket("huge", count=2))
        never = await asyncio.wait_for(slices.ask("huge"), BOUND_S)
        unknown = await asyncio.wait_for(slices.ask("nobody"), BOUND_S)
        assert isinstance(never, Never) and isinstance(unknown, Unknown)

    run(scenario)


def test_priority_then_arrival_order_is_kept_through_held_asks() -> None:
    async def scenario() -> None:
        slices = Slices(2)
        for entry in (ticket("a"), ticket("b"), ticket("urgent", priority=1)):
            await slices.enqueue(entry)
        asks = {name: asyncio.ensure_future(slices.ask(name)) for name in ("a", "b", "urgent")}
        await slices.settled()
        order = []
        for name in slices.names:
            await slices.free(name)
            done, _ = await asyncio.wait(
                [a for a in asks.values() if not a.done()],
                timeout=BOUND_S,
                return_when=asyncio.FIRST_COMPLETED,
            )
            (granted,) = [n for n, a in asks.items() if a in done]
            order.append((granted, await slices.claim(granted, asks[granted].result())))
            await slices.settled()
        assert order == [("urgent", slices.names[0]), ("a", slices.names[1])]
        assert not asks["b"].done()

    run(scenario)


def test_a_waiter_whose_driver_died_leaves_while_asking_and_the_next_is_granted() -> None:
    async def scenario() -> None:
        slices = Slices(1, every_s=0.05)  # the job table is looked at now and then
        await slices.enqueue(ticket("gone", job="dead-job"))
        await slices.enqueue(ticket("next", job="live-job"))
        gone = asyncio.ensure_future(slices.ask("gone"))
        waiting = asyncio.ensure_future(slices.ask("next"))
        await slices.settled()
        slices.dead.add("dead-job")
        assert isinstance(await asyncio.wait_for(gone, BOUND_S), Unknown)  # it left
        await slices.free(slices.names[0])
        answer = await asyncio.wait_for(waiting, BOUND_S)
        assert isinstance(answer, Granted) and answer.slices == (slices.names[0],)

    run(scenario)


def test_a_held_ask_keeps_its_lease_while_a_quiet_waiter_loses_it() -> None:
    """Time jumps past the lease; the decision the hand-back makes drops the waiter that
    is not asking and grants the one whose ask the runner holds."""
    skew = [0.0]

    async def scenario() -> None:
        slices = Slices(1, clock=lambda: time.monotonic() + skew[0])
        await slices.enqueue(ticket("quiet"))
        await slices.enqueue(ticket("asking"))
        ask = asyncio.ensure_future(slices.ask("asking"))
        await slices.settled()
        skew[0] += 2 * slices.service.book.lease_s
        await slices.free(slices.names[0])
        answer = await asyncio.wait_for(ask, BOUND_S)
        assert isinstance(answer, Granted) and answer.slices == (slices.names[0],)
        assert isinstance(await slices.runner.wait("quiet", 0), Unknown)

    run(scenario)


def test_a_decision_whose_read_fails_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queue_runner, "RETRY_S", 0.01)

    def unreadable() -> None:
        raise ConnectionError("the GCS did not answer")

    async def scenario() -> None:
        slices = Slices(1)
        slices.cluster.script("snapshot", 1, unreadable)
        await slices.enqueue(ticket("a"))
        await slices.free(slices.names[0])
        answer = await asyncio.wait_for(slices.ask("a"), BOUND_S)
        assert isinstance(answer, Granted) and answer.view[0].name == slices.names[0]
        assert slices.cluster.calls["snapshot"] == 2  # the failed read, then its retry

    run(scenario)


def test_no_one_waiting_and_nothing_changing_reads_nothing() -> None:
    """Periodic looks happen while anyone waits (timed here), and stop when the last
    waiter leaves: the same time again passes with no read."""

    async def scenario() -> None:
        slices = Slices(1, every_s=0.01)
        await slices.enqueue(ticket("a"))
        await slices.settled()
        looks = slices.service.reads + 5
        window = await until(lambda: slices.service.reads >= looks)
        await slices.runner.leave("a")
        await slices.settled()
        idle = slices.service.reads
        await asyncio.sleep(2 * window)  # an observation window, not a synchronisation
        assert slices.service.reads == idle

    run(scenario)


class HeldRead:
    """A snapshot function whose ``nth`` read, once it has looked, waits to be let go:
    the test changes the cluster while a decision's read is in flight."""

    def __init__(self, nth: int) -> None:
        self.nth = nth
        self.looked = threading.Event()
        self.go = threading.Event()
        self.slices: Slices | None = None

    def snapshot(self, per_chip: int) -> ClusterSnapshot:
        assert self.slices is not None
        seen = self.slices.cluster.snapshot(per_chip)
        if self.slices.cluster.calls["snapshot"] == self.nth:
            self.looked.set()
            self.go.wait(BOUND_S)
        return seen


def test_a_hand_back_during_a_read_is_decided_again_at_once() -> None:
    async def scenario() -> None:
        held = HeldRead(nth=2)
        slices = held.slices = Slices(1, snapshot=held.snapshot)
        await slices.enqueue(ticket("a"))
        ask = asyncio.ensure_future(slices.ask("a"))
        await slices.settled()
        await slices.enqueue(ticket("b"))  # a decision: its read looks, then is held
        try:
            await until(held.looked.is_set)
            await slices.free(slices.names[0])  # after the look: that read saw it busy
        finally:
            held.go.set()
        answer = await asyncio.wait_for(ask, 0.5)
        assert isinstance(answer, Granted)

    run(scenario)
