"""The cluster-wide queue's bookkeeping, pure: tickets, leases, grants. Each ask renews a
ticket's lease; one not renewed for ``lease_s`` leaves with any grant. Arrival numbers are
wall-clock nanoseconds, so a driver whose ticket a restarted queue lost enqueues again with its
number and keeps its place, which the queue holds as a placeholder (:meth:`QueueBook.expect`)."""

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
    """A ticket may claim these slices now (and must report it, or they go back)."""

    slices: tuple[str, ...]
    view: tuple[SliceInfo, ...] = field(default=(), compare=False)
    """The slices as the decision saw them, so the claimant need not read them again."""
    quotas: bool = field(default=False, compare=False)
    """Whether the cluster had quotas then (the claimant records its holder)."""


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
    """Every waiting ticket, its lease and any grant not yet claimed; ``clock`` (monotonic
    seconds) times leases, ``stamp`` (wall-clock nanoseconds) gives arrival numbers."""

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
        """Add a ticket and return its arrival number (``waiter.arrival`` is replaced). One
        already in the book keeps its place (a join sent again); one taking over a placeholder
        (:meth:`expect`) takes its grant too; one that left within the lease (a late copy of its
        join) raises InvalidArgumentError."""
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
        """Hold, for ``rejoin_s``, the place of a ticket the queue had before it restarted."""
        if waiter.ticket in self._entries:
            return
        self._latest = max(self._latest, waiter.arrival)
        seen = self.clock() - self.lease_s + rejoin_s  # its lease runs out after rejoin_s
        self._entries[waiter.ticket] = _Entry(waiter, who, seen, rejoining=True)

    def poll(self, ticket: str) -> Answer:
        """Renew a ticket's lease and say where it stands as of the last decision."""
        self.touch([ticket])
        return self.poll_quietly(ticket)

    def touch(self, tickets: Iterable[str]) -> None:
        """Renew the leases of tickets whose drivers are waiting on an ask now."""
        now = self.clock()
        for ticket in tickets:
            entry = self._entries.get(ticket)
            if entry is not None and not entry.rejoining:
                entry.seen = now

    def poll_quietly(self, ticket: str) -> Answer:
        """As :meth:`poll` without renewing the lease (for status); a placeholder's is Unknown."""
        entry = self._entries.get(ticket)
        if entry is None or entry.rejoining:
            return Unknown()
        if entry.granted:
            return Granted(entry.granted)
        return self._last.get(ticket, Waiting(0, (), "not decided yet"))

    def claimed(self, ticket: str) -> None:
        """The driver holds its grant: the ticket leaves the book, its slices settle."""
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
        read, so the queue never sees them as no one's; for at most ``settle_s``. ``recorded``
        is ``None`` when records are not read; with quotas every reservation records. Returns
        the slices still settling."""
        now = self.clock()
        for s, (until, w) in list(self._settling.items()):
            unrecorded = (
                recorded is not None and s not in recorded and (quotas_set or w.preemptible)
            )
            if until <= now or not (s in shown_idle or unrecorded):
                del self._settling[s]
        return set(self._settling)

    def settling(self) -> set[str]:
        """The slices of claimed grants still counted here (:meth:`settle`)."""
        return set(self._settling)

    def leave(self, ticket: str) -> None:
        """The driver gave up (timeout, Ctrl-C): the ticket and any grant go."""
        self._entries.pop(ticket, None)
        self._last.pop(ticket, None)
        self._ended[ticket] = self.clock()

    def entry(self, ticket: str) -> tuple[Waiter, str] | None:
        """A ticket's ``(request, who)``, or ``None`` if it is not in the book."""
        entry = self._entries.get(ticket)
        return None if entry is None else (entry.waiter, entry.who)

    def granted(self, ticket: str) -> tuple[str, ...]:
        """The slices granted to a ticket and not yet claimed (empty if none)."""
        entry = self._entries.get(ticket)
        return () if entry is None else entry.granted

    def tickets(self) -> list[tuple[Waiter, str, float]]:
        """For status: ``(request, who, seconds since it last polled)``, in serving order."""
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
        """Drop tickets whose lease ran out, then grant what the policy says (arguments as
        :func:`~tpuslice._reserve.queue.schedule.decide`, ``recorded`` as :meth:`settle`) and
        return the new grants; granted or settling slices are kept out, preemptions left in
        :attr:`preemptions`. ``keep_settling`` leaves claims settling as they are (``idle`` is
        older than some)."""
        now = self.clock()
        for ticket, entry in list(self._entries.items()):
            if now - entry.seen > self.lease_s:
                self.leave(ticket)
        self._ended = {t: ended for t, ended in self._ended.items() if now - ended <= self.lease_s}
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
