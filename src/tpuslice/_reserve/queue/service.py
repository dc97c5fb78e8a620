"""The cluster-wide queue as a service, without Ray: what the queue actor runs.

:class:`QueueService` keeps a :class:`~tpuslice._reserve.queue.book.QueueBook`, learns each
kind of slice from the requests that wait for it (:class:`SliceKind`), and decides who gets what
when something changed: a waiter arrived or left, a grant was claimed, a hand-back ended
(:meth:`QueueService.released`). While anyone waits it also decides every
``decide_every_s`` with no news, which is how it sees what no one reports: a host that
died or came back, work of other tools ending. A decision reads the cluster once,
whatever the number of waiters (:meth:`QueueService.read`, the only I/O), then applies
the policy (:meth:`QueueService.apply`, pure). The cluster is the truth about what is
held: every busy slice of a kind is running work, so after a restart nothing needs
rebuilding but the waiters, who enqueue again with their arrival numbers.

A waiter whose driver has died leaves as soon as ``dead_jobs`` (Ray's job table, on the
actor) says so; one that merely stops asking leaves after the book's lease.
Each decision's :class:`~tpuslice._view.queue_record.QueueRecord` goes to ``publish``, for
status. A grant carries the granted slices as the decision saw them, so the claimant
need not read the cluster again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from tpuslice._host.notices import Notice
from tpuslice._reserve.queue.book import Answer, Granted, QueueBook, Waiting
from tpuslice._reserve.queue.schedule import Holding, Preemption, Waiter
from tpuslice._reserve.queue.share import Sharing, UsageMeter, held_by
from tpuslice._tpu.topology import SliceShape
from tpuslice._view.cluster import ClusterSnapshot, SliceInfo, SliceState, as_freed
from tpuslice._view.holders import QUEUE_SOURCE, Holder, given_by_queue, holders_by_id
from tpuslice._view.queue_record import QueuedRequest, QueueRecord
from tpuslice._view.quotas import Quotas, describe_tenant

USUAL_CHIPS_PER_HOST = 4
DECIDE_EVERY_S = 1.0
"""While anyone waits, decide at least this often with no news (hosts dying or coming
back, and work of other tools ending, are not reported to the queue)."""
DEAD_CHECK_S = 1.0
"""While anyone waits, how often the waiters' drivers are looked up in Ray's job table."""
REPROBE_S = 2.0
"""While anyone waits, how often hosts busy only by a TPU-owner record are asked again,
so a record of a process that has since exited cannot keep its slice busy."""
QUICK_WITHIN_S = 2.0
"""How old the last read may be for slices handed back since to be granted from it at
once (:meth:`QueueService.quick_reading`). While anyone waits a read is at most
:data:`DECIDE_EVERY_S` old, so this only rules out a read from before a quiet spell."""


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
        time_left_s: Seconds to the request's deadline as it is sent; ``None``: none. The
            queue makes it a deadline on its own clock when the ticket arrives, so the
            driver's and the queue's clocks need not agree. Near it, the request may be
            granted a suspect slice (:func:`~tpuslice._reserve.queue.schedule.last_resort`).
        tenant: Whom it is charged to (``""``: none named).
        preemptible: Whether its work may be preempted once it runs.
        only: The slices it may be granted (those its label selectors accept), lowest
            first; ``None``: any of its kind.
    """

    ticket: str
    kind: SliceKind
    count: tuple[int, int]
    priority: int
    who: str
    job: str
    time_left_s: float | None = None
    tenant: str = ""
    preemptible: bool = False
    only: tuple[str, ...] | None = None


class SliceQueue(Protocol):
    """What a reserving driver asks of the queue (the actor's handle, or a service in
    memory). Calls raise :class:`~tpuslice.errors.QueueUnreachableError` when it cannot
    be reached."""

    def join(self, ticket: Ticket, arrival: int | None, timeout_s: float) -> Joined:
        """Wait in the queue, and where the ticket stands once it is granted or can never
        be, or after at most ``timeout_s`` (one call: an uncontended request is granted
        in it).

        Args:
            ticket: The request.
            arrival: Its original arrival number, to keep its place after a restart.
            timeout_s: How long the queue may hold the call.

        Returns:
            Its arrival number and the answer.
        """
        ...

    def wait(self, ticket: str, timeout_s: float) -> Answer:
        """Where a ticket stands, once it is granted or can never be, or after at most
        ``timeout_s`` (a queue in memory answers at once).

        Args:
            ticket: The ticket.
            timeout_s: How long the queue may hold the call.

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

    def released(self, slices: Sequence[str], *, freed: bool = False) -> None:
        """A hand-back of these slices ended: decide again now.

        Args:
            slices: Their names.
            freed: The hand-back saw Ray's view show them free.
        """
        ...


@dataclass(frozen=True)
class Joined:
    """What :meth:`SliceQueue.join` answers.

    Attributes:
        arrival: The ticket's arrival number (its place, kept through restarts).
        answer: Where it stands.
    """

    arrival: int
    answer: Answer


STALE_HOLDER_S = 60.0
"""A holder record on a slice the cluster shows idle for this long is left over from a
driver that died without its hand-back (a record is written just after the hold, so a
fresh one may meet a view that does not show the slice busy yet)."""


@dataclass(frozen=True)
class Reading:
    """What one decision read of the cluster.

    Attributes:
        snapshots: A snapshot per ``TPU`` units per chip of the kinds waited for.
        dead: Of the waiters' Ray jobs, those that are dead (looked up now and then).
        holders: Who holds each held slice, by slice name.
        quotas: The cluster's quotas.
    """

    snapshots: Mapping[int, ClusterSnapshot]
    dead: frozenset[str] = frozenset()
    holders: Mapping[str, Holder] = field(default_factory=dict)
    quotas: Quotas = field(default_factory=Quotas)
    quick: frozenset[str] = frozenset()
    """In a :meth:`QueueService.quick_reading`, the slices just handed back."""


@dataclass(frozen=True)
class Orders:
    """What a decision asks done to running work: the I/O its owner carries out after it.

    Attributes:
        notices: Notices to give, one per host of each newly preempted holder's slices.
        preempted: Each new preemption with the holder's records (for the timeline).
        take_back: Holders whose grace ran out: remove their groups, forget their records.
        clear: Hosts whose queue notice warns of work that has left.
        stale: Holder records left over from drivers that died (their slices are idle).
    """

    notices: tuple[Notice, ...] = ()
    preempted: tuple[tuple[Preemption, tuple[Holder, ...]], ...] = ()
    take_back: tuple[Holder, ...] = ()
    clear: tuple[str, ...] = ()
    stale: tuple[Holder, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.notices or self.preempted or self.take_back or self.clear or self.stale)


class QueueService:
    """One queue for every kind of slice (see the module docstring).

    Args:
        snapshot: Reads the cluster, given the ``TPU`` units per chip.
        publish: Receives the record after each decision.
        dead_jobs: Of the job ids given, those that are dead.
        reprobe: Asks the given hosts' agents who owns their TPUs (updating the records
            the snapshot reads); ``None`` to never ask.
        holders: Reads who holds each slice (:func:`~tpuslice._view.holders.read_holders`).
        quotas: Reads the cluster's quotas.
        meter: Counts the tenants' use (ticked here, and by whoever else looks).
        act: Carries out what a decision asks done to running work (:meth:`decide`
            only; the actor's runner carries it out itself).
        clock: Monotonic seconds.
        stamp: Wall-clock nanoseconds (arrival numbers).
        wall: Wall-clock seconds (for records).
        decide_every_s: See :data:`DECIDE_EVERY_S`.
    """

    def __init__(
        self,
        snapshot: Callable[[int], ClusterSnapshot],
        *,
        publish: Callable[[QueueRecord], None] = lambda record: None,
        dead_jobs: Callable[[Collection[str]], Collection[str]] = lambda jobs: (),
        reprobe: Callable[[Sequence[str]], object] | None = None,
        holders: Callable[[], Mapping[str, Holder]] = dict,
        quotas: Callable[[], Quotas] = Quotas,
        meter: UsageMeter | None = None,
        act: Callable[[Orders], None] = lambda orders: None,
        clock: Callable[[], float] = time.monotonic,
        stamp: Callable[[], int] = time.time_ns,
        wall: Callable[[], float] = time.time,
        decide_every_s: float = DECIDE_EVERY_S,
    ) -> None:
        self.book = QueueBook(clock, stamp)
        self._snapshot = snapshot
        self._publish = publish
        self._dead_jobs = dead_jobs
        self._reprobe = reprobe
        self._holders = holders
        self._quotas = quotas
        self.meter = meter or UsageMeter()
        self._act = act
        self.orders = Orders()
        """What the last decision asks done (:meth:`take_orders`)."""
        self._clock = clock
        self._wall = wall
        self._every = decide_every_s
        self._tickets: dict[str, Ticket] = {}
        self._kinds: dict[str, SliceKind] = {}
        self._views: dict[str, tuple[SliceInfo, ...]] = {}
        self._changed = True
        self._freed: set[str] = set()
        """Slices handed back free since the last quick reading."""
        self._freed_in_read: set[str] = set()
        """Slices handed back free since the read under way began."""
        self._read_began = -float("inf")
        self._last: tuple[float, Reading] | None = None
        """The last read applied, and when that read began."""
        self._decided = -float("inf")
        self._dead_checked = -float("inf")
        self._reprobed = -float("inf")
        self.reads = 0
        """Cluster reads so far (one per decision)."""
        self._quotas_set = False
        """Whether the last decision's read found quotas configured."""

    # --- what drivers tell it -------------------------------------------------------

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
        left = ticket.time_left_s
        deadline = None if left is None else self._clock() + left
        waiter = Waiter(
            ticket.ticket,
            ticket.kind.key,
            ticket.count,
            ticket.priority,
            deadline=deadline,
            tenant=ticket.tenant,
            preemptible=ticket.preemptible,
            only=None if ticket.only is None else frozenset(ticket.only),
        )
        number = self.book.enqueue(waiter, ticket.who, arrival=arrival)
        self._tickets[ticket.ticket] = ticket
        self._kinds.setdefault(ticket.kind.key, ticket.kind)
        self._changed = True
        return number

    def expect(self, requests: Iterable[QueuedRequest]) -> None:
        """Keep the places of the requests a previous queue held (this one restarted)
        until their drivers enqueue again, or for
        :data:`~tpuslice._reserve.queue.book.REJOIN_S`.

        Args:
            requests: The previous queue's last record's requests.
        """
        for request in requests:
            arrival = request.arrival or round(request.since * 1e9)
            waiter = Waiter(
                request.ticket,
                request.kind,
                request.count,
                request.priority,
                arrival=arrival,
                tenant=request.tenant,
                preemptible=request.preemptible,
            )
            self.book.expect(waiter, request.who)
        self._changed = True

    def answer(self, ticket: str) -> Answer:
        """Where a ticket stands as of the last decision; asking renews its lease.

        Args:
            ticket: The ticket.

        Returns:
            The book's answer; a :class:`~tpuslice._reserve.queue.book.Waiting` names the requests
            ahead (who and what) rather than their ticket ids, and a
            :class:`~tpuslice._reserve.queue.book.Granted` carries the slices' view.
        """
        answer = self.book.poll(ticket)
        if isinstance(answer, Waiting):
            return replace(answer, ahead=tuple(self._describe(t) for t in answer.ahead))
        if isinstance(answer, Granted):
            return replace(answer, view=self._views.get(ticket, ()), quotas=self._quotas_set)
        return answer

    def wait(self, ticket: str, timeout_s: float = 0.0) -> Answer:
        """Decide first if that is due, then answer (at once: this is the queue in one
        process; the actor holds the call instead, see :mod:`tpuslice._reserve.queue.actor`).

        Args:
            ticket: The ticket.
            timeout_s: Ignored here.

        Returns:
            As :meth:`answer`.
        """
        self.book.touch([ticket])
        if self.due():
            self.decide()
        return self.answer(ticket)

    def join(self, ticket: Ticket, arrival: int | None = None, timeout_s: float = 0.0) -> Joined:
        """:meth:`enqueue`, then :meth:`wait` (at once, in one process).

        Args:
            ticket: The request.
            arrival: Its original arrival number, to keep its place.
            timeout_s: Ignored here.

        Returns:
            Its arrival number and the answer.
        """
        number = self.enqueue(ticket, arrival)
        return Joined(number, self.wait(ticket.ticket, timeout_s))

    def claimed(self, ticket: str) -> None:
        """The driver holds its grant.

        Args:
            ticket: The ticket.
        """
        self.book.claimed(ticket)
        self._forget(ticket)

    def leave(self, ticket: str) -> None:
        """The driver gave up; any grant goes to the next.

        Args:
            ticket: The ticket.
        """
        self.book.leave(ticket)
        self._forget(ticket)

    def released(self, slices: Sequence[str], *, freed: bool = False) -> None:
        """A hand-back of these slices ended: decide again.

        Args:
            slices: Their names.
            freed: The hand-back saw Ray's view show them free, so the next decision may
                grant them before it reads the cluster again (:meth:`quick_reading`).
        """
        self._changed = True
        if freed:
            self._freed.update(slices)
            self._freed_in_read.update(slices)

    # --- deciding -------------------------------------------------------------------

    def due(self) -> bool:
        """Whether a decision is due: something changed, or someone waits and the last
        decision is older than ``decide_every_s``.

        Returns:
            True if :meth:`decide` should run now.
        """
        wait = self.next_due()
        return wait is not None and wait <= 0.0

    def next_due(self) -> float | None:
        """Seconds until a decision is due (0 or less: now).

        Returns:
            The seconds; ``None`` when nothing changed and no one waits.
        """
        if self._changed:
            return 0.0
        if not self.book.tickets():
            return None
        return self._decided + self._every - self._clock()

    def decide(self) -> dict[str, tuple[str, ...]]:
        """Read the cluster once, decide, publish (:meth:`read`, then :meth:`apply`).

        Returns:
            The new grants (ticket -> slices).
        """
        grants = self.apply(self.read())
        orders = self.take_orders()
        if orders:
            self._act(orders)
        self._publish(self.record())
        return grants

    def read(self) -> Reading:
        """The I/O of one decision (see :meth:`reader`), done now.

        Returns:
            What was read.
        """
        return self.reader()()

    def reader(self) -> Callable[[], Reading]:
        """What the next decision must read, fixed now; the call returned does the I/O,
        on any thread: a snapshot per ``TPU`` units per chip of the kinds waited for,
        the waiters' dead jobs (now and then), and, now and then, the hosts busy only by
        a TPU-owner record asked again.

        Returns:
            The read, to call once.
        """
        now = self._clock()
        kinds = list({self._kinds[t.kind.key] for t in self._tickets.values()})
        jobs = {t.job for t in self._tickets.values() if t.job}
        if jobs and now - self._dead_checked >= DEAD_CHECK_S:
            self._dead_checked = now
        else:
            jobs = set()
        reprobe = self._reprobe if now - self._reprobed >= REPROBE_S else None
        # The read covers every change so far; one reported while it runs must make
        # the next decision due at once, not wait for the periodic look.
        self._changed = False
        self._freed_in_read = set()
        self._read_began = now

        def read() -> Reading:
            per_chip = sorted({kind.tpu_resource_per_chip for kind in kinds})
            snapshots = {unit: self._snapshot(unit) for unit in per_chip}
            self.reads += 1
            dead = frozenset(self._dead_jobs(jobs)) if jobs else frozenset()
            owned = _owned_hosts(kinds, snapshots) if reprobe is not None else []
            if reprobe is not None and owned:
                self._reprobed = now
                reprobe(owned)
            return Reading(snapshots, dead, self._holders(), self._quotas())

        return read

    def quick_reading(self) -> Reading | None:
        """The last read, with the slices handed back free since then as their hand-backs
        left them (:func:`~tpuslice._view.cluster.as_freed`), so that a decision can grant
        them with no I/O, even while a read is under way. Only those slices change, and
        they change only from held to ready, so such a decision grants nothing the next
        read would not; a hand-back that missed news about its hosts (a notice or a
        suspect record given in the moment since the last read) costs its claimant a
        failed claim and a requeue in the same place. The full decision that follows
        decides everything else.

        Returns:
            The reading; ``None`` when no slice was handed back free since the last
            quick reading, no read was applied within :data:`QUICK_WITHIN_S`, or none of
            those slices is one a waiter could take.
        """
        freed, self._freed = self._freed, set()
        if not freed or self._last is None or self._clock() - self._last[0] > QUICK_WITHIN_S:
            return None
        read_at, last = self._last
        reading, patched = self._with_freed(last, freed)
        if not patched:
            return None
        # Kept as the last read: a later quick decision must see these slices as this
        # one left them, or it would take their grants for work that is still there.
        self._last = (read_at, reading)
        return replace(reading, dead=frozenset(), quick=frozenset(patched))

    def _with_freed(self, reading: Reading, freed: Collection[str]) -> tuple[Reading, set[str]]:
        """``reading`` with the ``freed`` slices ready, where nothing but their work kept
        them from it, and without their holder records; and the slices made ready."""
        wall = self._wall()
        snapshots: dict[int, ClusterSnapshot] = {}
        patched: set[str] = set()
        for unit, snapshot in reading.snapshots.items():
            slices = dict(snapshot.slices)
            for name in slices.keys() & set(freed):
                ready = as_freed(slices[name], wall)
                if ready is not None and ready != slices[name]:
                    slices[name] = ready
                    patched.add(name)
            snapshots[unit] = replace(snapshot, slices=slices)
        holders = {n: h for n, h in reading.holders.items() if n not in freed}
        return replace(reading, snapshots=snapshots, holders=holders), patched

    def apply(self, reading: Reading) -> dict[str, tuple[str, ...]]:
        """Drop waiters of dead drivers, count the tenants' use, then grant what the
        policy says: ready slices, and idle ones with a suspect host only as a last
        resort. What it asks done to running work is left in :attr:`orders`. Pure.

        Args:
            reading: What :meth:`read` returned (kinds it does not cover wait for the
                next decision), or a :meth:`quick_reading`: then only its freed slices
                are granted, and the tenants' use, the orders to running work and the
                next periodic look are left to the full decision that follows (it is
                still due).

        Returns:
            The new grants (ticket -> slices).
        """
        changed_during_read = self._changed
        quick = bool(reading.quick)
        if not quick and self._freed_in_read:
            # Handed back after this read began: it may still show them held, and a
            # quick decision may already have granted them.
            reading, _ = self._with_freed(reading, self._freed_in_read)
        for ticket, found in list(self._tickets.items()):
            if found.job in reading.dead:
                self.leave(ticket)
        wall, now = self._wall(), self._clock()
        quotas = reading.quotas
        self._quotas_set = quotas.configured
        idle: dict[str, list[str]] = {}
        suspects: dict[str, list[str]] = {}
        trusted: dict[str, int] = {}
        holding: list[Holding] = []
        infos: dict[str, SliceInfo] = {}
        by_kind: dict[str, list[SliceInfo]] = {}
        for key in sorted({t.kind.key for t in self._tickets.values()}):
            kind = self._kinds[key]
            snapshot = reading.snapshots.get(kind.tpu_resource_per_chip)
            if snapshot is None:  # its first waiter came during the read
                continue
            slices = by_kind[key] = snapshot.matching(kind.shape, kind.tpu_resource_per_chip)
            infos.update((s.name, s) for s in slices)
            # A quick decision grants only the slices just handed back: the others are
            # as an older read saw them.
            grantable = [s for s in slices if not quick or s.name in reading.quick]
            idle[key] = [s.name for s in grantable if s.state is SliceState.READY]
            suspects[key] = [s.name for s in grantable if s.last_resort]
            trusted[key] = sum(1 for s in slices if s.trusted)
        # Kinds this read did not cover: their first waiter came during the read, or only
        # the places a restarted queue keeps wait for them (their drivers not back yet).
        unread = {w.kind for w, _, _ in self.book.tickets()} - idle.keys()
        shown_idle = {s for names in [*idle.values(), *suspects.values()] for s in names}
        # Claimed grants not yet recorded are counted by the book, as their requests'.
        # A quick decision's read is older than some claims: it must not end their
        # settling (the next full read does).
        settling = (
            self.book.settling()
            if quick
            else self.book.settle(shown_idle, reading.holders, quotas_set=reading.quotas.configured)
        )
        for key, slices in by_kind.items():
            unsettled = [s for s in slices if s.name not in settling]
            holding += _holdings(key, unsettled, reading.holders, wall, now)
        usage: dict[str, float] = {}
        if quotas.configured:
            self.meter.with_half_life(quotas.half_life_s, wall)
            if not quick:
                self.meter.tick(held_by((h.tenant, 1) for h in reading.holders.values()), wall)
            usage = self.meter.of_all(wall)
        grants = self.book.decide(
            idle,
            holding,
            suspects=suspects,
            trusted=trusted,
            sharing=Sharing(quotas, usage),
            recorded=reading.holders,
            keep_settling=quick,
            unread=unread,
        )
        for ticket, names in grants.items():
            self._views[ticket] = tuple(infos[n] for n in names if n in infos)
        if quick:
            return grants
        self._last = (self._read_began, reading)
        self.orders = _orders(self.book.preemptions, reading, wall)
        # A slice whose notice is cleared now is grantable at once, and a kind the read
        # did not cover that a driver waits for is read at once: decide again then.
        waited = unread & {t.kind.key for t in self._tickets.values()}  # the next read covers
        changed_during_read = changed_during_read or bool(self.orders.clear) or bool(waited)
        self._decided = self._clock()
        for ticket in list(self._tickets):
            if self.book.entry(ticket) is None:  # its lease ran out
                self._forget(ticket)
        # What this decision did itself (dropping dead or lapsed waiters) is decided;
        # what was reported while it read is not.
        self._changed = changed_during_read
        return grants

    def take_orders(self) -> Orders:
        """What the last decision asks done to running work, once.

        Returns:
            The orders (empty if none, or already taken).
        """
        orders, self.orders = self.orders, Orders()
        return orders

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
                    tenant=waiter.tenant,
                    preemptible=waiter.preemptible,
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
        tenant = f" ({describe_tenant(found.tenant)})" if found.tenant else ""
        return f"{count} x {found.kind.key} for {found.who}{tenant}{priority}"

    def _forget(self, ticket: str) -> None:
        self._tickets.pop(ticket, None)
        self._views.pop(ticket, None)
        self._changed = True


_HELD = (SliceState.BUSY, SliceState.SUSPECT)
"""Slices whose hosts, when some are in use, are running work that will give them back."""


def _owned_hosts(kinds: Iterable[SliceKind], snapshots: Mapping[int, ClusterSnapshot]) -> list[str]:
    """Hosts of these kinds whose slice is busy and that a TPU-owner record marks (the
    record may be stale)."""
    nodes = []
    for kind in kinds:
        snapshot = snapshots.get(kind.tpu_resource_per_chip)
        if snapshot is None:
            continue
        for info in snapshot.matching(kind.shape, kind.tpu_resource_per_chip):
            if info.state in _HELD:
                nodes += [h.node_id for h in info.hosts.values() if h.tpu_owner]
    return nodes


def _holdings(
    kind: str,
    slices: Sequence[SliceInfo],
    holders: Mapping[str, Holder],
    wall: float,
    now: float,
) -> list[Holding]:
    """The running work on a kind's busy slices: one holding per reservation that
    recorded itself, and one for the busy slices no one recorded (other tools, a claim
    in flight), which cannot be preempted from here. Slices whose hosts the queue warned
    count as held until their work leaves; those a metadata server warned are going
    away and do not count."""
    anonymous = 0
    mine: dict[str, list[SliceInfo]] = {}
    for info in slices:
        warned = given_by_queue(info.notice)
        if info.idle or not (info.state in _HELD or (info.state is SliceState.NOTICE and warned)):
            continue
        holder = holders.get(info.name)
        if holder is None:
            anonymous += 1
        else:
            mine.setdefault(holder.holder, []).append(info)
    found = [Holding(kind, anonymous)] if anonymous else []
    for holder_id, held in mine.items():
        record = holders[held[0].name]
        lefts = [i.notice.left(wall) for i in held if i.notice and given_by_queue(i.notice)]
        found.append(
            Holding(
                kind,
                len(held),
                tenant=record.tenant,
                priority=record.priority,
                preemptible=record.preemptible,
                started=now - max(0.0, wall - record.since),
                holder=holder_id,
                ends_at=now + min(lefts) if lefts else None,
                who=record.who,
            )
        )
    return found


def _orders(preemptions: Mapping[str, Preemption], reading: Reading, wall: float) -> Orders:
    """What to do to running work after a decision: give the notices of new preemptions,
    take back the slices of holders whose grace ran out, clear the queue's notices on
    hosts whose work left, and forget holder records a dead driver left."""
    slices = {n: s for snap in reading.snapshots.values() for n, s in snap.slices.items()}
    by_id = holders_by_id(reading.holders)
    notices: list[Notice] = []
    preempted = []
    for holder_id, preemption in preemptions.items():
        records = tuple(by_id.get(holder_id, ()))
        preempted.append((preemption, records))
        for record in records:
            info = slices.get(record.slice_name)
            for worker, host in sorted(info.hosts.items()) if info else ():
                notices.append(
                    Notice(
                        kind="preemption",
                        event=preemption.reason,
                        since=wall,
                        deadline=wall + preemption.grace_s,
                        node_id=host.node_id,
                        slice_name=record.slice_name,
                        worker_id=worker,
                        source=QUEUE_SOURCE,
                        holder=holder_id,
                    )
                )
    take_back: list[Holder] = []
    clear: list[str] = []
    stale: list[Holder] = []
    for name, info in slices.items():
        warned = [h for h in info.hosts.values() if given_by_queue(h.notice)]
        holder = reading.holders.get(name)
        if warned and (holder is None or info.idle):
            clear += [h.node_id for h in warned]  # its work left
        elif (
            warned
            and holder is not None
            and all(h.notice and h.notice.left(wall) <= 0 for h in warned)
        ):
            take_back.append(holder)  # its notices go at the next look, once it is gone
        if holder is not None and info.idle and wall - holder.since > STALE_HOLDER_S:
            stale.append(holder)
    return Orders(tuple(notices), tuple(preempted), tuple(take_back), tuple(clear), tuple(stale))
