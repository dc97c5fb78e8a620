"""Reserve whole TPU slices as Ray placement groups: every host or none, never leaked.

For each slice: a head placement group on worker 0's ``TPU-<podtype>-head`` resource
(the claim other reservers, Ray's own included, respect) and worker bundles pinned by
label to that slice and to each TPU worker id, so bundle *i* is worker *i*. Slices are
picked from the cluster view (idle and whole only) and all N are claimed at once; the
loop that does it is in :mod:`tpuslice._reserve.claim`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import Any, TypeVar

import ray
from ray.util.placement_group import PlacementGroup

from tpuslice._host.context import HostContext
from tpuslice._host.notices import Notice
from tpuslice._reserve import observe
from tpuslice._reserve.claim import Reservation, Reserver
from tpuslice._reserve.groups import RankPlacement, remove_group, wait_all
from tpuslice._reserve.plan import ReservationPlan
from tpuslice._reserve.queue.actor import QUEUE_LINK
from tpuslice._reserve.queue.agents import confirm_released
from tpuslice._reserve.queue.holders import HolderRecords, forget_held, record_held
from tpuslice._reserve.queue.place import this_driver
from tpuslice._reserve.request import SliceRequest
from tpuslice._reserve.targets import Targets
from tpuslice._tpu._connection import connection
from tpuslice._tpu.clock import Clock
from tpuslice._tpu.compat import DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S
from tpuslice._tpu.labels import SLICE_NAME_LABEL, CallEnv
from tpuslice._view.agents import notices_for
from tpuslice._view.cluster import HostInfo, SliceInfo, wait_freed
from tpuslice._view.holders import Holder
from tpuslice.errors import (
    InsufficientSlicesError,
    InvalidArgumentError,
    NotConnectedError,
    ReservationTimeoutError,
    SliceShutdownError,
    first_line,
)

_T = TypeVar("_T", bound="ShutsDownOnExit")


logger = logging.getLogger(__name__)

FORGET_BOUND_S = 2.0
"""How long a hand-back that saw its slices free waits for its holder records and the
queue's notices to go before it reports them free (a few KV calls)."""


def _settled(done: Future[Any]) -> bool:
    """Whether ``done`` finished without error within :data:`FORGET_BOUND_S`."""
    try:
        done.result(timeout=FORGET_BOUND_S)
    except Exception as exc:  # noqa: BLE001  (reported as not freed: the queue reads first)
        logger.debug("holder records not forgotten in time: %s", exc)
        return False
    return True


class ShutsDownOnExit:
    """``with obj:`` calls ``obj.shutdown()`` on the way out, whatever happened."""

    def shutdown(self) -> None:
        raise NotImplementedError

    def __enter__(self: _T) -> _T:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()


class SlicePlacementGroup(ShutsDownOnExit):
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
        num_slices: int | tuple[int, int] = 1,
        chips_per_vm: int | None = None,
        head_reservation_timeout_s: float | None = DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S,
        bundle_label_selector: list[dict[str, str]] | None = None,
        pg_per_slice: bool = False,
        tpu_resource_per_chip: int | None = None,
        *,
        priority: int = 0,
        tenant: str | None = None,
        preemptible: bool = False,
    ) -> None:
        """Reserve the slices; returns once every slice is claimed and placed.

        Args:
            topology: Chip grid of one slice, such as ``"4x4"`` or ``"2x2x2"``.
            accelerator_version: TPU generation, such as ``"v6e"`` or ``"TPU-V4"``.
            resources_per_bundle: Resources of each bundle (default: one whole host,
                ``{"CPU": 1, "TPU": <chips per host>}``).
            strategy: Ray placement strategy of the worker groups.
            name: Name of the worker placement group(s).
            lifetime: ``None`` or ``"detached"`` (outlives this driver).
            num_slices: How many whole slices to reserve, all at once; or a
                ``(min, max)`` tuple: start once ``min`` can be had together, taking as
                many as are idle up to ``max`` (:attr:`num_slices` says how many).
            chips_per_vm: Chips on each host, for shapes offered in more than one form.
            head_reservation_timeout_s: Seconds to wait for idle slices; ``None`` waits
                without limit.
            bundle_label_selector: One label selector per bundle (may pin slice names).
            pg_per_slice: One worker placement group per slice instead of one in all.
            tpu_resource_per_chip: Ray ``TPU`` units per chip (default: the
                ``RAY_TPU_RESOURCE_PER_CHIP`` variable, else 1).
            priority: Place in the cluster-wide queue when slices are short: higher is
                served first, arrival order within a priority (tpuslice only).
            tenant: Whom the slices are charged to, for the cluster's quotas and fair
                share (default: ``TPUSLICE_TENANT``, else the user's name; tpuslice only).
            preemptible: Whether the queue may preempt the reservation, with notice, for
                a request of higher priority or a tenant taking back its quota
                (tpuslice only).

        Raises:
            InvalidArgumentError: an argument is invalid (a ``ValueError``; the message
                names what is valid).
            NotConnectedError: Ray is not initialised.
            InsufficientSlicesError: the cluster does not have the slices and cannot grow.
            ReservationTimeoutError: no idle slices within the timeout.
        """
        request = SliceRequest(
            topology=topology,
            accelerator_version=accelerator_version,
            resources_per_bundle=resources_per_bundle,
            strategy=strategy,
            name=name,
            lifetime=lifetime,
            num_slices=num_slices,
            chips_per_vm=chips_per_vm,
            head_reservation_timeout_s=head_reservation_timeout_s,
            bundle_label_selector=bundle_label_selector,
            pg_per_slice=pg_per_slice,
            tpu_resource_per_chip=tpu_resource_per_chip,
            priority=priority,
            tenant=tenant,
            preemptible=preemptible,
        )
        self._start(request, None)

    def _start(
        self, request: SliceRequest, clock: Clock | None, targets: Targets | None = None
    ) -> None:
        self._reservation = Reservation()
        self._reserved_at = time.monotonic()
        self._launched: list[ray.ObjectRef] = []
        self._worker_pids: list[tuple[int, ray.ObjectRef]] = []
        self._request = request
        self._plan = request.plan
        if not ray.is_initialized():
            raise NotConnectedError(
                "Ray is not initialised: call ray.init(address=...) before reserving slices "
                "(or use tpuslice.testing.SimulatedCluster)"
            )
        asked = time.monotonic()
        self._asked_at = self._held_at = time.time()  # wall clock, as the gang's beats
        try:
            self._reservation = Reserver(request, clock=clock, targets=targets).run()
        except ReservationTimeoutError as exc:  # InsufficientSlicesError is one too
            outcome = "impossible" if isinstance(exc, InsufficientSlicesError) else "timed_out"
            observe.reservation_ended(
                request, outcome, time.monotonic() - asked, detail=first_line(exc)
            )
            raise
        self._reserved_at = time.monotonic()
        self._held_at = time.time()
        self._plan = self._reservation.plan or request.plan  # a range: the count granted
        observe.reservation_ended(
            request, "granted", self._reserved_at - asked, slices=self.slice_names
        )
        self._actor_group: object | None = None
        """The SliceActorGroup whose actors hold the bundles' TPUs while it lives."""
        self._actor_group_lock = threading.Lock()
        self._holder = uuid.uuid4().hex[:12]
        if self._reservation.recorded:
            connection().part(HolderRecords).submit(record_held, self._holders())

    def _holders(self) -> list[Holder]:
        """What the queue is told of the slices held: whose, how urgent, preemptible,
        and the groups to remove if a preemption's grace runs out."""
        request, held = self._request, list[Holder]()
        if request.subslice:  # the queue deals in whole slices; a sub-slice is not one
            return held
        job = str(ray.get_runtime_context().get_job_id())
        for claim in self._reservation.claims:
            groups = [claim.head_pg, claim.worker_pg, self._reservation.combined_pg]
            held.append(
                Holder(
                    holder=self._holder,
                    slice_name=claim.slice_name,
                    tenant=request.tenant or "",
                    priority=request.priority,
                    preemptible=request.preemptible,
                    since=self._held_at,
                    who=this_driver(),
                    groups=tuple(dict.fromkeys(g.id.hex() for g in groups if g is not None)),
                    job=job,
                    nodes=tuple(h.node_id for h in claim.target.hosts.values()),
                )
            )
        return held

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
        """Head claims held as groups of their own: none, as a rule. Ray 2.60 makes one
        per slice; tpuslice holds each slice's head resource in bundle 0 of its worker
        group (one placement round), so it stays claimed until :meth:`shutdown`."""
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

    def _worker_groups(self) -> list[tuple[PlacementGroup, int]]:
        """Where each rank's bundle is.

        Returns:
            ``(group, bundle index)`` for every bundle, in rank order (slice-major).

        Raises:
            SliceShutdownError: the reservation was shut down.
        """
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

    def _ranks(self, slice_index: int | None = None) -> list[RankPlacement]:
        """Where each rank runs: its bundle (see :meth:`Plumbing.ranks`)."""
        tpu = self.bundle_resources.get("TPU", self.devices_per_host)
        return [
            RankPlacement(context, group, bundle, tpu)
            for context, (group, bundle) in zip(
                host_contexts(self), self._worker_groups(), strict=True
            )
            if slice_index is None or context.slice_index == slice_index
        ]

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Whether every worker group is placed (they are once the constructor returns,
        unless a host died since).

        Args:
            timeout: Seconds to wait (``None``: effectively no limit).

        Returns:
            ``True`` once all are placed; ``False`` if the time ran out first.

        Raises:
            SliceShutdownError: the reservation was shut down.
        """
        groups = {pg.id: pg for pg, _ in self._worker_groups()}
        return all(wait_all(list(groups.values()), timeout if timeout is not None else 1e9))

    def release_head_pgs(self, slice_index: int | None = None) -> None:
        """Remove the head claims held as groups of their own (all, or one slice's).
        Idempotent. A head held in bundle 0 of the worker group (the rule, see
        :attr:`head_placement_groups`) stays claimed until :meth:`shutdown`: freeing it
        would show the slice's head free while its hosts are held.

        Args:
            slice_index: That slice's head only (``None``: every slice's).

        Raises:
            InvalidArgumentError: ``slice_index`` is out of range.
        """
        claims = self._reservation.claims
        if slice_index is not None:
            if not 0 <= slice_index < len(claims):
                raise InvalidArgumentError(
                    f"Invalid slice_index: {slice_index}; valid: 0..{len(claims) - 1}."
                )
            claims = [claims[slice_index]]
        for claim in claims:
            remove_group(claim.head_pg)
            claim.head_pg = None

    def _track(
        self,
        refs: Sequence[ray.ObjectRef],
        worker_pids: Sequence[tuple[int, ray.ObjectRef]] = (),
    ) -> None:
        """Remember tasks started on this slice, so :meth:`shutdown` can stop them (see
        :meth:`Plumbing.track`).

        Args:
            refs: The tasks' refs.
            worker_pids: ``(rank, ref of the pid that ran it)`` per task: the hand-back
                stops those processes on the rank's host if they still own its TPU.
        """
        if self._launched:
            _, self._launched = ray.wait(
                self._launched, num_returns=len(self._launched), timeout=0, fetch_local=False
            )
        self._launched.extend(refs)
        self._worker_pids.extend(worker_pids)

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

    def _rank_env(self, rank: int) -> CallEnv:
        """What this reservation sets for rank ``rank``'s calls besides its slice context:
        nothing for whole slices, whose hosts' own ``TPU_*`` values hold (a sub-slice
        sets its own).

        Args:
            rank: A rank of this reservation.

        Returns:
            Variables to set (or, as None, unset) around the call.
        """
        return {}

    def _confirm_free(self, pids: Mapping[str, set[int]] | None = None) -> None:
        """Have each host's agent stop the processes of this work that still own its TPU,
        and confirm it (see :func:`tpuslice._reserve.queue.agents.confirm_released`).

        Args:
            pids: Per host, pids of processes that ran this slice's tasks.
        """
        confirm_released(sorted(set(self._rank_nodes())), pids)

    def notices(self) -> list[Notice]:
        """Preemption or maintenance notices standing on this reservation's hosts now,
        most urgent first (what their metadata servers warned of; see
        :mod:`tpuslice._host.notices`). Reads Ray's KV store: one call when there are none.

        Returns:
            The notices; empty when none stands.
        """
        found = notices_for(sorted(set(self._rank_nodes())))
        return sorted(found.values(), key=lambda n: n.deadline)

    def _rank_nodes(self) -> list[str]:
        """The Ray node id of each rank's host.

        Returns:
            One node id per rank, in rank order.
        """
        return [host.node_id for host in self._rank_hosts()]

    def _rank_hosts(self) -> list[HostInfo]:
        """Each rank's host, as it was when reserved.

        Returns:
            One host per rank, in rank order.
        """
        per_host = self._plan.bundles_per_host
        return [
            host
            for claim in self._reservation.claims
            for host in claim.target.hosts.values()
            for _ in range(per_host)
        ]

    def _reported_pids(self) -> dict[str, set[int]]:
        """Per host, the pids of the processes that ran this slice's tasks (as far as
        they finished and reported)."""
        reports, self._worker_pids = self._worker_pids, []
        if not reports or not ray.is_initialized():
            return {}
        nodes = self._rank_nodes()
        refs = [ref for _, ref in reports]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=True)
        ready = set(done)
        found: dict[str, set[int]] = {}
        for rank, ref in reports:
            if ref in ready and rank < len(nodes):
                try:
                    found.setdefault(nodes[rank], set()).add(int(ray.get(ref, timeout=5)))
                except ray.exceptions.RayError:
                    continue  # failed or cancelled: the agents find its worker by its job
        return found

    def shutdown(self) -> None:
        """Give the slices back: cancel the tasks started here by tpuslice, confirm on
        each host that no process of this work still owns its TPU (an idle worker keeps
        libtpu's lock: the host's agent stops it), remove every worker and head group
        (which ends the actors inside them), wait (bounded) until Ray's resource view
        shows the hosts free, so that the slices are claimable at once when this returns
        (see :func:`tpuslice._view.cluster.wait_freed`), and tell the queue. Idempotent."""
        pids = self._reported_pids()
        self._cancel_launched()
        if self._reservation.claims:
            self._confirm_free(pids)
        reservation, self._reservation = self._reservation, Reservation()
        hosts = [h for claim in reservation.claims for h in claim.target.hosts.values()]
        names = [claim.slice_name for claim in reservation.claims]
        forgotten = (
            # While the groups go: a held slice with no record counts as a claim in flight.
            connection()
            .part(HolderRecords)
            .submit(forget_held, names, [h.node_id for h in hosts], self._holder)
            if reservation.recorded and ray.is_initialized()
            else None
        )
        # Heads first: a slice whose head is free while its TPUs are still held looks
        # busy to everyone; the other order would show it claimed with no work on it.
        for claim in reservation.claims:
            remove_group(claim.head_pg)
        remove_group(reservation.combined_pg)
        for claim in reservation.claims:
            remove_group(claim.worker_pg)
        if reservation.claims and ray.is_initialized():
            # Reported free, the slices may be granted at once: the next holder must not
            # meet this one's records or the queue's notice to it. Records not gone in
            # time are reported as not freed: the queue then reads before it grants.
            head = self._plan.shape.head_resource if self._plan.needs_head_claim else None
            # Told only once Ray's view shows the hosts free: told before, the next
            # claimant could take them before they were ever shown free, and this wait
            # (so that this driver's next read finds them free) would run to its bound.
            freed = wait_freed(hosts, head) and (forgotten is None or _settled(forgotten))
            QUEUE_LINK.notify_released(names, freed=freed)
        if reservation.claims:
            held = time.monotonic() - self._reserved_at
            what = observe.describe_request(self._request)[0]
            observe.released([c.slice_name for c in reservation.claims], held, what)

    def __repr__(self) -> str:
        state = "shut down" if self.is_shut_down else ", ".join(self.slice_names)
        return f"SlicePlacementGroup({self._plan.shape.pod_type} x{self.num_slices}: {state})"


def slice_placement_group(
    topology: str,
    accelerator_version: str,
    resources_per_bundle: dict[str, float] | None = None,
    num_slices: int | tuple[int, int] = 1,
    chips_per_vm: int | None = None,
    pg_per_slice: bool = False,
    tpu_resource_per_chip: int | None = None,
    **kwargs: Any,
) -> SlicePlacementGroup:
    """Reserve ``num_slices`` slices (Ray 2.60 ``slice_placement_group``).

    Args:
        topology: Chip grid of one slice, such as ``"4x4"``.
        accelerator_version: TPU generation, such as ``"v6e"``.
        resources_per_bundle: Resources of each bundle (default: one whole host).
        num_slices: Whole slices to reserve, all at once, or a ``(min, max)`` range.
        chips_per_vm: Chips per host, for shapes offered in more than one form.
        pg_per_slice: One worker placement group per slice.
        tpu_resource_per_chip: Ray ``TPU`` units per chip.
        **kwargs: ``name``, ``lifetime``, ``strategy``, ``head_reservation_timeout_s``,
            ``bundle_label_selector``, ``priority``, ``tenant`` and ``preemptible``, as for
            :class:`SlicePlacementGroup`.

    Returns:
        The reservation, holding every slice.

    Raises:
        InvalidArgumentError: an invalid argument.
        NotConnectedError: Ray is not initialised.
        InsufficientSlicesError: the cluster cannot have the slices.
        ReservationTimeoutError: no idle slices in time.
    """
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
    """Claim one idle slice's head (Ray 2.60 ``reserve_tpu_slice``).

    Unlike Ray, it only claims a slice whose every host is idle and runs no helper task.

    Args:
        topology: Chip grid of the slice, such as ``"4x4"``.
        accelerator_type: TPU generation, such as ``"v6e"``.
        timeout_s: Seconds to wait for an idle slice; ``None`` waits without limit.
        slice_name: Claim this slice only.

    Returns:
        ``(slice name, head placement group)``, or ``None`` if ``topology`` or
        ``accelerator_type`` is empty (as in Ray).

    Raises:
        InvalidArgumentError: an invalid shape, or a single-host slice (it has no head).
        InsufficientSlicesError: the cluster has no such slice and cannot grow.
        ReservationTimeoutError: no idle slice within the timeout.
    """
    if not topology or not accelerator_type:
        return None
    request = SliceRequest(
        topology=topology,
        accelerator_version=accelerator_type,
        head_reservation_timeout_s=timeout_s,
    )
    plan = request.plan
    if not plan.needs_head_claim:  # checked before waiting for a slice, not after
        raise InvalidArgumentError(
            f"{plan.shape.pod_type} is a single-host slice; it has no head to claim: "
            "reserve it with SlicePlacementGroup instead"
        )
    if slice_name:
        pinned = [{SLICE_NAME_LABEL: slice_name}] * plan.num_bundles
        request = dataclasses.replace(request, bundle_label_selector=pinned)
    claim = Reserver(request, heads_only=True).run().claims[0]
    assert claim.head_pg is not None  # multi-host claims always hold their head
    return claim.slice_name, claim.head_pg


def reserve_slices(request: SliceRequest, *, clock: Clock | None = None) -> SlicePlacementGroup:
    """Reserve what ``request`` asks for: the path every tpuslice runner takes.

    Args:
        request: The validated request.
        clock: Injected time for tests (default: the real clock).

    Returns:
        The reservation, holding every slice.

    Raises:
        NotConnectedError: Ray is not initialised.
        InsufficientSlicesError: the cluster does not have the slices and cannot grow.
        ReservationTimeoutError: no idle slices within the request's timeout.
    """
    spg = SlicePlacementGroup.__new__(SlicePlacementGroup)
    spg._start(request, clock)
    return spg


class Plumbing:
    """What tpuslice's own runners (``run_on_slice``, actor groups, resilient runs, the
    CLI) use of a reservation, kept off its public handle so that the handle shows
    Ray's names and our documented additions only.

    Args:
        spg: The reservation (a :class:`SlicePlacementGroup` or a subclass).
    """

    __slots__ = ("_spg",)

    def __init__(self, spg: SlicePlacementGroup) -> None:
        self._spg = spg

    @property
    def plan(self) -> ReservationPlan:
        """What was derived from the request: shape, bundles, selectors."""
        return self._spg._plan

    @property
    def request(self) -> SliceRequest:
        """The request the reservation was made from."""
        return self._spg._request

    @property
    def actor_group(self) -> object | None:
        """The SliceActorGroup whose actors hold the bundles' TPUs, while it lives."""
        return self._spg._actor_group

    def hold_for_actor_group(self, group: object) -> None:
        """Make ``group`` the reservation's one actor group, before its actors start.

        Args:
            group: The SliceActorGroup.

        Raises:
            InvalidArgumentError: another actor group lives on the reservation.
        """
        with self._spg._actor_group_lock:
            if self._spg._actor_group is not None:
                raise InvalidArgumentError(
                    "this slice already has a SliceActorGroup, whose actors hold its TPUs; "
                    "shut that group down first, or reserve another slice"
                )
            self._spg._actor_group = group

    def drop_actor_group(self, group: object) -> None:
        """``group`` has gone (idempotent; another group's hold is left alone).

        Args:
            group: The SliceActorGroup.
        """
        with self._spg._actor_group_lock:
            if self._spg._actor_group is group:
                self._spg._actor_group = None

    def confirm_free(self, *, after_tasks: bool = False) -> None:
        """Confirm on every host that no process of this work owns its TPU, stopping any
        that does (an actor group's actors, once killed, or a task's idle worker).

        Args:
            after_tasks: Only if tasks ran on the reservation (else there is nothing
                to ask: no call has been made on it).
        """
        if after_tasks and not self._spg._worker_pids and not self._spg._launched:
            return
        self._spg._confirm_free(self._spg._reported_pids())

    def worker_groups(self) -> list[tuple[PlacementGroup, int]]:
        """Where each rank's bundle is.

        Returns:
            ``(group, bundle index)`` for every bundle, in rank order (slice-major).

        Raises:
            SliceShutdownError: the reservation was shut down.
        """
        return self._spg._worker_groups()

    def track(
        self,
        refs: Sequence[ray.ObjectRef],
        worker_pids: Sequence[tuple[int, ray.ObjectRef]] = (),
    ) -> None:
        """Remember tasks started on the reservation, so its shutdown can stop them.

        Args:
            refs: The tasks' refs.
            worker_pids: ``(rank, ref of the pid that ran it)`` per task: the hand-back
                stops those processes on the rank's host if they still own its TPU.
        """
        self._spg._track(refs, worker_pids)

    def asked_at(self) -> float:
        """When the reservation asked for its slices (wall clock).

        Returns:
            Seconds since the epoch.
        """
        return self._spg._asked_at

    def held_at(self) -> float:
        """When it held them (wall clock).

        Returns:
            Seconds since the epoch.
        """
        return self._spg._held_at

    def queued_s(self) -> float:
        """Of the time from asking to holding, how long it waited for slices.

        Returns:
            Seconds.
        """
        return self._spg._reservation.queued_s

    def arrival(self) -> int | None:
        """Its place in the queue's arrival order, if it waited there.

        Returns:
            The arrival number, or ``None``.
        """
        return self._spg._reservation.arrival

    def ranks(self, slice_index: int | None = None) -> list[RankPlacement]:
        """Where each rank runs: its context, its bundle, and the bundle's TPU. Tasks and
        actor groups are both placed from this.

        Args:
            slice_index: Only that slice's ranks (``None``: every rank).

        Returns:
            One per rank, in rank order (slice-major, then TPU worker id).

        Raises:
            SliceShutdownError: the reservation was shut down.
        """
        return self._spg._ranks(slice_index)

    def rank_env(self, rank: int) -> CallEnv:
        """What the reservation sets for rank ``rank``'s calls besides its slice context.

        Args:
            rank: A rank of the reservation.

        Returns:
            Variables to set (or, as None, unset) around the call.
        """
        return self._spg._rank_env(rank)

    def rank_nodes(self) -> list[str]:
        """The Ray node id of each rank's host.

        Returns:
            One node id per rank, in rank order.
        """
        return self._spg._rank_nodes()

    def rank_hosts(self) -> list[HostInfo]:
        """Each rank's host, as it was when reserved (its slice, worker id and node id).

        Returns:
            One host per rank, in rank order.
        """
        return self._spg._rank_hosts()

    def suspect_slices(self) -> list[SliceInfo]:
        """The slices taken as a last resort: a host of each is suspect
        (:attr:`~tpuslice._view.cluster.SliceState.SUSPECT`), so work may check them first.

        Returns:
            Them, in slice order; empty as a rule.
        """
        return self._spg._reservation.suspects


def plumbing(spg: SlicePlacementGroup) -> Plumbing:
    """The runners' view of a reservation (see :class:`Plumbing`).

    Args:
        spg: The reservation.

    Returns:
        Its plumbing.
    """
    return Plumbing(spg)


def host_contexts(spg: SlicePlacementGroup) -> list[HostContext]:
    """One context per bundle, in rank order. Pure given the reservation.

    Args:
        spg: A reservation (shut down or not: only its plan and slices are read).

    Returns:
        ``contexts[i]`` for rank *i*: slice-major, then TPU worker id.
    """
    plan = spg._plan
    slices = spg.slices
    coordinator = slices[0].hosts[0].address if slices else ""
    contexts: list[HostContext] = []
    for slice_index, info in enumerate(slices):
        for k in range(plan.bundles_per_slice):
            contexts.append(
                HostContext(
                    rank=len(contexts),
                    world_size=plan.num_bundles,
                    slice_index=slice_index,
                    num_slices=plan.num_slices,
                    slice_name=info.name,
                    worker_id=k // plan.bundles_per_host,
                    hosts_per_slice=plan.shape.num_hosts,
                    coordinator_address=coordinator,
                )
            )
    return contexts
