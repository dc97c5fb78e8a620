"""The cluster-wide queue as a service, without Ray: what the queue actor runs. A decision
reads the cluster once (:meth:`QueueService.read`, the only I/O) and applies the policy
(:meth:`QueueService.apply`, pure), when something changed or, while anyone waits, every
``decide_every_s``. The cluster is the truth about what is held, so after a restart only the
waiters need rebuilding: they enqueue again with their arrival numbers."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from tpuslice._host.notices import Notice
from tpuslice._reserve.queue.book import Answer, Granted, QueueBook, Waiting
from tpuslice._reserve.queue.schedule import Holding, Preemption, Waiter
from tpuslice._reserve.queue.share import Sharing, UsageMeter
from tpuslice._tpu.topology import SliceShape
from tpuslice._view.cluster import ClusterSnapshot, SliceInfo, SliceState, as_freed
from tpuslice._view.holders import QUEUE_SOURCE, Holder, given_by_queue, holders_by_id
from tpuslice._view.queue_record import QueuedRequest, QueueRecord
from tpuslice._view.quotas import Quotas, describe_tenant

USUAL_CHIPS_PER_HOST = 4
DECIDE_EVERY_S = 1.0
"""While anyone waits, decide this often with no news (dying hosts, other tools' work)."""
DEAD_CHECK_S = 1.0
"""While anyone waits, how often the waiters' drivers are looked up in Ray's job table."""
REPROBE_S = 2.0
"""How often hosts busy only by a TPU-owner record are asked again (the owner may be gone)."""


@dataclass(frozen=True)
class SliceKind:
    """The slices that can serve a request: one shape, at the cluster's ``TPU`` units per chip."""

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
    """What a driver sends to enqueue."""

    ticket: str
    kind: SliceKind
    count: tuple[int, int]
    priority: int
    who: str
    """The driver, for status (``pid 12 on host-a``)."""
    job: str
    """The driver's Ray job id (hex), so the queue learns if it dies."""
    time_left_s: float | None = None
    """Seconds to the deadline (``None``: none), made a deadline on the queue's own clock."""
    tenant: str = ""
    preemptible: bool = False
    only: tuple[str, ...] | None = None
    """The slices its label selectors accept, lowest first; ``None``: any of its kind."""


class SliceQueue(Protocol):
    """What a reserving driver asks of the queue (the actor's handle, or a service in memory).
    Calls raise :class:`~tpuslice.errors.QueueUnreachableError` when it is out of reach;
    ``timeout_s`` is how long the queue may hold a call."""

    def join(self, ticket: Ticket, arrival: int | None, timeout_s: float) -> Joined:
        """Enqueue (with the original ``arrival``, to keep the place after a restart) and wait,
        in one call (an uncontended request is granted in it)."""

    def wait(self, ticket: str, timeout_s: float) -> Answer:
        """Where a ticket stands, once granted or never grantable, or after ``timeout_s``."""

    def claimed(self, ticket: str) -> None:
        """The grant is held."""

    def leave(self, ticket: str) -> None:
        """Give up waiting."""

    def released(self, slices: Sequence[str], *, freed: bool = False) -> None:
        """A hand-back of these slices ended (``freed``: Ray showed them free): decide again now."""


@dataclass(frozen=True)
class Joined:
    """What :meth:`SliceQueue.join` answers: the arrival number, and where the ticket stands."""

    arrival: int
    answer: Answer


STALE_HOLDER_S = 60.0
"""A holder record on an idle slice this old was left by a driver that died (a fresh one may
meet a view that does not show its slice busy yet)."""


@dataclass(frozen=True)
class Reading:
    """What one decision read of the cluster."""

    snapshots: Mapping[int, ClusterSnapshot]
    """A snapshot per ``TPU`` units per chip of the kinds waited for."""
    dead: frozenset[str] = frozenset()
    """The waiters' Ray jobs that are dead (looked up now and then)."""
    holders: Mapping[str, Holder] = field(default_factory=dict)
    quotas: Quotas = field(default_factory=Quotas)
    quick: frozenset[str] = frozenset()
    """In a :meth:`QueueService.quick_reading`, the slices just handed back."""


@dataclass(frozen=True)
class Orders:
    """What a decision asks done to running work (I/O its owner carries out after it): notices
    on the hosts of newly preempted holders, each preemption with the holder's records (for
    the timeline), holders whose grace ran out to take back, hosts whose queue notice warns of
    work that has left, and holder records left by drivers that died."""

    notices: tuple[Notice, ...] = ()
    preempted: tuple[tuple[Preemption, tuple[Holder, ...]], ...] = ()
    take_back: tuple[Holder, ...] = ()
    clear: tuple[str, ...] = ()
    stale: tuple[Holder, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.notices or self.preempted or self.take_back or self.clear or self.stale)


class QueueService:
    """One queue for every kind of slice, its I/O given as functions (``reprobe`` asks hosts'
    agents who owns their TPUs; ``None``: never). ``act`` serves :meth:`decide` only (the runner
    acts itself); ``clock`` is monotonic seconds, ``stamp`` wall-clock nanoseconds (arrivals)."""

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
        self._clock = clock
        self._wall = wall
        self._every = decide_every_s
        self._tickets: dict[str, Ticket] = {}
        self._kinds: dict[str, SliceKind] = {}
        self._views: dict[str, tuple[SliceInfo, ...]] = {}
        self._changed = True
        self._freed: set[str] = set()  # handed back free since the last quick reading
        self._freed_in_read: set[str] = set()  # ... since the read under way began
        self._last: Reading | None = None  # the last read applied
        self._decided = -float("inf")
        self._dead_checked = -float("inf")
        self._reprobed = -float("inf")
        self.reads = 0
        self._quotas_set = False  # whether the last decision's read found quotas

    def enqueue(self, ticket: Ticket, arrival: int | None = None) -> int:
        """Add a waiter (again, after a restart, with its original arrival number) and return
        its arrival number; InvalidArgumentError if it has left the queue or its count is bad."""
        left = ticket.time_left_s
        waiter = Waiter(
            ticket.ticket,
            ticket.kind.key,
            ticket.count,
            ticket.priority,
            deadline=None if left is None else self._clock() + left,
            tenant=ticket.tenant,
            preemptible=ticket.preemptible,
            only=None if ticket.only is None else frozenset(ticket.only),
        )
        if not self._tickets:
            # A lull ends: with no one waiting no one read, so the last read is too old to
            # grant freed slices from. While anyone waits the reads follow one another.
            self._last = None
        number = self.book.enqueue(waiter, ticket.who, arrival=arrival)
        self._tickets[ticket.ticket] = ticket
        self._kinds.setdefault(ticket.kind.key, ticket.kind)
        self._changed = True
        return number

    def expect(self, requests: Iterable[QueuedRequest]) -> None:
        """Keep the places in a previous life's last record until their drivers enqueue again."""
        for request in requests:
            waiter = Waiter(
                request.ticket,
                request.kind,
                request.count,
                request.priority,
                arrival=request.arrival or round(request.since * 1e9),
                tenant=request.tenant,
                preemptible=request.preemptible,
            )
            self.book.expect(waiter, request.who)
        self._changed = True

    def answer(self, ticket: str) -> Answer:
        """Where a ticket stands as of the last decision (the requests ahead described, a
        grant with its slices' view); asking renews its lease."""
        answer = self.book.poll(ticket)
        if isinstance(answer, Waiting):
            return replace(answer, ahead=tuple(self._describe(t) for t in answer.ahead))
        if isinstance(answer, Granted):
            return replace(answer, view=self._views.get(ticket, ()), quotas=self._quotas_set)
        return answer

    def wait(self, ticket: str, timeout_s: float = 0.0) -> Answer:
        """Decide if due, then answer at once (the actor holds the call for ``timeout_s``)."""
        self.book.touch([ticket])
        if self.due():
            self.decide()
        return self.answer(ticket)

    def join(self, ticket: Ticket, arrival: int | None = None, timeout_s: float = 0.0) -> Joined:
        """:meth:`enqueue`, then :meth:`wait`."""
        number = self.enqueue(ticket, arrival)
        return Joined(number, self.wait(ticket.ticket, timeout_s))

    def claimed(self, ticket: str) -> None:
        """The driver holds its grant."""
        self.book.claimed(ticket)
        self._forget(ticket)

    def leave(self, ticket: str) -> None:
        """The driver gave up; any grant goes to the next."""
        self.book.leave(ticket)
        self._forget(ticket)

    def released(self, slices: Sequence[str], *, freed: bool = False) -> None:
        """A hand-back of these slices ended: decide again; if Ray's view showed them
        ``freed``, grant them before a read (:meth:`quick_reading`)."""
        self._changed = True
        if freed:
            self._freed.update(slices)
            self._freed_in_read.update(slices)

    def due(self) -> bool:
        """Whether a decision is due: something changed, or someone waits and it is time."""
        wait = self.next_due()
        return wait is not None and wait <= 0.0

    def next_due(self) -> float | None:
        """Seconds until a decision is due (0 or less: now; ``None``: nothing to decide)."""
        if self._changed:
            return 0.0
        if not self.book.tickets():
            return None
        return self._decided + self._every - self._clock()

    def decide(self) -> dict[str, tuple[str, ...]]:
        """Read the cluster once, apply the policy, carry out the orders, publish; new grants."""
        grants = self.apply(self.read())
        orders = self.take_orders()
        if orders:
            self._act(orders)
        self._publish(self.record())
        return grants

    def read(self) -> Reading:
        """The I/O of one decision (:meth:`reader`), done now."""
        return self.reader()()

    def reader(self) -> Callable[[], Reading]:
        """What the next decision must read, fixed now; the function returned (called once)
        does the I/O, on any thread: snapshots, and now and then dead jobs and re-probes."""
        now = self._clock()
        kinds = list({self._kinds[t.kind.key] for t in self._tickets.values()})
        jobs = {t.job for t in self._tickets.values() if t.job}
        if jobs and now - self._dead_checked >= DEAD_CHECK_S:
            self._dead_checked = now
        else:
            jobs = set()
        reprobe = self._reprobe if now - self._reprobed >= REPROBE_S else None
        # The read covers every change so far; one reported during it makes the next due.
        self._changed = False
        self._freed_in_read = set()

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
        """The last read with the slices handed back free since then made ready, to grant
        them with no I/O, even during a read. They only go from held to ready, so this grants
        nothing the next read would not (news missed costs a failed claim and a requeue).
        ``None`` if nothing was freed, no read was made since the last lull, or no freed slice
        is ready. A read slowed by a loaded machine still serves: its age is no bound."""
        freed, self._freed = self._freed, set()
        if not freed or self._last is None:
            return None
        last = self._last
        reading, patched = self._with_freed(last, freed)
        if not patched:
            return None
        # Kept as the last read: a later quick decision must see these slices as this
        # one left them, or it would take their grants for work that is still there.
        self._last = reading
        return replace(reading, dead=frozenset(), quick=frozenset(patched))

    def _with_freed(self, reading: Reading, freed: Collection[str]) -> tuple[Reading, set[str]]:
        """``reading`` with the ``freed`` slices ready (where only their work kept them from
        it) and their holder records gone; and the slices made ready."""
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
        """Drop waiters of dead drivers, count the tenants' use, and grant what the policy
        says; orders to running work are left in :attr:`orders`. Pure. From a
        :meth:`quick_reading` only its freed slices are granted (the full decision is still due)."""
        changed_during_read = self._changed
        quick = bool(reading.quick)
        if not quick and self._freed_in_read:
            # Handed back during this read: it may show them held, yet a quick one granted them.
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
            # A quick decision grants only freed slices: the others are as an older read saw.
            grantable = [s for s in slices if not quick or s.name in reading.quick]
            idle[key] = [s.name for s in grantable if s.state is SliceState.READY]
            suspects[key] = [s.name for s in grantable if s.last_resort]
            trusted[key] = sum(1 for s in slices if s.trusted)
        # Not covered: a first waiter came during the read, or only a restart's placeholders wait.
        unread = {w.kind for w, _, _ in self.book.tickets()} - idle.keys()
        shown_idle = {s for names in [*idle.values(), *suspects.values()] for s in names}
        if quick:  # the book counts claims not yet recorded; a quick read is older than some
            settling = self.book.settling()
        else:
            settling = self.book.settle(shown_idle, reading.holders, quotas_set=quotas.configured)
        for key, slices in by_kind.items():
            unsettled = [s for s in slices if s.name not in settling]
            holding += _holdings(key, unsettled, reading.holders, wall, now)
        usage: dict[str, float] = {}
        if quotas.configured:
            self.meter.with_half_life(quotas.half_life_s, wall)
            if not quick:
                self.meter.tick(Counter(h.tenant for h in reading.holders.values()), wall)
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
        self._last = reading
        self.orders = _orders(self.book.preemptions, reading, wall)
        # Decide again at once if a notice is cleared or a kind a driver waits for went unread.
        waited = unread & {t.kind.key for t in self._tickets.values()}
        changed_during_read = changed_during_read or bool(self.orders.clear) or bool(waited)
        self._decided = self._clock()
        for ticket in list(self._tickets):
            if self.book.entry(ticket) is None:  # its lease ran out
                self._forget(ticket)
        # What it did itself (dropping waiters) is decided; what came during the read is not.
        self._changed = changed_during_read
        return grants

    def take_orders(self) -> Orders:
        """What the last decision asks done to running work, once (empty if already taken)."""
        orders, self.orders = self.orders, Orders()
        return orders

    def record(self) -> QueueRecord:
        """What the queue holds now, for status and for drivers about to reserve."""
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


_HELD = (SliceState.BUSY, SliceState.SUSPECT)  # in use: running work that will give them back


def _owned_hosts(kinds: Iterable[SliceKind], snapshots: Mapping[int, ClusterSnapshot]) -> list[str]:
    """Hosts of busy slices of these kinds that a (maybe stale) TPU-owner record marks."""
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
    """The work on a kind's busy slices: one holding per recorded reservation, and one that
    cannot be preempted for slices no one recorded. Slices the queue warned count until their
    work leaves; those a metadata server warned are going away and do not."""
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
    """The orders after a decision (:class:`Orders`)."""
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
