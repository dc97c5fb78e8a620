"""The claiming loop behind :class:`~tpuslice._reserve.reserve.SlicePlacementGroup`.

Look at the cluster, pick every idle whole slice still needed, then place one worker
group for them all (or one per slice) in one round: bundle *i* is pinned by label to
worker *i* of its slice, and each slice's bundle 0 also holds worker 0's
``TPU-<podtype>-head`` resource, the claim other reservers (Ray's own included) respect.
A group is placed whole or not at all, so a slice someone takes meanwhile leaves nothing
of ours on it: the group does not place within a short bound, the slice is given back,
and another tried. Whole-slice reservations of one process do not race each other: each
sees the slices the others are claiming as busy (:class:`ClaimsHere`). Any failure or interrupt
removes everything made so far.

Slices with a suspect host (one that failed a run lately) are picked only as a last
resort (:func:`tpuslice._queue.schedule.last_resort`); a claim of one says so
(:attr:`Claim.suspect`), and the log says why it was taken.

When the request cannot be met at once, or others already wait for its kind of slice,
it waits in the cluster-wide queue (:mod:`tpuslice._queue.actor`) and claims exactly the
slices the queue grants it, all at once: it never holds some slices while it waits for
more. If no queue can be reached, it polls the cluster on its own (claiming what it
can, in no arrival order) and the log says so once.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import threading
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from ray.util.placement_group import PlacementGroup

from tpuslice._queue.book import Answer, Granted, Never, Waiting
from tpuslice._queue.place import QueuePlace
from tpuslice._queue.service import SliceKind
from tpuslice._reserve.demand import AutoscalerDemand
from tpuslice._reserve.ops import RAY_OPS, ClusterOps
from tpuslice._reserve.plan import ReservationPlan
from tpuslice._reserve.request import SliceRequest
from tpuslice._reserve.targets import Targets, WholeSlices
from tpuslice._tpu.clock import Clock
from tpuslice._tpu.labels import SLICE_NAME_LABEL, WORKER_ID_LABEL
from tpuslice._view.cluster import ClusterSnapshot, HostInfo, SliceInfo, SliceState
from tpuslice.errors import (
    InsufficientSlicesError,
    QueueUnreachableError,
    ReservationTimeoutError,
)

logger = logging.getLogger(__name__)

CLAIM_BOUND_S = 2.0
"""How long a claimed slice's groups may take to place before we give it back."""
POLL_S = (0.05, 0.5)
"""First and largest pause between looks at the cluster while waiting for a slice."""
REPROBE_S = 2.0
"""How often a waiting reservation re-asks about slices busy only by a TPU owner record."""
QUEUE_POLL_S = 0.05
"""Pause between asks of a queue that answers at once (in memory, or not answering)."""
QUEUE_LOOK_S = 1.0
"""While queued on a cluster that can grow, how often the cluster itself is read (to
keep the autoscaler's demand)."""
QUEUE_GRACE_S = 20.0
"""How long a queued reservation keeps asking a queue that stopped answering (Ray
restarts a dead queue in a few seconds) before it claims directly instead."""
FREE_KEY_TRUST_S = 1.0
"""How old a cluster read may be for the agents' free keys it listed to spare their hosts
the owner ask. An agent looks at its TPU every half second and withdraws its key when it
finds an owner; a read older than this could miss a process that took the TPU since, so
those hosts are asked instead."""
PROGRESS_S = 10.0
"""While queued, how long the queue may hold one ask; then the log says where the
reservation stands, and it asks again."""


class FallbackWarning:
    """The warning that reservations wait without the cluster-wide queue: logged once per
    process, however many reservations fall back."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._said = False

    def say(self, exc: QueueUnreachableError) -> None:
        """Log the warning, with why the queue could not be reached, if not said yet.

        Args:
            exc: Why the queue could not be reached.
        """
        with self._lock:
            if self._said:
                return
            self._said = True
        logger.warning(
            "%s; reservations wait without the cluster-wide queue (no arrival order)", exc
        )


FALLBACK_WARNING = FallbackWarning()
"""This process's warning that it claims without the queue."""

CLAIMING_HERE_REASON = "being claimed by another reservation of this process"
CLAIMING_ELSEWHERE_REASON = "being claimed by a reservation of another process"
CLAIMING_STALE_S = 10.0
"""Age past which another process's ``claiming/<slice>`` record is ignored: a claim
places or gives up within :data:`CLAIM_BOUND_S` of its last pick, so an older record's
writer died or hung before deleting it."""


class ClaimsHere:
    """The whole slices this process's reservations are claiming, each until its
    reservation ends or gives it back, and the ones other processes are claiming.

    Ray's view shows a slice held only once a group placed on it, so reservations that
    start at the same moment would all pick the same first idle slice: all but one would
    then wait out :data:`CLAIM_BOUND_S` for a group that cannot place, and remove it
    while Ray may still be placing it. So a whole-slice reservation sees the ready
    slices another reservation of this process is claiming as busy; and before it claims
    a slice it records so cluster-wide, in one test-and-set
    (:meth:`~tpuslice._reserve.ops.ClusterOps.mark_claiming`): a slice whose record
    another process holds is passed over, and shown busy to this reservation for
    :data:`CLAIM_BOUND_S`, so that it queues instead. Still racing, since a group places
    whole or not at all and a lost race costs only time: sub-slice claims, a reservation
    that read Ray's view just before another's group placed (Ray reports freed and taken
    resources within about 100 ms), and two processes taking over one stale record.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by: dict[str, object] = {}
        """Slice name -> the reservation claiming it."""
        self._marked: dict[str, tuple[object, ClusterOps, str]] = {}
        """Slice name -> the reservation here whose cluster-wide record stands, with the
        operations that wrote it and its token."""
        self._elsewhere: dict[object, dict[str, float]] = {}
        """Reservation -> slice name -> until when that slice shows busy to it: another
        process is claiming it (learned by this reservation, forgotten when it ends)."""

    def hide(self, snapshot: ClusterSnapshot, reserver: object, now: float) -> ClusterSnapshot:
        """The snapshot with the slices other reservations are claiming shown busy.

        Args:
            snapshot: The cluster as read.
            reserver: The reservation that looks.
            now: The time now, on the reservation's clock.

        Returns:
            The snapshot, or a copy with those slices busy.
        """
        with self._lock:
            return self._hide(snapshot, reserver, now)

    def pick(
        self,
        snapshot: ClusterSnapshot,
        reserver: object,
        choose: Callable[[ClusterSnapshot], Mapping[int, SliceInfo]],
        *,
        now: float,
        ops: ClusterOps | None = None,
        token: str = "",
    ) -> dict[int, SliceInfo]:
        """Choose among the slices no other reservation claims, and record the chosen
        ones as this reservation's (here, and cluster-wide through ``ops``), in one step.
        A slice whose cluster-wide record another process holds is passed over, and the
        choice made again without it.

        Args:
            snapshot: The cluster as read.
            reserver: The reservation that picks.
            choose: Picks targets from a snapshot.
            now: The time now, on the reservation's clock.
            ops: Where the cluster-wide records are kept (``None``: none are).
            token: The reservation's token in those records.

        Returns:
            What ``choose`` picked.
        """
        marked_now: list[str] = []
        refused: set[str] = set()
        with self._lock:
            while True:  # ends: each round refuses a slice it had not refused before
                picks = dict(choose(self._hide(snapshot, reserver, now, refused)))
                lost = [
                    t.name
                    for t in picks.values()
                    if ops is not None and not self._mark(t.name, reserver, ops, token, marked_now)
                ]
                if not lost:
                    break
                refused.update(lost)
                for name in lost:
                    self._elsewhere.setdefault(reserver, {})[name] = now + CLAIM_BOUND_S
            chosen = {target.name for target in picks.values()}
            for name in chosen:
                self._by[name] = reserver
            unmark = [name for name in marked_now if name not in chosen]
            for name in unmark:
                del self._marked[name]
        for name in unmark:
            assert ops is not None
            ops.unmark_claiming(name, token)
        return picks

    def keep_only(self, reserver: object, names: Collection[str] = ()) -> None:
        """Forget the slices ``reserver`` no longer claims, here and cluster-wide.

        Args:
            reserver: The reservation.
            names: The slices it still claims (none once it ended, or gave back
                all: then what it learned of other processes' claims goes too).
        """
        with self._lock:
            for name in [n for n, r in self._by.items() if r is reserver and n not in names]:
                del self._by[name]
            if not names:
                self._elsewhere.pop(reserver, None)
            ended = [
                (name, ops, token)
                for name, (r, ops, token) in self._marked.items()
                if r is reserver and name not in names
            ]
            for name, _, _ in ended:
                del self._marked[name]
        for name, ops, token in ended:
            ops.unmark_claiming(name, token)

    def _mark(
        self, name: str, reserver: object, ops: ClusterOps, token: str, marked: list[str]
    ) -> bool:
        standing = self._marked.get(name)
        if standing is not None and standing[0] is reserver:
            return True
        if not ops.mark_claiming(name, token, CLAIMING_STALE_S):
            return False
        self._marked[name] = (reserver, ops, token)
        marked.append(name)
        return True

    def _hide(
        self,
        snapshot: ClusterSnapshot,
        reserver: object,
        now: float,
        refused: Collection[str] = (),
    ) -> ClusterSnapshot:
        """``refused``: slices shown busy whatever their state (a suspect one too, which
        would otherwise still be picked as a last resort)."""
        elsewhere = self._elsewhere.get(reserver, {})
        for name in [n for n, until in elsewhere.items() if until <= now]:
            del elsewhere[name]
        reasons = {n: CLAIMING_ELSEWHERE_REASON for n in elsewhere}
        reasons.update({n: CLAIMING_HERE_REASON for n, r in self._by.items() if r is not reserver})
        hidden = [n for n in reasons if n in snapshot.slices]
        if not hidden:
            return snapshot
        slices = dict(snapshot.slices)
        for name in hidden:
            # Broken or suspect slices stay so (a shortage is still told at once).
            if slices[name].state is SliceState.READY or name in refused:
                slices[name] = replace(slices[name], state=SliceState.BUSY, reason=reasons[name])
        return replace(snapshot, slices=slices)


CLAIMS_HERE = ClaimsHere()
"""This process's reservations' claims in progress."""


@dataclass
class Claim:
    """One slice held by this reservation: its head group and its worker group(s)."""

    index: int
    target: SliceInfo
    head_pg: PlacementGroup | None = None
    worker_pg: PlacementGroup | None = None
    owners: Callable[[], Mapping[str, str | None]] | None = None
    """The answer, once waited for, of the hosts asked who owns their TPUs (``None``
    once checked, or for a slice that was not asked)."""

    @property
    def slice_name(self) -> str:
        return self.target.name

    @property
    def suspect(self) -> bool:
        """Whether the slice was taken as a last resort: a host of it is suspect (its
        records are the target's :attr:`~tpuslice._view.cluster.SliceInfo.suspects`)."""
        return self.target.state is SliceState.SUSPECT


@dataclass
class Reservation:
    """The groups of a finished reservation, in slice-index order."""

    claims: list[Claim] = field(default_factory=list)
    combined_pg: PlacementGroup | None = None
    plan: ReservationPlan | None = None
    """The plan reserved: for a range of slices, with the count granted."""
    queued_s: float = 0.0
    """Of the time to reserve, how long it waited for slices (in the queue, or polling
    a cluster with none idle), as against claiming and placing them."""
    arrival: int | None = None
    """Its place in the queue's arrival order, if it waited there."""
    recorded: bool = False
    """Whether the queue is told whose its slices are (:mod:`tpuslice._view.holders`):
    with quotas set, or for work that may be preempted. Other work the queue may take as
    no one's, and it costs the reservation nothing."""

    @property
    def suspects(self) -> list[SliceInfo]:
        """The slices taken as a last resort (a host of each is suspect), in slice order."""
        return [c.target for c in self.claims if c.suspect]


class Reserver:
    """Claims the slices of one request; on any failure or interrupt, removes all it made.

    Every cluster operation goes through ``ops`` (Ray's by default) and all time through
    ``clock``, so each step is tested against an in-memory cluster.
    """

    def __init__(
        self,
        request: SliceRequest,
        *,
        clock: Clock | None = None,
        ops: ClusterOps = RAY_OPS,
        heads_only: bool = False,
        targets: Targets | None = None,
    ) -> None:
        self.request = request
        self.plan = request.plan
        self.timeout = request.head_reservation_timeout_s
        self.clock = clock or Clock()
        self.ops = ops
        self.heads_only = heads_only
        self.low, self.high = request.slice_range
        """Slices wanted: at least ``low``, as many as are idle up to ``high``. The plan
        is for ``high`` until the count is fixed (:meth:`_fix_count`)."""
        self.deadline: float | None = None
        """When the reservation gives up (on :attr:`clock`), once it runs."""
        self.started = 0.0
        """When it began to run (on :attr:`clock`): its queue ticket says how long ago."""
        self.targets: Targets = targets or WholeSlices(request.plan, self.low, self.time_left)
        self.claims: dict[int, Claim] = {}
        self.in_flight: list[PlacementGroup] = []
        """Groups created but not yet recorded in a claim: removed too if we stop."""
        self.unasked: list[Claim] = []
        """Slices picked whose hosts are not asked yet who owns their TPUs (asked once
        their worker groups are created)."""
        self._seen_free: frozenset[str] = frozenset()
        """The hosts the latest read or listing found seen free by their agents."""
        self._seen_free_at = float("-inf")
        """When that read or listing was taken (on :attr:`clock`; never, after a grant)."""
        self._next_reprobe = 0.0
        self.demand: AutoscalerDemand | None = None
        self._can_grow: bool | None = None
        self.place: QueuePlace | None = None
        """Our ticket in the cluster-wide queue, while we wait there."""
        self.queueable = isinstance(self.targets, WholeSlices) and not self.plan.user_selectors
        """Whether this request waits in the queue (pinned or labelled requests, and
        sub-slices, claim directly)."""
        self.kind = SliceKind(self.plan.shape, self.plan.tpu_resource_per_chip)
        self.token = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        """This reservation in the cluster-wide claiming records."""
        self.quotas_set = False
        """Whether the cluster had quotas at the last read (then the queue is told whose
        the slices are)."""
        self.waited_s = 0.0
        """Time spent waiting for slices so far (the queue's answer, or polling)."""

    def can_grow(self) -> bool:
        """Whether the cluster has an autoscaler (read once per reservation).

        Returns:
            True if it can grow.
        """
        if self._can_grow is None:
            self._can_grow = self.ops.can_grow()
        return self._can_grow

    def time_left(self) -> float | None:
        """Seconds to the deadline now (never below 0).

        Returns:
            The seconds; ``None`` before the reservation runs, or without a deadline.
        """
        return None if self.deadline is None else max(0.0, self.deadline - self.clock.now())

    def run(self) -> Reservation:
        """Claim every slice and place every worker bundle; return them in slice order.

        Returns:
            The held groups, head claims and worker groups, in slice-index order.

        Raises:
            InsufficientSlicesError: the cluster lacks the slices and cannot grow.
            ReservationTimeoutError: the timeout passed first; the message says what the
                cluster has and what this reservation held.
            KeyboardInterrupt: as raised; like every error, after all groups are removed.
        """
        started = self.clock.now()
        self.started = started
        deadline = None if self.timeout is None else started + self.timeout
        self.deadline = deadline
        pause = POLL_S[0]
        try:
            while True:
                granted = None
                if self.place is not None:
                    waiting_since = self.clock.now()
                    try:
                        granted = self._wait_for_grant(deadline, started)
                    finally:
                        self.waited_s += self.clock.now() - waiting_since
                if granted is not None and granted.view:
                    snapshot = ClusterSnapshot({s.name: s for s in granted.view})
                    # As old as the queue's read, which the grant does not say: the free
                    # keys are listed again before any host is spared.
                    self._seen_free_at = -math.inf
                else:
                    read_at = self.clock.now()
                    snapshot = self.ops.snapshot(self.plan.tpu_resource_per_chip)
                    self._note_seen_free(snapshot, read_at)
                snapshot = self.targets.prepare(snapshot)
                if isinstance(self.targets, WholeSlices):
                    snapshot = CLAIMS_HERE.hide(snapshot, self, self.clock.now())
                self._drop_broken(snapshot)
                if granted is not None:
                    self._fix_count(len(granted.slices))
                    self._claim(_only(snapshot, granted.slices))
                    if len(self.claims) < self.plan.num_slices:
                        self._requeue("a granted slice was taken meanwhile")
                        self._check_deadline(deadline, snapshot, started)
                        self.clock.sleep(QUEUE_POLL_S)
                        continue
                elif self.place is None and self._should_queue(snapshot):
                    self._join_queue(snapshot)
                    continue
                elif self.place is None and self._can_start(snapshot):
                    self._claim(snapshot)
                    if 0 < len(self.claims) < self.plan.num_slices and self._should_queue(
                        snapshot, after_claiming=True
                    ):
                        self._join_queue(snapshot)
                        continue
                self._follow_demand(snapshot)
                if self.claims and len(self.claims) == self.plan.num_slices:
                    self._end_demand()
                    reservation = (
                        Reservation([self.claims[i] for i in sorted(self.claims)], plan=self.plan)
                        if self.heads_only
                        else self._place_workers()
                    )
                    if reservation is not None and self._free_of_owners(reservation):
                        # Placed: Ray's view shows the slices held from now on. While
                        # the groups are still in flight, so that an interrupt here
                        # gives them back.
                        CLAIMS_HERE.keep_only(self)
                        self.in_flight = []
                        if self.place is not None:
                            place, self.place = self.place, None
                            _quietly(place.claimed)
                            reservation.arrival = place.arrival
                        reservation.queued_s = self.waited_s
                        reservation.recorded = self.quotas_set or self.request.preemptible
                        return reservation
                    self._check_deadline(deadline, snapshot, started)
                    if self.place is not None:
                        self._requeue("a granted slice could not be placed")
                    continue  # retry placing at once: the failed wait was the pause
                if self.place is not None:
                    continue
                self._check_possible(snapshot)
                self._check_deadline(deadline, snapshot, started)
                wait = pause if deadline is None else min(pause, deadline - self.clock.now())
                self.clock.sleep(max(0.0, wait))
                self.waited_s += max(0.0, wait)
                pause = min(pause * 2, POLL_S[1])
        except BaseException:
            self.release_all()  # forgets this reservation's claims, here and cluster-wide
            raise

    def release_all(self) -> None:
        """Remove every group this reserver made (claims and autoscaler demand), and
        leave the queue."""
        place, self.place = self.place, None
        self._end_demand()
        self._give_back_all()
        if place is not None:
            _quietly(place.leave)

    # --- the queue ---------------------------------------------------------------------

    def _can_start(self, snapshot: ClusterSnapshot) -> bool:
        """For a range, fix the count to what is idle now (up to ``high``), if at least
        ``low`` is; an int request can always try."""
        if not self.request.elastic or self.claims:
            return True
        idle = len(self.targets.pick(snapshot, {}))
        if idle < self.low:
            return False
        self._fix_count(min(idle, self.high))
        return True

    def _fix_count(self, count: int) -> None:
        """Reserve ``count`` slices (within the range): the plan and targets follow."""
        if count != self.plan.num_slices and self.request.elastic:
            self.plan = replace(self.request.plan, num_slices=count)
            self.targets = WholeSlices(self.plan, count, self.time_left)

    def _should_queue(self, snapshot: ClusterSnapshot, *, after_claiming: bool = False) -> bool:
        """Wait in the queue when others already wait for this kind of slice, or when
        there are not enough idle ones to take all at once (so none is held idle), or
        when the cluster has quotas (only the queue applies them)."""
        if not self.queueable:
            return False
        if after_claiming or snapshot.quotas.configured:
            return True
        if self._others_wait(snapshot):
            return True
        picks = self.targets.pick(snapshot, {})
        return len(picks) < self.low

    def _others_wait(self, snapshot: ClusterSnapshot) -> bool:
        """Whether the queue's record shows requests for this kind. A record too old to
        describe a live queue still counts while it lists requests not yet granted: the
        queue writes one at every decision while anyone waits, so it is slow (a loaded
        cluster) or gone, and enqueueing finds out which; a reservation that claimed an
        idle slice instead would go ahead of them."""
        if snapshot.queued(self.kind.key):
            return True
        record = snapshot.queue
        return record is not None and any(
            r.kind == self.kind.key and not r.granted for r in record.requests
        )

    def _join_queue(self, snapshot: ClusterSnapshot) -> None:
        """Give back anything claimed, then enqueue; if no queue answers, say so once
        and claim directly from now on. Its time counts as waiting for slices: on a fresh
        cluster, reaching the queue means waiting for it to start."""
        self._check_possible(snapshot)
        joining = self.clock.now()
        try:
            self._enqueue()
        finally:
            self.waited_s += self.clock.now() - joining

    def _enqueue(self) -> None:
        try:
            queue = self.ops.slice_queue()
        except QueueUnreachableError as exc:
            self._fall_back(exc)
            return
        place = QueuePlace(
            queue,
            self.kind,
            (self.low, self.high),
            self.request.priority,
            self.time_left,
            tenant=self.request.tenant or "",
            preemptible=self.request.preemptible,
            arrival=self.request.arrival_ns,
            asked=lambda: self.clock.now() - self.started,
        )
        try:
            place.join()
        except QueueUnreachableError as exc:
            _quietly(place.leave)  # it may have been enqueued after all
            self._fall_back(exc)
            return
        self.place = place
        self._give_back_all()

    def _wait_for_grant(self, deadline: float | None, started: float) -> Granted | None:
        """Ask the queue until it grants slices (returned); ``None`` if the queue stopped
        answering and the reservation falls back to claiming directly. Each ask is held
        by the queue until the grant, the deadline, or :data:`PROGRESS_S` (then the log
        says where the reservation stands). The cluster is read only when the queue says
        the request can never be met (to say why, or to wait for the autoscaler), and,
        on a cluster that can grow, every :data:`QUEUE_LOOK_S` to keep the autoscaler's
        demand. Raises at the deadline."""
        assert self.place is not None
        lost_at: float | None = None
        growing = self.targets.autoscaling and self.can_grow()
        if growing:  # the autoscaler sees the demand from the start
            self._follow_demand(self.targets.prepare(self._read()))
        while True:
            now = self.clock.now()
            if deadline is not None and now >= deadline:
                raise self._timeout_error(self._read(), started)
            hold = QUEUE_LOOK_S if growing else PROGRESS_S
            if deadline is not None:
                hold = min(hold, deadline - now)
            try:
                answer: Answer | None = self.place.wait(hold)
                lost_at = None
            except QueueUnreachableError as exc:
                # It may be restarting: keep asking for a while before giving up on it.
                lost_at = now if lost_at is None else lost_at
                if self.clock.now() - lost_at >= QUEUE_GRACE_S:
                    place, self.place = self.place, None
                    _quietly(place.leave)
                    self._fall_back(exc)
                    return None
                answer = None
            if isinstance(answer, Granted):
                return answer
            if isinstance(answer, Never) or growing:
                snapshot = self.targets.prepare(self._read())
                self._check_possible(snapshot)
                self._follow_demand(snapshot)
            if isinstance(answer, Waiting) and self.clock.now() - now >= hold:
                logger.info(
                    "waiting %.0f s for %s: %s",
                    self.clock.now() - started,
                    self.plan.describe(),
                    self.place.describe(),
                )
            if self.clock.now() - now < QUEUE_POLL_S:
                # Answered at once (a queue in memory, or one not answering): pause.
                self.clock.sleep(QUEUE_POLL_S)

    def _read(self) -> ClusterSnapshot:
        snapshot = self.ops.snapshot(self.plan.tpu_resource_per_chip)
        self.quotas_set = snapshot.quotas.configured
        return snapshot

    def _requeue(self, why: str) -> None:
        """Give the granted slices back and wait again in the same place."""
        assert self.place is not None
        logger.info("%s; queueing again in the same place", why)
        self._give_back_all()
        try:
            self.place.requeue()
        except QueueUnreachableError as exc:
            place, self.place = self.place, None
            _quietly(place.leave)
            self._fall_back(exc)

    def _fall_back(self, exc: QueueUnreachableError) -> None:
        self.queueable = False
        FALLBACK_WARNING.say(exc)

    def _give_back_all(self) -> None:
        for group in self.in_flight:
            self.ops.remove_group(group)
        self.in_flight = []
        for claim in self.claims.values():
            self.ops.remove_group(claim.worker_pg)
            self.ops.remove_group(claim.head_pg)
        self.claims.clear()
        CLAIMS_HERE.keep_only(self)

    # --- steps -----------------------------------------------------------------------

    def _drop_broken(self, snapshot: ClusterSnapshot) -> None:
        """Give back claims one of whose hosts died or left while we waited for the rest."""
        now = _hosts(snapshot)
        for index, claim in list(self.claims.items()):
            if any(
                h.node_id not in now or not now[h.node_id].alive
                for h in claim.target.hosts.values()
            ):
                logger.info("slice %s broke while reserving; giving it back", claim.slice_name)
                self.ops.remove_group(claim.head_pg)
                del self.claims[index]
                self._forget_given_back()

    def _claim(self, snapshot: ClusterSnapshot) -> None:
        """Take every idle slice we still need; their hosts are asked who owns their TPUs
        once their groups are created (answered while the groups place; checked once
        they placed: :meth:`_ask_owners`). Nothing is placed
        here: :meth:`_place_workers` places them all in one round, their heads in bundle
        0 of each. Only ``reserve_tpu_slice`` (``heads_only``) places head groups, and
        keeps those that place."""
        taken = {i: c.slice_name for i, c in self.claims.items()}
        picks = (
            CLAIMS_HERE.pick(
                snapshot,
                self,
                lambda view: self.targets.pick(view, taken),
                now=self.clock.now(),
                ops=self.ops,
                token=self.token,
            )
            if isinstance(self.targets, WholeSlices)
            else self.targets.pick(snapshot, taken)
        )
        if not picks:
            self._reprobe_owned(snapshot)
            return
        fresh = [Claim(index, target) for index, target in picks.items()]
        for claim in fresh:
            if claim.suspect:
                logger.info(
                    "taking %s as a last resort (no trusted slice could serve %s in time): %s",
                    claim.slice_name,
                    self.plan.describe(),
                    claim.target.reason,
                )
        if not self.heads_only:
            for claim in fresh:
                self.claims[claim.index] = claim
            self.unasked += fresh
            return
        for claim in fresh:
            claim.head_pg = self._head_group(claim.target)
            self.in_flight.append(claim.head_pg)
        self._ask_owners(fresh)
        placed = self.ops.wait_placed(self.in_flight, CLAIM_BOUND_S)
        self.in_flight = []
        for claim, ok in zip(fresh, placed, strict=True):
            if ok:
                self.claims[claim.index] = claim
            else:
                logger.info("head of %s was taken meanwhile; trying another", claim.slice_name)
                self.ops.remove_group(claim.head_pg)
        self._forget_given_back()

    def _ask_owners(self, claims: Sequence[Claim]) -> None:
        """Ask the hosts of slices just picked who owns their TPUs, without waiting for
        the answers (:meth:`_free_of_owners` does). Called once their groups are
        created, so that the asks (for a fresh driver, first a lookup of each host's
        agent) go while Ray places the groups rather than before. A host whose agent,
        as the latest cluster read found, last saw its TPU free is not asked: the agent
        looks every half second, and an answer would only repeat that. The latest read,
        not the one the slice was picked on: a multi-slice reservation without the queue
        may have picked some slices rounds ago, and a process may have taken a TPU since.
        When that read is older than :data:`FREE_KEY_TRUST_S`, or the slices came with a
        queue grant (whose view is as old as the queue's read), the keys are listed again
        first: one call, where asking is a round trip to each host's agent."""
        if self.clock.now() - self._seen_free_at > FREE_KEY_TRUST_S:
            listed_at = self.clock.now()
            self._seen_free, self._seen_free_at = self.ops.free_hosts(), listed_at
        trusted = self._seen_free
        asked = [
            h.node_id
            for claim in claims
            for h in claim.target.hosts.values()
            if h.node_id not in trusted
        ]
        if not asked:
            return
        probe = functools.cache(self.ops.start_owner_probe(asked))
        for claim in claims:
            claim.owners = probe

    def _note_seen_free(self, snapshot: ClusterSnapshot, read_at: float) -> None:
        """Keep which hosts this read lists as seen free by their agents, and when."""
        self._seen_free = frozenset(
            h.node_id for s in snapshot.slices.values() for h in s.hosts.values() if h.tpu_seen_free
        )
        self._seen_free_at = read_at

    def _free_of_owners(self, reservation: Reservation) -> bool:
        """Whether no host of the placed reservation has its TPU owned by a process (the
        answers were asked for when the slices were picked). If some do, those slices are
        given back, the others' worker groups removed for the next round, and ``False``.
        The groups stay in flight (removed if we are interrupted) until this returns."""
        held: dict[int, list[str]] = {}
        for claim in reservation.claims:
            if claim.owners is None:
                continue
            answers, claim.owners = claim.owners(), None
            owned = [
                f"host {w}: TPU held by {answers[h.node_id]}"
                for w, h in claim.target.hosts.items()
                if answers.get(h.node_id)
            ]
            if owned:
                held[claim.index] = owned
        if not held:
            return True
        self.ops.remove_group(reservation.combined_pg)
        self.in_flight = []
        for claim in reservation.claims:
            self.ops.remove_group(claim.worker_pg)
            claim.worker_pg = None
            if claim.index in held:
                reason = "; ".join(held[claim.index])
                logger.info("slice %s is not free (%s); trying another", claim.slice_name, reason)
                self._give_back(claim)
        return False

    def _reprobe_owned(self, snapshot: ClusterSnapshot) -> None:
        """No idle slice: ask again, now and then, about slices busy only because a
        process was seen owning a TPU there, so a record of one that has since exited
        cannot keep its slice busy. The agents update the records the view reads."""
        now = self.clock.now()
        if now < self._next_reprobe:
            return
        self._next_reprobe = now + REPROBE_S
        nodes = [
            host.node_id
            for info in snapshot.matching(self.plan.shape, self.plan.tpu_resource_per_chip)
            if info.state in (SliceState.BUSY, SliceState.SUSPECT)
            for host in info.hosts.values()
            if host.tpu_owner
        ]
        if nodes:
            self.ops.start_owner_probe(nodes)()

    def _follow_demand(self, snapshot: ClusterSnapshot) -> None:
        """On a cluster that can grow, keep the missing slices visible to the autoscaler
        and adopt the idle slices its demand groups land on (while queued, a landed
        group is let go instead: the queue grants the new slice in its order)."""
        missing = self.plan.num_slices - len(self.claims)
        if not missing or not self.targets.autoscaling:
            return
        if self.plan.pinned_slice_name(0) or not self.can_grow():
            return
        if self.demand is None:
            self.demand = AutoscalerDemand(self.plan, self.ops)
        existing = {
            s.name for s in snapshot.matching(self.plan.shape, self.plan.tpu_resource_per_chip)
        }
        for group, target in self.demand.landed(snapshot):
            if self.place is not None:
                # Queued: the new slice is the queue's to grant, in its order; our demand
                # only made the autoscaler add it.
                self.ops.remove_group(group)
                continue
            free = [i for i in range(self.plan.num_slices) if i not in self.claims]
            claimed = {c.slice_name for c in self.claims.values()}
            idle = target.chips_free == target.chips_total and not target.missing_workers
            if (
                free
                and idle
                and target.name not in claimed
                and target.matches(self.plan.shape, self.plan.tpu_resource_per_chip)
            ):
                self.claims[free[0]] = Claim(free[0], target, head_pg=group)
            else:
                self.ops.remove_group(group)
        self.demand.keep(self.plan.num_slices - len(self.claims), existing)

    def _end_demand(self) -> None:
        if self.demand is not None:
            self.demand.release()
            self.demand = None

    def _head_group(self, target: SliceInfo) -> PlacementGroup:
        selector = {SLICE_NAME_LABEL: target.name, WORKER_ID_LABEL: "0"}
        return self.ops.create_group(
            [{self.plan.shape.head_resource: 1}], [selector], lifetime=self.plan.lifetime
        )

    def _place_workers(self) -> Reservation | None:
        """Create every worker group at once and wait for them; ``None`` (and the
        slices someone else took given back) if they did not place within the bound."""
        claims = [self.claims[i] for i in sorted(self.claims)]
        unasked = [c for c in self.unasked if self.claims.get(c.index) is c]
        self.unasked = []
        if self.plan.pg_per_slice:
            for claim in claims:
                claim.worker_pg = self._worker_group([claim], f"_slice_{claim.index}")
            groups = [c.worker_pg for c in claims if c.worker_pg]
            self.in_flight = list(groups)  # until the caller has checked the TPU owners too
            self._ask_owners(unasked)
            placed = self.ops.wait_placed(groups, CLAIM_BOUND_S)
            if all(placed):
                return Reservation(claims, plan=self.plan)
            for claim in claims:  # the workers go first: a claim given back no longer has them
                self.ops.remove_group(claim.worker_pg)
                claim.worker_pg = None
            self.in_flight = []
            self._give_back_busy([c for c, ok in zip(claims, placed, strict=True) if not ok])
            return None
        combined = self._worker_group(claims, "")
        self.in_flight = [combined]  # until the caller has checked the TPU owners too
        self._ask_owners(unasked)
        if all(self.ops.wait_placed([combined], CLAIM_BOUND_S)):
            return Reservation(claims, combined, self.plan)
        self.ops.remove_group(combined)
        self.in_flight = []
        self._give_back_busy(claims)
        return None

    def _worker_group(self, claims: Sequence[Claim], suffix: str) -> PlacementGroup:
        """One group for these slices: each host's bundles pinned to it by label, and,
        for a slice claimed through its head with no head group of its own, the head
        resource in its bundle 0 (worker 0's first bundle)."""
        bundles: list[dict[str, float]] = []
        selectors: list[dict[str, str]] = []
        head = self.plan.shape.head_resource
        for claim in claims:
            selectors += self.plan.worker_selectors(claim.index, claim.target)
            block = [dict(self.plan.bundle_resources) for _ in range(self.plan.bundles_per_slice)]
            if self.targets.head_claims and claim.head_pg is None:
                block[0][head] = 1.0
            bundles += block
        name = f"{self.plan.name}{suffix}" if self.plan.name else ""
        return self.ops.create_group(
            bundles,
            selectors,
            strategy=self.plan.strategy,
            name=name,
            lifetime=self.plan.lifetime,
        )

    def _give_back(self, claim: Claim) -> None:
        logger.info("could not place the hosts of %s; giving it back", claim.slice_name)
        self.ops.remove_group(claim.head_pg)
        self.claims.pop(claim.index, None)
        self._forget_given_back()

    def _forget_given_back(self) -> None:
        """The process's record of claims in progress keeps only the slices still held."""
        CLAIMS_HERE.keep_only(self, {c.slice_name for c in self.claims.values()})

    def _give_back_busy(self, claims: Sequence[Claim]) -> None:
        """After a group failed to place: drop the slices someone else took meanwhile
        (a host gone, dead or in use); keep the rest for the next round."""
        now = _hosts(self.ops.snapshot(self.plan.tpu_resource_per_chip))
        for claim in claims:
            # A head held by a group of our own (adopted demand) is not someone else's.
            ours = claim.head_pg is not None
            if any(_taken(now.get(h.node_id), ours) for h in claim.target.hosts.values()):
                self._give_back(claim)

    def _check_possible(self, snapshot: ClusterSnapshot) -> None:
        """Fail at once if the cluster lacks the slices (the minimum of a range) and
        cannot grow to have them."""
        least = (
            WholeSlices(replace(self.request.plan, num_slices=self.low))
            if self.request.elastic
            else self.targets
        )
        reason = least.shortage(snapshot)
        if not reason:
            return
        if not self.targets.autoscaling:  # new slices would not help (sub-slices)
            raise InsufficientSlicesError(f"cannot reserve {self.plan.describe()}: {reason}")
        if not self.can_grow():
            raise InsufficientSlicesError(
                f"cannot reserve {self.plan.describe()}: {reason}; "
                f"{self.targets.explain(snapshot)}. The cluster has no autoscaler, so waiting "
                "would not help: add slices, or ask for fewer"
            )

    def _check_deadline(
        self, deadline: float | None, snapshot: ClusterSnapshot, started: float
    ) -> None:
        if deadline is not None and self.clock.now() >= deadline:
            raise self._timeout_error(snapshot, started)

    def _timeout_error(self, snapshot: ClusterSnapshot, started: float) -> ReservationTimeoutError:
        waited = self.clock.now() - started
        unplaced = (
            f"; their worker bundles ({dict(self.plan.bundle_resources)}) did not place: check "
            "resources_per_bundle and bundle_label_selector against the hosts"
            if len(self.claims) == self.plan.num_slices
            else ""
        )
        held = (
            self.place.describe()
            if self.place is not None
            else f"holding {len(self.claims)} of {self.plan.num_slices}{unplaced}"
        )
        return ReservationTimeoutError(
            f"no {self.plan.describe()} within {waited:.0f} s: {self.targets.explain(snapshot)}; "
            f"{held}. Wait for work to finish, or pass a longer head_reservation_timeout_s"
        )


def _quietly(call: Callable[[], None]) -> None:
    """A best-effort call to the queue (leaving, reporting a claim): a queue that does
    not answer forgets the ticket by its lease."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001  (best effort; the lease covers it)
        logger.debug("the slice queue did not take a call: %s", exc)


def _only(snapshot: ClusterSnapshot, names: Sequence[str]) -> ClusterSnapshot:
    """The snapshot with only the named slices (those the queue granted)."""
    slices = {n: snapshot.slices[n] for n in names if n in snapshot.slices}
    return ClusterSnapshot(slices, snapshot.taken_at, snapshot.queue)


def _hosts(snapshot: ClusterSnapshot) -> dict[str, HostInfo]:
    """Every TPU host of the snapshot by node id."""
    return {h.node_id: h for info in snapshot.slices.values() for h in info.hosts.values()}


def _taken(host: HostInfo | None, own_head: bool = False) -> bool:
    """Gone, dead, some TPU in use, its head in use (unless ``own_head``: we hold it), or
    the TPU owned by a process."""
    if host is None or not host.alive:
        return True
    head_taken = host.head_free is False and not own_head
    return host.tpu_available < host.tpu_total or head_taken or bool(host.tpu_owner)
