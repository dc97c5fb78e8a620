"""Reserve whole TPU slices as Ray placement groups: every host or none, never leaked.

For each slice: a head placement group on worker 0's ``TPU-<podtype>-head`` resource
(the claim other reservers, Ray's own included, respect) and worker bundles pinned by
label to that slice and to each TPU worker id, so bundle *i* is worker *i*. Slices are
picked from the cluster view (idle and whole only) and all N are claimed at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from tpuslice import _ray
from tpuslice.cluster import ClusterSnapshot, SliceInfo, read_snapshot
from tpuslice.compat import DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S
from tpuslice.errors import (
    InsufficientSlicesError,
    InvalidArgumentError,
    ReservationTimeoutError,
    SliceShutdownError,
)
from tpuslice.labels import SLICE_NAME_LABEL, WORKER_ID_LABEL
from tpuslice.plan import ReservationPlan, explain, pick_slices, plan_reservation, shortage

logger = logging.getLogger(__name__)

CLAIM_BOUND_S = 2.0
"""How long a claimed slice's groups may take to place before we give it back."""
POLL_S = (0.05, 0.5)
"""First and largest pause between looks at the cluster while waiting for a slice."""


@dataclass
class Clock:
    """Injected time, so tests of the waiting logic need no real waiting."""

    now: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


@dataclass
class Claim:
    """One slice held by this reservation: its head group and its worker group(s)."""

    index: int
    target: SliceInfo
    head_pg: PlacementGroup | None = None
    worker_pg: PlacementGroup | None = None

    @property
    def slice_name(self) -> str:
        return self.target.name


@dataclass
class Reservation:
    """The groups of a finished reservation, in slice-index order."""

    claims: list[Claim] = field(default_factory=list)
    combined_pg: PlacementGroup | None = None


def _remove(pg: PlacementGroup | None) -> None:
    """Remove a placement group; a group already gone is fine (idempotent)."""
    if pg is None:
        return
    try:
        remove_placement_group(pg)
    except (ValueError, ray.exceptions.RaySystemError) as exc:  # already removed / cluster gone
        logger.debug("placement group %s already removed: %s", pg.id.hex(), exc)


def _wait_all(pgs: Sequence[PlacementGroup], timeout: float) -> list[bool]:
    """Wait until every group is placed or ``timeout`` passes; return which are ready."""
    if not pgs:
        return []
    refs = [pg.ready() for pg in pgs]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=max(0.0, timeout))
    done = set(ready)
    return [ref in done for ref in refs]


class Reserver:
    """Claims slices for one plan; on any failure or interrupt, removes all it made."""

    def __init__(
        self,
        plan: ReservationPlan,
        timeout: float | None,
        clock: Clock,
        heads_only: bool = False,
    ) -> None:
        self.plan = plan
        self.timeout = timeout
        self.clock = clock
        self.heads_only = heads_only
        self.claims: dict[int, Claim] = {}

    def run(self) -> Reservation:
        started = self.clock.now()
        deadline = None if self.timeout is None else started + self.timeout
        pause = POLL_S[0]
        try:
            while True:
                snapshot = read_snapshot(self.plan.tpu_resource_per_chip)
                self._drop_broken(snapshot)
                self._claim(snapshot)
                if len(self.claims) == self.plan.num_slices:
                    reservation = (
                        Reservation([self.claims[i] for i in sorted(self.claims)])
                        if self.heads_only
                        else self._place_workers()
                    )
                    if reservation is not None:
                        return reservation
                    continue
                self._check_possible(snapshot)
                if deadline is not None and self.clock.now() >= deadline:
                    raise self._timeout_error(snapshot, started)
                wait = pause if deadline is None else min(pause, deadline - self.clock.now())
                self.clock.sleep(max(0.0, wait))
                pause = min(pause * 2, POLL_S[1])
        except BaseException:
            self.release_all()
            raise

    def release_all(self) -> None:
        for claim in self.claims.values():
            _remove(claim.worker_pg)
            _remove(claim.head_pg)
        self.claims.clear()

    # --- steps -----------------------------------------------------------------------

    def _drop_broken(self, snapshot: ClusterSnapshot) -> None:
        """Give back claims whose slice died or changed while we waited for the rest."""
        for index, claim in list(self.claims.items()):
            info = snapshot.slices.get(claim.slice_name)
            if info is None or info.missing_workers or info.alive_hosts < info.expected_hosts:
                logger.info("slice %s broke while reserving; giving it back", claim.slice_name)
                _remove(claim.head_pg)
                del self.claims[index]

    def _claim(self, snapshot: ClusterSnapshot) -> None:
        """Claim every idle slice we still need, all at once; keep those that place."""
        picks = pick_slices(snapshot, self.plan, {i: c.slice_name for i, c in self.claims.items()})
        if not picks:
            return
        fresh = [Claim(index, target) for index, target in picks.items()]
        if self.plan.needs_head_claim:
            for claim in fresh:
                claim.head_pg = self._head_group(claim.target)
            placed = _wait_all([c.head_pg for c in fresh if c.head_pg], CLAIM_BOUND_S)
        else:
            placed = [True] * len(fresh)
        for claim, ok in zip(fresh, placed, strict=True):
            if ok:
                self.claims[claim.index] = claim
            else:
                logger.info("head of %s was taken meanwhile; trying another", claim.slice_name)
                _remove(claim.head_pg)

    def _head_group(self, target: SliceInfo) -> PlacementGroup:
        selector = {SLICE_NAME_LABEL: target.name, WORKER_ID_LABEL: "0"}
        return placement_group(
            bundles=[{self.plan.shape.head_resource: 1}],
            bundle_label_selector=[selector],
            lifetime=self.plan.lifetime,
        )

    def _place_workers(self) -> Reservation | None:
        """Create every worker group at once; ``None`` (and claims dropped) if a slice
        could not be placed within the bound because someone took one of its hosts."""
        claims = [self.claims[i] for i in sorted(self.claims)]
        if self.plan.pg_per_slice:
            for claim in claims:
                claim.worker_pg = self._worker_group([claim], f"_slice_{claim.index}")
            groups = [c.worker_pg for c in claims if c.worker_pg]
            placed = _wait_all(groups, CLAIM_BOUND_S)
            if all(placed):
                return Reservation(claims)
            for claim, ok in zip(claims, placed, strict=True):
                _remove(claim.worker_pg)
                claim.worker_pg = None
                if not ok:
                    self._give_back(claim)
            return None
        combined = self._worker_group(claims, "")
        if _wait_all([combined], CLAIM_BOUND_S)[0]:
            return Reservation(claims, combined)
        _remove(combined)
        self._give_back_busy(claims)
        return None

    def _worker_group(self, claims: Sequence[Claim], suffix: str) -> PlacementGroup:
        bundles: list[dict[str, float]] = []
        selectors: list[dict[str, str]] = []
        for claim in claims:
            selectors += self.plan.worker_selectors(claim.index, claim.target)
            bundles += [dict(self.plan.bundle_resources)] * self.plan.bundles_per_slice
        name = f"{self.plan.name}{suffix}" if self.plan.name else ""
        return placement_group(
            bundles=bundles,
            strategy=self.plan.strategy,
            name=name,
            lifetime=self.plan.lifetime,
            bundle_label_selector=selectors,
        )

    def _give_back(self, claim: Claim) -> None:
        logger.info("could not place the hosts of %s; giving it back", claim.slice_name)
        _remove(claim.head_pg)
        self.claims.pop(claim.index, None)

    def _give_back_busy(self, claims: Sequence[Claim]) -> None:
        """After a combined group failed to place: drop the slices whose TPUs are no
        longer all free (someone else took a host); keep the rest for the next round."""
        snapshot = read_snapshot(self.plan.tpu_resource_per_chip)
        for claim in claims:
            info = snapshot.slices.get(claim.slice_name)
            if info is None or info.chips_free < info.chips_total or info.missing_workers:
                self._give_back(claim)

    def _check_possible(self, snapshot: ClusterSnapshot) -> None:
        """Fail at once if the cluster lacks the slices and cannot grow to have them."""
        reason = shortage(snapshot, self.plan)
        if reason and not _ray.cluster_can_grow():
            raise InsufficientSlicesError(
                f"cannot reserve {self.plan.describe()}: {reason}; "
                f"{explain(snapshot, self.plan)}. The cluster has no autoscaler, so waiting "
                "would not help: add slices, or ask for fewer"
            )

    def _timeout_error(self, snapshot: ClusterSnapshot, started: float) -> ReservationTimeoutError:
        waited = self.clock.now() - started
        return ReservationTimeoutError(
            f"no {self.plan.describe()} within {waited:.0f} s: {explain(snapshot, self.plan)}; "
            f"holding {len(self.claims)} of {self.plan.num_slices}. Wait for work to finish, "
            "or pass a longer head_reservation_timeout_s"
        )


class SlicePlacementGroup:
    """A reservation of ``num_slices`` whole TPU slices (Ray 2.60 ``SlicePlacementGroup``).

    The constructor returns once every slice is claimed and every worker bundle placed,
    so a returned object holds the slices. Use it as a context manager, or call
    :meth:`shutdown`, to give them back.
    """

    def __init__(
        self,
        topology: str,
        accelerator_version: str,
        resources_per_bundle: dict[str, float] | None = None,
        strategy: str = "SPREAD",
        name: str = "",
        lifetime: str | None = None,
        num_slices: int = 1,
        chips_per_vm: int | None = None,
        head_reservation_timeout_s: float | None = DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S,
        bundle_label_selector: list[dict[str, str]] | None = None,
        pg_per_slice: bool = False,
        tpu_resource_per_chip: int | None = None,
        *,
        _clock: Clock | None = None,
    ) -> None:
        self._reservation = Reservation()
        self._launched: list[ray.ObjectRef] = []
        self._plan = plan_reservation(
            topology,
            accelerator_version,
            resources_per_bundle,
            strategy,
            name,
            lifetime,
            num_slices,
            chips_per_vm,
            bundle_label_selector,
            pg_per_slice,
            tpu_resource_per_chip,
        )
        if not ray.is_initialized():
            raise SliceShutdownError(
                "Ray is not initialised: call ray.init(address=...) before reserving slices "
                "(or use tpuslice.testing.SimulatedCluster)"
            )
        self._reservation = Reserver(
            self._plan, head_reservation_timeout_s, _clock or Clock()
        ).run()

    # --- Ray 2.60 properties ---------------------------------------------------------

    @property
    def placement_group(self) -> PlacementGroup | None:
        return self.slice_placement_group

    @property
    def slice_placement_group(self) -> PlacementGroup | None:
        if self._plan.pg_per_slice:
            raise InvalidArgumentError("pg_per_slice=True, use `slice_placement_groups` instead.")
        return self._reservation.combined_pg

    @property
    def slice_placement_groups(self) -> list[PlacementGroup]:
        if not self._plan.pg_per_slice:
            raise InvalidArgumentError("pg_per_slice=False, use `slice_placement_group` instead.")
        return [c.worker_pg for c in self._reservation.claims if c.worker_pg is not None]

    @property
    def chips_per_host(self) -> int:
        return self._plan.shape.chips_per_host

    @property
    def devices_per_host(self) -> int:
        return self._plan.devices_per_host

    @property
    def num_hosts(self) -> int:
        return self._plan.shape.num_hosts * self._plan.num_slices

    @property
    def num_bundles(self) -> int:
        return self._plan.num_bundles

    @property
    def topology(self) -> str:
        return self._plan.shape.topology

    @property
    def accelerator_version(self) -> str:
        return self._plan.shape.generation.name

    @property
    def num_slices(self) -> int:
        return self._plan.num_slices

    @property
    def head_placement_groups(self) -> list[PlacementGroup]:
        return [c.head_pg for c in self._reservation.claims if c.head_pg is not None]

    @property
    def bundle_label_selector(self) -> list[dict[str, str]]:
        return [
            selector
            for claim in self._reservation.claims
            for selector in self._plan.worker_selectors(claim.index, claim.target)
        ]

    @property
    def bundle_resources(self) -> dict[str, float]:
        return dict(self._plan.bundle_resources)

    @property
    def tpu_resource_per_chip(self) -> int:
        return self._plan.tpu_resource_per_chip

    # --- additions -------------------------------------------------------------------

    @property
    def plan(self) -> ReservationPlan:
        return self._plan

    @property
    def slice_names(self) -> list[str]:
        """Names of the reserved slices, in slice-index order."""
        return [c.slice_name for c in self._reservation.claims]

    @property
    def slices(self) -> list[SliceInfo]:
        """The cluster view of each reserved slice at the moment it was claimed."""
        return [c.target for c in self._reservation.claims]

    @property
    def is_shut_down(self) -> bool:
        return not self._reservation.claims

    def worker_groups(self) -> list[tuple[PlacementGroup, int]]:
        """``(group, bundle index)`` for every bundle, in rank order (slice-major)."""
        if self.is_shut_down:
            raise SliceShutdownError(
                "this SlicePlacementGroup has been shut down; create a new one"
            )
        if not self._plan.pg_per_slice:
            pg = self._reservation.combined_pg
            assert pg is not None
            return [(pg, i) for i in range(self._plan.num_bundles)]
        return [
            (pg, i)
            for pg in self.slice_placement_groups
            for i in range(self._plan.bundles_per_slice)
        ]

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Whether every worker group is placed (they are once the constructor returns,
        unless a host died since). Waits up to ``timeout`` seconds."""
        groups = {pg.id: pg for pg, _ in self.worker_groups()}
        return all(_wait_all(list(groups.values()), timeout if timeout is not None else 1e9))

    def release_head_pgs(self, slice_index: int | None = None) -> None:
        """Remove the head claims (all, or one slice's). Idempotent."""
        claims = self._reservation.claims
        if slice_index is not None:
            if not 0 <= slice_index < len(claims):
                raise InvalidArgumentError(
                    f"Invalid slice_index: {slice_index}; valid: 0..{len(claims) - 1}."
                )
            claims = [claims[slice_index]]
        for claim in claims:
            _remove(claim.head_pg)
            claim.head_pg = None

    def track(self, refs: Sequence[ray.ObjectRef]) -> None:
        """Remember tasks started on this slice, so :meth:`shutdown` can stop them."""
        if self._launched:
            _, self._launched = ray.wait(
                self._launched, num_returns=len(self._launched), timeout=0, fetch_local=False
            )
        self._launched.extend(refs)

    def _cancel_launched(self) -> None:
        """Cancel tasks still running or queued here. Ray does not fail them when their
        group goes away (queued ones would wait forever); cancelled, their refs resolve
        at once with ``TaskCancelledError``."""
        launched, self._launched = self._launched, []
        if not launched or not ray.is_initialized():
            return
        _, running = ray.wait(launched, num_returns=len(launched), timeout=0, fetch_local=False)
        for ref in running:
            ray.cancel(ref, force=True)

    def shutdown(self) -> None:
        """Stop tasks started here by tpuslice, then remove every worker and head group.
        Idempotent."""
        self._cancel_launched()
        reservation, self._reservation = self._reservation, Reservation()
        _remove(reservation.combined_pg)
        for claim in reservation.claims:
            _remove(claim.worker_pg)
            _remove(claim.head_pg)

    def __enter__(self) -> SlicePlacementGroup:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        state = "shut down" if self.is_shut_down else ", ".join(self.slice_names)
        return f"SlicePlacementGroup({self._plan.shape.pod_type} x{self.num_slices}: {state})"


def slice_placement_group(
    topology: str,
    accelerator_version: str,
    resources_per_bundle: dict[str, float] | None = None,
    num_slices: int = 1,
    chips_per_vm: int | None = None,
    pg_per_slice: bool = False,
    tpu_resource_per_chip: int | None = None,
    **kwargs: Any,
) -> SlicePlacementGroup:
    """Reserve ``num_slices`` slices (Ray 2.60 ``slice_placement_group``); ``kwargs`` may
    carry ``name``, ``lifetime``, ``strategy``, ``head_reservation_timeout_s`` and
    ``bundle_label_selector``."""
    return SlicePlacementGroup(
        topology=topology,
        accelerator_version=accelerator_version,
        resources_per_bundle=resources_per_bundle,
        num_slices=num_slices,
        chips_per_vm=chips_per_vm,
        pg_per_slice=pg_per_slice,
        tpu_resource_per_chip=tpu_resource_per_chip,
        **kwargs,
    )


def reserve_tpu_slice(
    topology: str,
    accelerator_type: str,
    timeout_s: float | None = DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S,
    slice_name: str | None = None,
) -> tuple[str, PlacementGroup] | None:
    """Claim one idle slice's head (Ray 2.60 ``reserve_tpu_slice``): ``(name, head group)``.

    Unlike Ray, it only claims a slice whose every host is idle and runs no helper task.
    """
    if not topology or not accelerator_type:
        return None
    selector: list[Mapping[str, str]] | None = None
    plan = plan_reservation(topology, accelerator_type)
    if slice_name:
        selector = [{SLICE_NAME_LABEL: slice_name}] * plan.num_bundles
        plan = plan_reservation(topology, accelerator_type, bundle_label_selector=selector)
    claim = Reserver(plan, timeout_s, Clock(), heads_only=True).run().claims[0]
    if claim.head_pg is None:
        raise InvalidArgumentError(
            f"{plan.shape.pod_type} is a single-host slice; it has no head to claim"
        )
    return claim.slice_name, claim.head_pg
