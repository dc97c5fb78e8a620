"""The claiming loop behind :class:`~tpuslice._reserve.reserve.SlicePlacementGroup`.

Whole slices are admitted only by the cluster-wide queue: a reservation is granted slices
and claims exactly those at once, in one worker group (or one per slice) whose bundle *i*
is pinned to worker *i* and whose bundle 0 holds the slice's ``TPU-<podtype>-head``. A
grant taken meanwhile goes back, and the reservation waits again in its place. Sub-slices
claim directly, polling. Any failure or interrupt removes all made so far.
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
"""Pause between asks of a queue that answers at once."""
QUEUE_LOOK_S = 1.0
"""While queued on a cluster that can grow, how often it is read (for the autoscaler)."""
JOIN_HOLD_S = 1.0
"""How long the queue may hold the first ask: short, so a silent queue is told of soon."""
FREE_KEY_TRUST_S = 1.0
"""How old a read's agent free keys may be to spare their hosts the owner ask: an agent
withdraws its key within half a second of finding an owner."""
PROGRESS_S = 5.0
"""While queued, how long one ask may be held before the log says where it stands."""


@dataclass
class Claim:
    """One slice held by this reservation: its head group and its worker group(s)."""

    index: int
    target: SliceInfo
    head_pg: PlacementGroup | None = None
    worker_pg: PlacementGroup | None = None
    owners: Callable[[], Mapping[str, str | None]] | None = None
    """Waits for the hosts' answers of who owns their TPUs (``None``: checked, or not asked)."""

    @property
    def slice_name(self) -> str:
        return self.target.name

    @property
    def suspect(self) -> bool:
        """Whether the slice was taken as a last resort: a host of it is suspect."""
        return self.target.state is SliceState.SUSPECT


@dataclass
class Reservation:
    """The groups of a finished reservation, in slice-index order; the other fields become
    :class:`~tpuslice._reserve.reserve.Reserved`'s, which says what they mean."""

    claims: list[Claim] = field(default_factory=list)
    combined_pg: PlacementGroup | None = None
    plan: ReservationPlan | None = None
    queued_s: float = 0.0
    arrival: int | None = None
    recorded: bool = False


class Reserver:
    """Claims the slices of one request; on any failure or interrupt, removes all it made.
    The cluster is reached only through ``ops`` and time through ``clock``, for tests."""

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
        """Slices wanted: at least ``low``, up to ``high`` (the plan's until fixed)."""
        self.deadline: float | None = None
        self.started = 0.0
        self.arrival: int | None = None
        """Its place in the queue's arrival order: a wall-clock stamp of when it was asked
        for (so drivers queue in the order they asked), or the run's first."""
        self.targets: Targets = targets or WholeSlices(request.plan, self.low, self._time_left)
        self.claims: dict[int, Claim] = {}
        self.in_flight: list[PlacementGroup] = []
        """Groups created but not yet recorded in a claim: removed too if we stop."""
        self.unasked: list[Claim] = []
        """Slices whose hosts are asked who owns their TPUs once their groups exist."""
        self._seen_free: frozenset[str] = frozenset()
        """The hosts the latest read or listing found seen free by their agents, and when."""
        self._seen_free_at = float("-inf")
        self._next_reprobe = 0.0
        self.demand: AutoscalerDemand | None = None
        self._growable: bool | None = None
        self.place: QueuePlace | None = None
        """Our ticket in the cluster-wide queue, while we wait there."""
        self.kind = SliceKind(self.plan.shape, self.plan.tpu_resource_per_chip)
        self.waited_s = 0.0

    def _can_grow(self) -> bool:
        """Whether the cluster has an autoscaler (asked once)."""
        if self._growable is None:
            self._growable = self.ops.can_grow()
        return self._growable

    def _time_left(self) -> float | None:
        """Seconds to the deadline (at least 0); ``None`` before it runs, or without one."""
        return None if self.deadline is None else max(0.0, self.deadline - self.clock.now())

    def run(self) -> Reservation:
        """Claim every slice and place every worker bundle. On any error or interrupt
        (:class:`InsufficientSlicesError` if the cluster cannot grow to hold it,
        :class:`ReservationTimeoutError` saying why), every group made is removed first."""
        self.started = self.clock.now()
        self.deadline = None if self.timeout is None else self.started + self.timeout
        self.arrival = self.request.arrival_ns or self.clock.stamp()
        try:
            if isinstance(self.targets, WholeSlices):
                return self._admitted()
            return self._claimed_directly()
        except BaseException:
            self._release_all()
            raise

    def _release_all(self) -> None:
        """Remove every group this reserver made, and leave the queue."""
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
        """Claim the granted slices and place them; ``None``, all given back, if a slice
        was taken meanwhile or its TPUs are owned."""
        self._end_demand()
        if granted.view:
            snapshot = self.targets.prepare(ClusterSnapshot({s.name: s for s in granted.view}))
            # As old as the queue's read: list the free keys again before sparing a host.
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
        """Ask the queue until it grants slices (the first ask joins it); a silent queue
        is asked again until the deadline. The cluster is read only when the queue says
        never (to say why) and, when it can grow, for the autoscaler's demand."""
        growing = self.targets.autoscaling and self._can_grow()
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
                # Our own read finds the cluster can hold it (changed since the queue's).
                logger.info("the slice queue says %s; asking again", answer.reason)
            if isinstance(answer, Waiting) and self.clock.now() - now >= hold:
                logger.info(
                    "waiting %.0f s for %s: %s",
                    self.clock.now() - self.started,
                    self.plan.describe(),
                    self.place.describe() if self.place is not None else "",
                )
            if self.clock.now() - now < QUEUE_POLL_S:
                # Answered at once (in memory, or never while the cluster may grow): pause.
                self.clock.sleep(QUEUE_LOOK_S if isinstance(answer, Never) else QUEUE_POLL_S)

    def _ask(self, hold: float) -> Answer:
        """One held ask of the queue: the first joins it, the others wait in it."""
        queue = self.ops.slice_queue()
        if self.place is None:
            self.place = QueuePlace(
                queue,
                self.kind,
                (self.low, self.high),
                self.request.priority,
                self._time_left,
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
        """Reserve ``count`` slices of the range: the plan and targets follow."""
        if count != self.plan.num_slices and self.request.elastic:
            self.plan = replace(self.request.plan, num_slices=count)
            self.targets = WholeSlices(self.plan, count, self._time_left)

    def _read(self) -> ClusterSnapshot:
        """Read the cluster, noting the hosts its agents saw free."""
        read_at = self.clock.now()
        snapshot = self.ops.snapshot(self.plan.tpu_resource_per_chip)
        self._seen_free = frozenset(n for n, h in _hosts(snapshot).items() if h.tpu_seen_free)
        self._seen_free_at = read_at
        return self.targets.prepare(snapshot)

    def _requeue(self) -> None:
        """Give the granted slices back and wait again in the same place (a silent queue
        forgets the grant by its lease)."""
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
            self._give_back_lost(snapshot, _gone, "a host died or left")
            self._claim(snapshot)
            if len(self.claims) == self.plan.num_slices:
                reservation = self._placed()
                if reservation is not None:
                    return reservation
                now = self.ops.snapshot(self.plan.tpu_resource_per_chip)
                self._give_back_lost(now, _taken, "a host was taken meanwhile")
                self._check_deadline(None, snapshot)
                continue  # retry placing at once: the failed wait was the pause
            self._check_possible(snapshot)
            self._check_deadline(None, snapshot)
            wait = pause if self.deadline is None else min(pause, self.deadline - self.clock.now())
            self.clock.sleep(max(0.0, wait))
            self.waited_s += max(0.0, wait)
            pause = min(pause * 2, POLL_S[1])

    def _placed(self) -> Reservation | None:
        """Place the claimed slices' worker groups and check their TPUs have no owner;
        ``None`` if not."""
        reservation = (
            Reservation([self.claims[i] for i in sorted(self.claims)], plan=self.plan)
            if self.heads_only
            else self._place_workers()
        )
        if reservation is None or not self._free_of_owners(reservation):
            return None
        # Held now; until here an interrupt gave the groups back.
        self.in_flight = []
        reservation.queued_s = self.waited_s
        return reservation

    # --- steps -----------------------------------------------------------------------

    def _claim(self, snapshot: ClusterSnapshot) -> None:
        """Take every idle slice we still need. Placing is one round, in
        :meth:`_place_workers`; only ``heads_only`` places head groups here."""
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
        """Ask the picked slices' hosts who owns their TPUs, without waiting: called once
        their groups exist, so the asks overlap the placing. Hosts whose agents saw their
        TPU free in the latest read are spared; a read older than
        :data:`FREE_KEY_TRUST_S` is refreshed first (one listing)."""
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

    def _free_of_owners(self, reservation: Reservation) -> bool:
        """Whether no placed host's TPU is owned. If some are, those slices go back and
        the others' worker groups are removed for the next round."""
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
        self._remove_workers(reservation.claims, reservation.combined_pg)
        for claim in reservation.claims:
            if claim.index in held:
                self._give_back(claim, f"not free ({'; '.join(held[claim.index])})")
        return False

    def _reprobe_owned(self, snapshot: ClusterSnapshot) -> None:
        """No idle slice: now and then re-ask hosts recorded with a TPU owner, so that a
        record of a process since exited does not keep its slice busy."""
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
        """Keep the missing slices visible to the autoscaler. A landed demand group is
        let go: the new slice is the queue's to grant, in its order."""
        missing = self.plan.num_slices - len(self.claims)
        if not missing or not self.targets.autoscaling:
            return
        if self.plan.pinned_slice_name(0) or not self._can_grow():
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
        """Create every worker group at once and wait for them; ``None``, all removed, if
        they did not place within the bound."""
        claims = [self.claims[i] for i in sorted(self.claims)]
        unasked = [c for c in self.unasked if self.claims.get(c.index) is c]
        self.unasked = []
        combined = None
        if self.plan.pg_per_slice:
            for claim in claims:
                claim.worker_pg = self._worker_group([claim], f"_slice_{claim.index}")
            groups = [c.worker_pg for c in claims if c.worker_pg]
        else:
            combined = self._worker_group(claims, "")
            groups = [combined]
        self.in_flight = list(groups)  # until the caller has checked the TPU owners too
        self._ask_owners(unasked)
        if all(self.ops.wait_placed(groups, CLAIM_BOUND_S)):
            return Reservation(claims, combined, self.plan)
        self._remove_workers(claims, combined)
        return None

    def _remove_workers(self, claims: Sequence[Claim], combined: PlacementGroup | None) -> None:
        """Remove the claims' worker groups, keeping their slices claimed for the next round."""
        self.ops.remove_group(combined)
        for claim in claims:
            self.ops.remove_group(claim.worker_pg)
            claim.worker_pg = None
        self.in_flight = []

    def _worker_group(self, claims: Sequence[Claim], suffix: str) -> PlacementGroup:
        """One group for these slices, each host's bundles pinned to it by label, and a
        slice's head resource in its bundle 0 when it has no head group."""
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

    def _give_back(self, claim: Claim, why: str) -> None:
        logger.info("giving %s back: %s", claim.slice_name, why)
        self.ops.remove_group(claim.head_pg)
        self.claims.pop(claim.index, None)

    def _give_back_lost(
        self, snapshot: ClusterSnapshot, lost: Callable[[HostInfo | None], bool], why: str
    ) -> None:
        """Give back the claims a host of which is ``lost`` in ``snapshot``; keep the rest."""
        hosts = _hosts(snapshot)
        for claim in list(self.claims.values()):
            if any(lost(hosts.get(h.node_id)) for h in claim.target.hosts.values()):
                self._give_back(claim, why)

    def _check_possible(self, snapshot: ClusterSnapshot) -> None:
        """Fail at once if the cluster lacks the slices (a range's minimum) and cannot grow."""
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
        if not self._can_grow():
            raise InsufficientSlicesError(
                f"cannot reserve {self.plan.describe()}: {reason}; "
                f"{self.targets.explain(snapshot)}. The cluster has no autoscaler, so waiting "
                "would not help: add slices, or ask for fewer"
            )

    def _check_deadline(
        self, silent_since: float | None, snapshot: ClusterSnapshot | None = None
    ) -> None:
        """Raise the timeout once the deadline passed, saying why (``silent_since``: when
        the queue stopped answering)."""
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
    """A best-effort call to the queue: a silent queue forgets the ticket by its lease."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001  (best effort; the lease covers it)
        logger.debug("the slice queue did not take a call: %s", exc)


def _only(snapshot: ClusterSnapshot, names: Sequence[str]) -> ClusterSnapshot:
    """The snapshot with only the named slices."""
    slices = {n: snapshot.slices[n] for n in names if n in snapshot.slices}
    return ClusterSnapshot(slices, snapshot.taken_at, snapshot.queue)


def _hosts(snapshot: ClusterSnapshot) -> dict[str, HostInfo]:
    return {h.node_id: h for info in snapshot.slices.values() for h in info.hosts.values()}


def _gone(host: HostInfo | None) -> bool:
    return host is None or not host.alive


def _taken(host: HostInfo | None) -> bool:
    """Gone, some TPU in use, its head in use, or the TPU owned by a process."""
    if host is None or not host.alive:
        return True
    return host.tpu_available < host.tpu_total or host.head_free is False or bool(host.tpu_owner)
