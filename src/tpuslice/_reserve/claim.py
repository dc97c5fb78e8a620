"""The claiming loop behind :class:`~tpuslice._reserve.reserve.SlicePlacementGroup`.

A whole-slice reservation is admitted by the cluster-wide queue
(:mod:`tpuslice._reserve.queue.actor`), and only by it: it joins the queue, is granted slices, and
claims exactly those, all at once (it never holds some slices while it waits for more).
A queue that does not answer yet is waited for, bounded by the reservation's timeout,
and the log says so. Claiming places one worker group for the granted slices (or one per
slice): bundle *i* is pinned by label to worker *i* of its slice, and each slice's bundle
0 also holds worker 0's ``TPU-<podtype>-head`` resource, the claim other reservers (Ray's
own included) respect. A group is placed whole or not at all, so a granted slice that
work outside the queue took meanwhile leaves nothing of ours on it: the grant goes back
and the reservation waits again in the same place.

Sub-slices are parts of a slice's hosts, not the queue's unit: they claim directly,
polling the cluster until their hosts are idle (:meth:`Reserver.run`).

Slices with a suspect host (one that failed a run lately) are picked only as a last
resort (:func:`tpuslice._reserve.queue.schedule.last_resort`); a claim of one says so
(:attr:`Claim.suspect`), and the log says why it was taken. Any failure or interrupt
removes everything made so far, and leaves the queue.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from ray.util.placement_group import PlacementGroup

from tpuslice._reserve.demand import AutoscalerDemand
from tpuslice._reserve.ops import RAY_OPS, ClusterOps
from tpuslice._reserve.plan import ReservationPlan, accepted_slices
from tpuslice._reserve.queue.book import Answer, Granted, Never, Waiting
from tpuslice._reserve.queue.place import QueuePlace
from tpuslice._reserve.queue.service import SliceKind
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
"""Pause between asks of a queue that answers at once (in memory, or failing at once)."""
QUEUE_LOOK_S = 1.0
"""While queued on a cluster that can grow, how often the cluster itself is read (to
keep the autoscaler's demand)."""
JOIN_HOLD_S = 1.0
"""How long the queue may hold a reservation's first call (granted at once when
uncontended; otherwise it waits with held asks of :data:`PROGRESS_S`). Short, so that a
queue not answering yet is told within a few seconds."""
FREE_KEY_TRUST_S = 1.0
"""How old a cluster read may be for the agents' free keys it listed to spare their hosts
the owner ask. An agent looks at its TPU every half second and withdraws its key when it
finds an owner; a read older than this could miss a process that took the TPU since, so
those hosts are asked instead."""
PROGRESS_S = 5.0
"""While queued, how long the queue may hold one ask; then the log says where the
reservation stands, and it asks again. A queue that does not answer is told of as often."""


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
        """When it began to run (on :attr:`clock`)."""
        self.arrival: int | None = None
        """Its place in the queue's arrival order: when it was asked for (a wall-clock
        stamp, so that drivers that start together queue in the order they asked, however
        late each reaches the queue), or the first arrival of the run it retries."""
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
        self.kind = SliceKind(self.plan.shape, self.plan.tpu_resource_per_chip)
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
                cluster has and what this reservation held (or that the queue did not
                answer).
            KeyboardInterrupt: as raised; like every error, after all groups are removed.
        """
        self.started = self.clock.now()
        self.deadline = None if self.timeout is None else self.started + self.timeout
        self.arrival = self.request.arrival_ns or self.clock.stamp()
        try:
            if isinstance(self.targets, WholeSlices):
                return self._admitted()
            return self._claimed_directly()
        except BaseException:
            self.release_all()
            raise

    def release_all(self) -> None:
        """Remove every group this reserver made (claims and autoscaler demand), and
        leave the queue."""
        place, self.place = self.place, None
        self._end_demand()
        self._give_back_all()
        if place is not None:
            _quietly(place.leave)

    # --- whole slices: through the queue -------------------------------------------------

    def _admitted(self) -> Reservation:
        """Join the queue, and claim what it grants until a claim holds."""
        while True:
            granted = self._wait_for_grant()
            reservation = self._take(granted)
            if reservation is not None:
                place, self.place = self.place, None
                assert place is not None
                _quietly(place.claimed)
                reservation.arrival = place.arrival
                reservation.recorded = granted.quotas or self.request.preemptible
                return reservation
            self._check_deadline(None)
            self._requeue()

    def _take(self, granted: Granted) -> Reservation | None:
        """Claim the granted slices and place their groups; ``None`` (everything given
        back) if a slice was taken meanwhile, or its hosts' TPUs are owned."""
        self._end_demand()
        if granted.view:
            snapshot = self.targets.prepare(ClusterSnapshot({s.name: s for s in granted.view}))
            # As old as the queue's read, which the grant does not say: the free keys are
            # listed again before any host is spared.
            self._seen_free_at = -math.inf
        else:
            snapshot = self._read()
        self._fix_count(len(granted.slices))
        self._claim(_only(snapshot, granted.slices))
        if len(self.claims) < self.plan.num_slices:
            logger.info("a granted slice was taken meanwhile")
            return None
        return self._placed()

    def _wait_for_grant(self) -> Granted:
        """Ask the queue until it grants slices (the first ask joins it). Each ask is held
        by the queue until the grant, the deadline, or :data:`PROGRESS_S` (then the log
        says where the reservation stands). A queue that does not answer (still
        starting, or restarting) is asked again, the log saying so, until the deadline.
        The cluster is read only when the queue says the request can never be met (to say
        why, or to wait for the autoscaler), and, on a cluster that can grow, every
        :data:`QUEUE_LOOK_S` to keep the autoscaler's demand. Raises at the deadline."""
        growing = self.targets.autoscaling and self.can_grow()
        if growing:  # the autoscaler sees the demand from the start
            self._follow_demand(self._read())
        silent_since: float | None = None
        said_at = -math.inf
        while True:
            now = self.clock.now()
            self._check_deadline(silent_since)
            hold = QUEUE_LOOK_S if growing else PROGRESS_S
            if self.deadline is not None:
                hold = min(hold, self.deadline - now)
            try:
                answer = self._ask(hold)
            except QueueUnreachableError as exc:
                silent_since = now if silent_since is None else silent_since
                if self.clock.now() - said_at >= PROGRESS_S:
                    said_at = self.clock.now()
                    self._say_silent(exc, self.clock.now() - silent_since)
                if self.clock.now() - now < QUEUE_POLL_S:  # failed at once: not a wait
                    self.clock.sleep(POLL_S[1])
                continue
            finally:
                self.waited_s += self.clock.now() - now
            silent_since = None
            if isinstance(answer, Granted):
                return answer
            if isinstance(answer, Never) or growing:
                snapshot = self._read()
                self._check_possible(snapshot)
                self._follow_demand(snapshot)
            if isinstance(answer, Never):
                # Our own read finds the cluster can hold it (a host back, a slice come
                # out of maintenance since the queue's read): ask again in a while.
                logger.info("the slice queue says %s; asking again", answer.reason)
            if isinstance(answer, Waiting) and self.clock.now() - now >= hold:
                logger.info(
                    "waiting %.0f s for %s: %s",
                    self.clock.now() - self.started,
                    self.plan.describe(),
                    self.place.describe() if self.place is not None else "",
                )
            if self.clock.now() - now < QUEUE_POLL_S:
                # Answered at once (a queue in memory, or one that says never while the
                # cluster may grow): pause.
                self.clock.sleep(QUEUE_LOOK_S if isinstance(answer, Never) else QUEUE_POLL_S)

    def _ask(self, hold: float) -> Answer:
        """One held ask of the queue: the first joins it (and makes our place), the
        others wait in it."""
        queue = self.ops.slice_queue()
        if self.place is None:
            self.place = QueuePlace(
                queue,
                self.kind,
                (self.low, self.high),
                self.request.priority,
                self.time_left,
                tenant=self.request.tenant or "",
                preemptible=self.request.preemptible,
                arrival=self.arrival,
                only=self._accepted(),
            )
        self.place.queue = queue  # the queue may have been found again (it had died)
        if not self.place.joined:
            return self.place.join(min(hold, JOIN_HOLD_S))
        return self.place.wait(hold)

    def _accepted(self) -> frozenset[str] | None:
        """The slices this request's label selectors accept (``None``: it has none)."""
        if not any(self.plan.user_selectors):
            return None
        return accepted_slices(self.plan, self.ops.slice_labels())

    def _say_silent(self, exc: QueueUnreachableError, silent_s: float) -> None:
        joined = self.place is not None and self.place.joined
        what = "come back" if joined else "start"
        logger.warning("waiting for the slice queue to %s: %.0f s (%s)", what, silent_s, exc)

    def _fix_count(self, count: int) -> None:
        """Reserve ``count`` slices (within the range): the plan and targets follow."""
        if count != self.plan.num_slices and self.request.elastic:
            self.plan = replace(self.request.plan, num_slices=count)
            self.targets = WholeSlices(self.plan, count, self.time_left)

    def _read(self) -> ClusterSnapshot:
        read_at = self.clock.now()
        snapshot = self.ops.snapshot(self.plan.tpu_resource_per_chip)
        self._note_seen_free(snapshot, read_at)
        return self.targets.prepare(snapshot)

    def _requeue(self) -> None:
        """Give the granted slices back and wait again in the same place (a queue that
        does not take the call forgets the grant by its lease; the next ask says so)."""
        assert self.place is not None
        logger.info("queueing again in the same place")
        self._give_back_all()
        _quietly(self.place.requeue)

    def _give_back_all(self) -> None:
        for group in self.in_flight:
            self.ops.remove_group(group)
        self.in_flight = []
        for claim in self.claims.values():
            self.ops.remove_group(claim.worker_pg)
            self.ops.remove_group(claim.head_pg)
        self.claims.clear()

    # --- sub-slices: claimed directly ------------------------------------------------

    def _claimed_directly(self) -> Reservation:
        """Read the cluster, claim what is idle, and place it; poll until it holds."""
        pause = POLL_S[0]
        while True:
            snapshot = self._read()
            self._drop_broken(snapshot)
            self._claim(snapshot)
            if len(self.claims) == self.plan.num_slices:
                reservation = self._placed()
                if reservation is not None:
                    return reservation
                self._give_back_busy(list(self.claims.values()))
                self._check_deadline(None, snapshot)
                continue  # retry placing at once: the failed wait was the pause
            self._check_possible(snapshot)
            self._check_deadline(None, snapshot)
            wait = pause if self.deadline is None else min(pause, self.deadline - self.clock.now())
            self.clock.sleep(max(0.0, wait))
            self.waited_s += max(0.0, wait)
            pause = min(pause * 2, POLL_S[1])

    def _placed(self) -> Reservation | None:
        """Place the claimed slices' worker groups (their head groups are placed already
        for ``heads_only``) and check their TPUs are free of owners; ``None`` if not."""
        reservation = (
            Reservation([self.claims[i] for i in sorted(self.claims)], plan=self.plan)
            if self.heads_only
            else self._place_workers()
        )
        if reservation is None or not self._free_of_owners(reservation):
            return None
        # Placed: Ray's view shows the slices held from now on. The groups stayed in
        # flight until now, so that an interrupt before this gave them back.
        self.in_flight = []
        reservation.queued_s = self.waited_s
        return reservation

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

    def _claim(self, snapshot: ClusterSnapshot) -> None:
        """Take every idle slice we still need; their hosts are asked who owns their TPUs
        once their groups are created (answered while the groups place; checked once
        they placed: :meth:`_ask_owners`). Nothing is placed
        here: :meth:`_place_workers` places them all in one round, their heads in bundle
        0 of each. Only ``reserve_tpu_slice`` (``heads_only``) places head groups, and
        keeps those that place."""
        taken = {i: c.slice_name for i, c in self.claims.items()}
        picks = self.targets.pick(snapshot, taken)
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
                logger.info("head of %s was taken meanwhile", claim.slice_name)
                self.ops.remove_group(claim.head_pg)

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
        """On a cluster that can grow, keep the missing slices visible to the autoscaler.
        A demand group that lands is let go: the new slice is the queue's to grant, in
        its order; our demand only made the autoscaler add it."""
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
        for group, _ in self.demand.landed(snapshot):
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
            for claim in claims:
                self.ops.remove_group(claim.worker_pg)
                claim.worker_pg = None
            self.in_flight = []
            return None
        combined = self._worker_group(claims, "")
        self.in_flight = [combined]  # until the caller has checked the TPU owners too
        self._ask_owners(unasked)
        if all(self.ops.wait_placed([combined], CLAIM_BOUND_S)):
            return Reservation(claims, combined, self.plan)
        self.ops.remove_group(combined)
        self.in_flight = []
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

    def _give_back_busy(self, claims: Sequence[Claim]) -> None:
        """After a group failed to place: drop the slices someone else took meanwhile
        (a host gone, dead or in use); keep the rest for the next round."""
        now = _hosts(self.ops.snapshot(self.plan.tpu_resource_per_chip))
        for claim in claims:
            if any(_taken(now.get(h.node_id)) for h in claim.target.hosts.values()):
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
        self, silent_since: float | None, snapshot: ClusterSnapshot | None = None
    ) -> None:
        """Raise the timeout once the deadline passed (``silent_since``: when the queue
        stopped answering, if it did; ``snapshot``: the cluster, if just read)."""
        if self.deadline is None or self.clock.now() < self.deadline:
            return
        waited = self.clock.now() - self.started
        if silent_since is not None:
            silent = self.clock.now() - silent_since
            raise ReservationTimeoutError(
                f"no {self.plan.describe()} within {waited:.0f} s: the slice queue, which "
                f"admits every reservation, did not answer for {silent:.0f} s (is the head "
                "node overloaded?). Pass a longer head_reservation_timeout_s"
            )
        snapshot = snapshot if snapshot is not None else self._read()
        unplaced = (
            f"; their worker bundles ({dict(self.plan.bundle_resources)}) did not place: check "
            "resources_per_bundle and bundle_label_selector against the hosts"
            if len(self.claims) == self.plan.num_slices
            else ""
        )
        held = (
            f"{self.place.describe()}{unplaced}"
            if self.place is not None
            else f"holding {len(self.claims)} of {self.plan.num_slices}{unplaced}"
        )
        raise ReservationTimeoutError(
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


def _taken(host: HostInfo | None) -> bool:
    """Gone, dead, some TPU in use, its head in use, or the TPU owned by a process."""
    if host is None or not host.alive:
        return True
    return host.tpu_available < host.tpu_total or host.head_free is False or bool(host.tpu_owner)
