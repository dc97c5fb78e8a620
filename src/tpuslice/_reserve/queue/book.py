"""The cluster-wide queue's bookkeeping, pure: tickets, leases, grants.

Each ask renews a ticket's lease; a ticket not renewed for ``lease_s`` leaves with any grant.
Arrival numbers are wall-clock nanoseconds, so a driver whose ticket a restarted queue lost
enqueues again with its number and keeps its place; until it does, the restarted queue keeps
that place as a placeholder (:meth:`QueueBook.expect`) for :data:`REJOIN_S`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from tpuslice._reserve.queue.schedule import Holding, Preemption, Waiter, decide, queue_order
from tpuslice._reserve.queue.share import Sharing
from tpuslice.errors import InvalidArgumentError

if TYPE_CHECKING:
    from tpuslice._view.cluster import SliceInfo

LEASE_S = 10.0
"""A waiter that has not asked for this long has left (its driver hangs or died)."""
REJOIN_S = 5.0
"""How long a restarted queue keeps the place of a ticket it had, for its driver to come back."""
SETTLE_S = 2.0
"""At most how long a claimed grant's slices, which may still show idle, are kept from others."""


@dataclass(frozen=True)
class Waiting:
    """A ticket still waits, at ``position`` (from 1) behind ``ahead``, for ``reason``."""

    position: int
    ahead: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class Granted:
    """A ticket may claim these slices now (and must report it, or they go back).

    Attributes:
        view: The slices as the decision saw them, so the claimant need not read them again.
        quotas: Whether the cluster had quotas then (the claimant records its holder).
    """

    slices: tuple[str, ...]
    view: tuple[SliceInfo, ...] = field(default=(), compare=False)
    quotas: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class Never:
    """A ticket can never be granted: the cluster has too few slices of its kind."""

    reason: str


@dataclass(frozen=True)
class Unknown:
    """The book has no such ticket: enqueue again, with the arrival number to keep the place."""


Answer = Waiting | Granted | Never | Unknown


@dataclass
class _Entry:
    waiter: Waiter
    who: str
    seen: float
    granted: tuple[str, ...] = ()
    rejoining: bool = False


@dataclass
class QueueBook:
    """Every waiting ticket, its lease and any grant not yet claimed.

    Args:
        clock: Monotonic seconds, for leases.
        stamp: Wall-clock nanoseconds, for arrival numbers.
        lease_s: See :data:`LEASE_S`.
        settle_s: See :data:`SETTLE_S`.
    """

    clock: Callable[[], float] = time.monotonic
    stamp: Callable[[], int] = time.time_ns
    lease_s: float = LEASE_S
    settle_s: float = SETTLE_S
    _entries: dict[str, _Entry] = field(default_factory=dict)
    _settling: dict[str, tuple[float, Waiter]] = field(default_factory=dict)
    _latest: int = 0
    # Tickets that left, and when: kept for a lease, so a late copy of a join cannot requeue.
    _ended: dict[str, float] = field(default_factory=dict)
    _last: dict[str, Answer] = field(default_factory=dict)
    _order: dict[str, int] = field(default_factory=dict)
    # Holder -> the preemption the last decision chose (new ones only).
    preemptions: dict[str, Preemption] = field(default_factory=dict)

    def enqueue(self, waiter: Waiter, who: str = "", *, arrival: int | None = None) -> int:
        """Add a ticket; one already in the book keeps its place (a join sent again), and one
        taking over a placeholder (:meth:`expect`) takes its grant too.

        Args:
            waiter: The request (its ``arrival`` is replaced).
            who: The driver or job, for status.
            arrival: Its original arrival number, if it had one.

        Returns:
            Its arrival number.

        Raises:
            InvalidArgumentError: the ticket left within the lease (a late copy of its join).
        """
        kept = self._entries.get(waiter.ticket)
        if kept is not None and not kept.rejoining:
            return kept.waiter.arrival
        if waiter.ticket in self._ended:
            raise InvalidArgumentError(f"ticket {waiter.ticket} has left the queue")
        if arrival is None and kept is not None:
            arrival = kept.waiter.arrival
        number = arrival if arrival is not None else max(self.stamp(), self._latest + 1)
        self._latest = max(self._latest, number)
        entry = _Entry(replace(waiter, arrival=number), who, self.clock())
        self._last.pop(waiter.ticket, None)  # a placeholder's answer was not its driver's
        if kept is not None:
            entry.granted = kept.granted
        self._entries[waiter.ticket] = entry
        return number

    def expect(self, waiter: Waiter, who: str, rejoin_s: float = REJOIN_S) -> None:
        """Keep a place for a ticket the queue had before it restarted.

        Args:
            waiter: The request, with its original arrival number.
            who: The driver, for status.
            rejoin_s: How long its driver has to enqueue again.
        """
        if waiter.ticket in self._entries:
            return
        self._latest = max(self._latest, waiter.arrival)
        seen = self.clock() - self.lease_s + rejoin_s  # its lease runs out after rejoin_s
        self._entries[waiter.ticket] = _Entry(waiter, who, seen, rejoining=True)

    def poll(self, ticket: str) -> Answer:
        """Renew a ticket's lease and say where it stands as of the last decision.

        Args:
            ticket: The ticket.

        Returns:
            The answer.
        """
        self.touch([ticket])
        return self.poll_quietly(ticket)

    def touch(self, tickets: Iterable[str]) -> None:
        """Renew the leases of tickets whose drivers are waiting on an ask now.

        Args:
            tickets: The tickets.
        """
        now = self.clock()
        for ticket in tickets:
            entry = self._entries.get(ticket)
            if entry is not None and not entry.rejoining:
                entry.seen = now

    def poll_quietly(self, ticket: str) -> Answer:
        """Where a ticket stands, without renewing its lease (for status).

        Args:
            ticket: The ticket.

        Returns:
            As :meth:`poll`; :class:`Unknown` for a placeholder.
        """
        entry = self._entries.get(ticket)
        if entry is None or entry.rejoining:
            return Unknown()
        if entry.granted:
            return Granted(entry.granted)
        return self._last.get(ticket, Waiting(0, (), "not decided yet"))

    def claimed(self, ticket: str) -> None:
        """The driver holds its grant: the ticket leaves the book.

        Args:
            ticket: The ticket.
        """
        entry = self._entries.get(ticket)
        self.leave(ticket)
        if entry is not None:
            for name in entry.granted:
                self._settling[name] = (self.clock() + self.settle_s, entry.waiter)

    def settle(
        self,
        shown_idle: Collection[str],
        recorded: Collection[str] | None,
        *,
        quotas_set: bool = False,
    ) -> set[str]:
        """Keep counting a claimed grant's slices as its request's while the cluster may
        show them idle or (for a reservation that records its holder) until its record is
        read, so the queue never sees them as no one's; for at most ``settle_s``.

        Args:
            shown_idle: Slices the cluster shows idle.
            recorded: Slices whose holder record was read; ``None``: records are not read.
            quotas_set: Whether the cluster has quotas (every reservation records then).

        Returns:
            The slices still settling.
        """
        now = self.clock()
        self._settling = {
            s: settling
            for s, settling in self._settling.items()
            if settling[0] > now
            and (
                s in shown_idle
                or (
                    recorded is not None
                    and s not in recorded
                    and (quotas_set or settling[1].preemptible)
                )
            )
        }
        return set(self._settling)

    def settling(self) -> set[str]:
        """The slices of claimed grants still counted here (:meth:`settle`).

        Returns:
            Their names.
        """
        return set(self._settling)

    def leave(self, ticket: str) -> None:
        """The driver gave up (timeout, Ctrl-C): the ticket and any grant go.

        Args:
            ticket: The ticket.
        """
        self._entries.pop(ticket, None)
        self._last.pop(ticket, None)
        self._ended[ticket] = self.clock()

    def entry(self, ticket: str) -> tuple[Waiter, str] | None:
        """A ticket's request and who asked, if it is in the book.

        Args:
            ticket: The ticket.

        Returns:
            ``(request, who)``, or ``None``.
        """
        entry = self._entries.get(ticket)
        return None if entry is None else (entry.waiter, entry.who)

    def granted(self, ticket: str) -> tuple[str, ...]:
        """The slices granted to a ticket and not yet claimed (empty if none).

        Args:
            ticket: The ticket.

        Returns:
            The slice names.
        """
        entry = self._entries.get(ticket)
        return () if entry is None else entry.granted

    def tickets(self) -> list[tuple[Waiter, str, float]]:
        """What the queue holds, for status.

        Returns:
            ``(request, who, seconds since it last polled)`` in serving order.
        """
        now = self.clock()
        return [
            (w, self._entries[w.ticket].who, now - self._entries[w.ticket].seen)
            for w in self._in_order(self._waiters(granted=True))
        ]

    def _in_order(self, waiters: list[Waiter]) -> list[Waiter]:
        """Waiters in the last decision's order; those it did not see after, in plain order."""
        plain = {w.ticket: i for i, w in enumerate(queue_order(waiters))}
        last = len(self._order)
        return sorted(waiters, key=lambda w: (self._order.get(w.ticket, last), plain[w.ticket]))

    def _waiters(self, *, granted: bool) -> list[Waiter]:
        return [e.waiter for e in self._entries.values() if granted or not e.granted]

    def decide(
        self,
        idle: Mapping[str, Sequence[str]],
        holding: Sequence[Holding] = (),
        *,
        suspects: Mapping[str, Sequence[str]] | None = None,
        trusted: Mapping[str, int] | None = None,
        sharing: Sharing | None = None,
        recorded: Collection[str] | None = None,
        keep_settling: bool = False,
        unread: Collection[str] = (),
    ) -> dict[str, tuple[str, ...]]:
        """Drop tickets whose lease ran out, then grant what the policy says (preemptions are
        left in :attr:`preemptions`); granted or settling slices are kept out.

        Args:
            idle: Kind -> its idle trusted slices as the cluster shows them.
            holding: The work holding the kinds' other slices.
            suspects: Kind -> its idle slices with a suspect host.
            trusted: Kind -> its trusted slices, idle or busy.
            sharing: Quotas and usage, when tenants share the cluster.
            recorded: Slices whose holder record was read (:meth:`settle`).
            keep_settling: Leave claims settling as they are (``idle`` is older than some).
            unread: Kinds the read did not cover: their waiters wait for the next pass.

        Returns:
            The new grants: ticket -> slices.
        """
        now = self.clock()
        for ticket, entry in list(self._entries.items()):
            if now - entry.seen > self.lease_s:
                self.leave(ticket)
        for ticket, ended in list(self._ended.items()):
            if now - ended > self.lease_s:
                del self._ended[ticket]
        suspects = suspects or {}
        configured = sharing is not None and sharing.quotas.configured
        shown_idle = {s for names in [*idle.values(), *suspects.values()] for s in names}
        if not keep_settling:
            self.settle(shown_idle, recorded, quotas_set=configured)
        pending = {s for e in self._entries.values() for s in e.granted} | set(self._settling)
        free = {kind: [s for s in names if s not in pending] for kind, names in idle.items()}
        spare = {kind: [s for s in names if s not in pending] for kind, names in suspects.items()}
        # Grants not yet claimed, and claims until they settle into the holdings read, are
        # held by their requests, for the others' purposes.
        granted = [_held(e.waiter, len(e.granted)) for e in self._entries.values() if e.granted]
        granted += [_held(w, 1) for _, w in self._settling.values()]
        decision = decide(
            self._waiters(granted=False),
            free,
            [*holding, *granted],
            suspects=spare,
            trusted=trusted,
            now=now,
            sharing=sharing,
            unread=unread,
        )
        for ticket, slices in decision.grants.items():
            self._entries[ticket].granted = slices
        self.preemptions = dict(decision.preempt)
        # With quotas, the decision's order; without, the plain order.
        self._order = {t: i for i, t in enumerate(decision.order)} if configured else {}
        still = self._in_order(self._waiters(granted=False))
        last, self._last = self._last, {}
        for place, waiter in enumerate(still, start=1):
            ticket = waiter.ticket
            if ticket in decision.never and keep_settling:
                # A quick decision sees only freed slices: "never" is for a full read to say.
                self._last[ticket] = last.get(ticket, Waiting(place, (), ""))
            elif ticket in decision.never:
                self._last[ticket] = Never(decision.never[ticket])
            else:
                ahead = tuple(w.ticket for w in still[: place - 1])
                self._last[ticket] = Waiting(place, ahead, decision.blocked.get(ticket, ""))
        return dict(decision.grants)


def _held(w: Waiter, slices: int) -> Holding:
    return Holding(w.kind, slices, tenant=w.tenant, priority=w.priority, preemptible=w.preemptible)
