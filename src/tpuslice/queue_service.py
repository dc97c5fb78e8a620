"""The cluster-wide queue as a service (issue 15), without Ray: what the queue actor runs.

:class:`QueueService` keeps a :class:`~tpuslice.queue_book.QueueBook`, learns each kind of
slice from the requests that wait for it (:class:`SliceKind`), and, when a waiter polls
and the last decision is older than ``decide_every_s`` (or the queue changed), reads the
cluster through an injected ``snapshot`` function and decides again. The cluster is the
truth about what is held: every busy slice of a kind is running work, so after a restart
nothing needs rebuilding but the waiters, who enqueue again with their arrival numbers.

A waiter whose driver has died leaves as soon as ``dead_jobs`` (Ray's job table, on the
actor) says so; one that merely stops polling leaves after the book's lease.
Each decision is handed to ``publish`` as a :class:`~tpuslice.queue_record.QueueRecord`,
for status and for drivers deciding whether to queue at all.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, replace
from typing import Protocol

from tpuslice.cluster import ClusterSnapshot, SliceState
from tpuslice.queue_book import LEASE_S, Answer, QueueBook, Waiting
from tpuslice.queue_record import QueuedRequest, QueueRecord
from tpuslice.schedule import Holding, Waiter
from tpuslice.topology import SliceShape

USUAL_CHIPS_PER_HOST = 4
DECIDE_EVERY_S = 0.05
"""A poll decides again if the last decision is older than this (or the queue changed)."""
DEAD_CHECK_S = 0.3
"""Tickets not polled for this long have their drivers' jobs looked up (dead: they go)."""


@dataclass(frozen=True)
class SliceKind:
    """The slices that can serve a request: one shape, on a cluster's ``TPU`` units.

    Attributes:
        shape: The slice shape.
        tpu_resource_per_chip: The cluster's ``TPU`` units per chip.
    """

    shape: SliceShape
    tpu_resource_per_chip: int

    @property
    def key(self) -> str:
        """``v6e-16 4x4`` (with the chips per host or units per chip when not usual)."""
        key = f"{self.shape.pod_type} {self.shape.topology}"
        if self.shape.chips_per_host != USUAL_CHIPS_PER_HOST:
            key += f" ({self.shape.chips_per_host} chips/host)"
        if self.tpu_resource_per_chip != 1:
            key += f" (TPU x{self.tpu_resource_per_chip})"
        return key


@dataclass(frozen=True)
class Ticket:
    """What a driver sends to enqueue.

    Attributes:
        ticket: Its id (unique per reservation).
        kind: The slices it waits for.
        count: ``(min, max)`` slices.
        priority: Higher first.
        who: The driver, for status (``pid 12 on host-a``).
        job: The Ray job id (hex) of the driver, so the queue learns if it dies.
    """

    ticket: str
    kind: SliceKind
    count: tuple[int, int]
    priority: int
    who: str
    job: str


class SliceQueue(Protocol):
    """What a reserving driver asks of the queue (the actor's handle, or a service in
    memory). Calls raise :class:`~tpuslice.errors.QueueUnreachableError` when it cannot
    be reached."""

    def enqueue(self, ticket: Ticket, arrival: int | None = None) -> int:
        """Wait in the queue.

        Args:
            ticket: The request.
            arrival: Its original arrival number, to keep its place after a restart.

        Returns:
            Its arrival number.
        """
        ...

    def poll(self, ticket: str) -> Answer:
        """Where a ticket stands.

        Args:
            ticket: The ticket.

        Returns:
            The answer.
        """
        ...

    def claimed(self, ticket: str) -> None:
        """The grant is held.

        Args:
            ticket: The ticket.
        """
        ...

    def leave(self, ticket: str) -> None:
        """Give up waiting.

        Args:
            ticket: The ticket.
        """
        ...


class QueueService:
    """One queue for every kind of slice (see the module docstring).

    Args:
        snapshot: Reads the cluster, given the ``TPU`` units per chip.
        publish: Receives the record after each decision.
        dead_jobs: Of the job ids given, those that are dead.
        clock: Monotonic seconds.
        stamp: Wall-clock nanoseconds (arrival numbers).
        wall: Wall-clock seconds (for records).
        lease_s: See :data:`~tpuslice.queue_book.LEASE_S`.
        decide_every_s: See :data:`DECIDE_EVERY_S`.
    """

    def __init__(
        self,
        snapshot: Callable[[int], ClusterSnapshot],
        *,
        publish: Callable[[QueueRecord], None] = lambda record: None,
        dead_jobs: Callable[[Collection[str]], Collection[str]] = lambda jobs: (),
        clock: Callable[[], float] = time.monotonic,
        stamp: Callable[[], int] = time.time_ns,
        wall: Callable[[], float] = time.time,
        lease_s: float = LEASE_S,
        decide_every_s: float = DECIDE_EVERY_S,
    ) -> None:
        self.book = QueueBook(clock, stamp, lease_s=lease_s)
        self._snapshot = snapshot
        self._publish = publish
        self._dead_jobs = dead_jobs
        self._clock = clock
        self._wall = wall
        self._every = decide_every_s
        self._tickets: dict[str, Ticket] = {}
        self._kinds: dict[str, SliceKind] = {}
        self._decided = -float("inf")
        self._dead_checked = -float("inf")

    def enqueue(self, ticket: Ticket, arrival: int | None = None) -> int:
        """Add a waiter (again, after a restart, with its arrival number).

        Args:
            ticket: The request.
            arrival: Its original arrival number, to keep its place.

        Returns:
            Its arrival number.

        Raises:
            InvalidArgumentError: the ticket is already queued, or its count is invalid.
        """
        waiter = Waiter(ticket.ticket, ticket.kind.key, ticket.count, ticket.priority)
        number = self.book.enqueue(waiter, ticket.who, arrival=arrival)
        self._tickets[ticket.ticket] = ticket
        self._kinds.setdefault(ticket.kind.key, ticket.kind)
        self._decided = -float("inf")  # decide at the next poll
        self._publish(self.record())
        return number

    def expect(self, requests: Iterable[QueuedRequest]) -> None:
        """Keep the places of the requests a previous queue held (this one restarted)
        until their drivers enqueue again, or for
        :data:`~tpuslice.queue_book.REJOIN_S`.

        Args:
            requests: The previous queue's last record's requests.
        """
        for request in requests:
            arrival = request.arrival or round(request.since * 1e9)
            waiter = Waiter(
                request.ticket, request.kind, request.count, request.priority, arrival=arrival
            )
            self.book.expect(waiter, request.who)
        self._decided = -float("inf")
        self._publish(self.record())

    def poll(self, ticket: str) -> Answer:
        """Where a ticket stands, deciding again first if that is due.

        Args:
            ticket: The ticket.

        Returns:
            The book's answer; a :class:`~tpuslice.queue_book.Waiting` names the requests
            ahead (who and what) rather than their ticket ids.
        """
        if self._clock() - self._decided >= self._every:
            self.decide()
        answer = self.book.poll(ticket)
        if isinstance(answer, Waiting):
            return replace(answer, ahead=tuple(self._describe(t) for t in answer.ahead))
        return answer

    def claimed(self, ticket: str) -> None:
        """The driver holds its grant.

        Args:
            ticket: The ticket.
        """
        self.book.claimed(ticket)
        self._forget(ticket)
        self._publish(self.record())

    def leave(self, ticket: str) -> None:
        """The driver gave up; any grant goes to the next.

        Args:
            ticket: The ticket.
        """
        self.book.leave(ticket)
        self._forget(ticket)
        self._publish(self.record())

    def decide(self) -> dict[str, tuple[str, ...]]:
        """Drop waiters of dead drivers, read the cluster, grant, publish.

        Returns:
            The new grants (ticket -> slices).
        """
        now = self._clock()
        self._drop_dead(now)
        idle: dict[str, list[str]] = {}
        holding: list[Holding] = []
        kinds = {k: self._kinds[k] for k in {t.kind.key for t in self._tickets.values()}}
        snapshots: dict[int, ClusterSnapshot] = {}
        for key, kind in sorted(kinds.items()):
            per_chip = kind.tpu_resource_per_chip
            if per_chip not in snapshots:
                snapshots[per_chip] = self._snapshot(per_chip)
            slices = snapshots[per_chip].matching(kind.shape, per_chip)
            idle[key] = [s.name for s in slices if s.state is SliceState.READY]
            busy = sum(1 for s in slices if s.state is SliceState.BUSY)
            if busy:
                holding.append(Holding(key, busy))
        grants = self.book.decide(idle, holding)
        self._decided = self._clock()
        for ticket in list(self._tickets):
            if self.book.entry(ticket) is None:  # its lease ran out
                self._forget(ticket)
        self._publish(self.record())
        return grants

    def record(self) -> QueueRecord:
        """What the queue holds now, for status and for drivers about to reserve.

        Returns:
            The record.
        """
        entries = []
        for place, (waiter, who, _) in enumerate(self.book.tickets(), start=1):
            granted = self.book.granted(waiter.ticket)
            answer = self.book.poll_quietly(waiter.ticket)
            entries.append(
                QueuedRequest(
                    ticket=waiter.ticket,
                    kind=waiter.kind,
                    count=waiter.count,
                    priority=waiter.priority,
                    who=who,
                    since=waiter.arrival / 1e9,
                    position=place,
                    granted=granted,
                    reason=getattr(answer, "reason", ""),
                    arrival=waiter.arrival,
                )
            )
        return QueueRecord(at=self._wall(), requests=tuple(entries))

    def _describe(self, ticket: str) -> str:
        found = self._tickets.get(ticket)
        if found is None:
            return ticket
        low, high = found.count
        count = str(low) if low == high else f"{low}..{high}"
        priority = f", priority {found.priority}" if found.priority else ""
        return f"{count} x {found.kind.key} for {found.who}{priority}"

    def _forget(self, ticket: str) -> None:
        self._tickets.pop(ticket, None)
        self._decided = -float("inf")

    def _drop_dead(self, now: float) -> None:
        if now - self._dead_checked < DEAD_CHECK_S:
            return
        quiet = self.book.overdue(DEAD_CHECK_S)
        if not quiet:
            return
        self._dead_checked = now
        jobs = {self._tickets[t].job for t in quiet if t in self._tickets}
        dead = set(self._dead_jobs(jobs)) if jobs else set()
        for ticket in quiet:
            found = self._tickets.get(ticket)
            if found is not None and found.job in dead:
                self.leave(ticket)
