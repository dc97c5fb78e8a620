"""Reserve whole TPU slices as Ray placement groups: every host or none, never leaked.

A reservation is a frozen record, :class:`Reserved`, made by :func:`reserve` (through the
loop in :mod:`tpuslice._reserve.claim`) and given back by :func:`hand_back`; runners act on
it through the free functions here. :class:`SlicePlacementGroup` is Ray's handle over one
record; what changes while it is held is a :class:`Hold`, kept by the reserving process.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

import ray
from ray.util.placement_group import PlacementGroup

from tpuslice._host.context import HostContext
from tpuslice._host.notices import Notice
from tpuslice._reserve import observe
from tpuslice._reserve.claim import Reserver
from tpuslice._reserve.groups import RankPlacement, remove_group, wait_all
from tpuslice._reserve.plan import ReservationPlan
from tpuslice._reserve.queue.actor import notify_released
from tpuslice._reserve.queue.agents import confirm_released
from tpuslice._reserve.queue.holders import HolderRecords, forget_held, record_held
from tpuslice._reserve.queue.place import this_driver
from tpuslice._reserve.request import SliceRequest
from tpuslice._reserve.targets import Targets
from tpuslice._tpu._connection import connection
from tpuslice._tpu.compat import DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S
from tpuslice._tpu.labels import SLICE_NAME_LABEL, CallEnv
from tpuslice._tpu.subslice import subslice_env
from tpuslice._view.agents import notices_for
from tpuslice._view.cluster import HostInfo, SliceInfo, SliceState, wait_freed
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
"""How long a hand-back waits for its holder records to go before it reports them free."""


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


PROCESS = uuid.uuid4().hex
"""This process, as a reservation's :attr:`Reserved.home` names it."""


@dataclass(frozen=True)
class HeldSlice:
    """One slice held: its view when claimed, and its own worker group (``pg_per_slice``).
    Its head is claimed in bundle 0 of its worker bundles, never in a group of its own."""

    index: int
    info: SliceInfo
    worker_pg: PlacementGroup | None


@dataclass(frozen=True)
class SubsliceAt:
    """Where a sub-slice sits in its parent slice."""

    parent_topology: str
    index: int
    selectors: tuple[tuple[tuple[str, str], ...], ...]
    """One label selector per bundle, in rank order (slice name and worker id)."""


@dataclass(frozen=True, eq=False)
class Reserved:
    """What a reservation holds, frozen, so it pickles to a task and reads the same there.
    Equal when the keys are; times are wall clock."""

    key: str
    """Unique per reservation: the holder id the queue's records and notices carry."""
    home: str
    """The process that reserved it (:data:`PROCESS`): the only one that hands it back."""
    request: SliceRequest
    plan: ReservationPlan
    """The plan reserved: for a range of slices, with the count granted."""
    slices: tuple[HeldSlice, ...]
    combined_pg: PlacementGroup | None
    asked_at: float
    held_at: float
    queued_s: float
    """Of the time from asking to holding, how long it waited for slices."""
    arrival: int | None
    """Its place in the queue's arrival order, if it waited there."""
    recorded: bool
    """Whether the queue was told whose its slices are: with quotas set, or preemptible
    (other work it may take as no one's, at no cost)."""
    subslice: SubsliceAt | None = None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Reserved) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)


class Hold:
    """What changes while this process holds a reservation: its tasks, their pids, and
    the actor group whose actors hold its TPUs."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.launched: list[ray.ObjectRef] = []
        self.worker_pids: list[tuple[int, ray.ObjectRef]] = []
        self.actor_group: object | None = None


class Holds(dict[str, Hold]):
    """This connection's holds by reservation key; a hand-back takes its hold out first,
    under :attr:`lock`."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()


def _holds() -> Holds:
    return connection().part(Holds)


def reserve(request: SliceRequest, *, targets: Targets | None = None) -> Reserved:
    """Reserve what ``request`` asks for (``targets``: what to claim, when not whole
    slices): the one way every reservation is made. The record is held by this process
    until :func:`hand_back`."""
    if not ray.is_initialized():
        raise NotConnectedError(
            "Ray is not initialised: call ray.init(address=...) before reserving slices "
            "(or use tpuslice.testing.SimulatedCluster)"
        )
    asked, asked_at = time.monotonic(), time.time()  # wall clock, as the gang's beats
    try:
        reservation = Reserver(request, targets=targets).run()
    except ReservationTimeoutError as exc:  # InsufficientSlicesError is one too
        outcome = "impossible" if isinstance(exc, InsufficientSlicesError) else "timed_out"
        observe.reservation_ended(
            request, outcome, time.monotonic() - asked, detail=first_line(exc)
        )
        raise
    held = Reserved(
        key=uuid.uuid4().hex[:12],
        home=PROCESS,
        request=request,
        plan=reservation.plan or request.plan,
        slices=tuple(HeldSlice(c.index, c.target, c.worker_pg) for c in reservation.claims),
        combined_pg=reservation.combined_pg,
        asked_at=asked_at,
        held_at=time.time(),
        queued_s=reservation.queued_s,
        arrival=reservation.arrival,
        recorded=reservation.recorded,
    )
    holds = _holds()
    with holds.lock:
        holds[held.key] = Hold()
    names = [s.info.name for s in held.slices]
    observe.reservation_ended(request, "granted", time.monotonic() - asked, slices=names)
    if held.recorded:
        connection().part(HolderRecords).submit(record_held, _holders(held))
    return held


def _holders(held: Reserved) -> list[Holder]:
    """What the queue is told of the slices held, with the groups a preemption removes."""
    request = held.request
    if request.subslice:  # the queue deals in whole slices; a sub-slice is not one
        return []
    job = str(ray.get_runtime_context().get_job_id())
    found = []
    for piece in held.slices:
        groups = [piece.worker_pg, held.combined_pg]
        found.append(
            Holder(
                holder=held.key,
                slice_name=piece.info.name,
                tenant=request.tenant or "",
                priority=request.priority,
                preemptible=request.preemptible,
                since=held.held_at,
                who=this_driver(),
                groups=tuple(dict.fromkeys(g.id.hex() for g in groups if g is not None)),
                job=job,
                nodes=tuple(h.node_id for h in piece.info.hosts.values()),
            )
        )
    return found


def suspect_slices(held: Reserved) -> list[SliceInfo]:
    """The slices taken as a last resort (a host of each is suspect), to check first;
    empty as a rule."""
    return [s.info for s in held.slices if s.info.state is SliceState.SUSPECT]


def hold_of(held: Reserved) -> Hold | None:
    """This process's hold on ``held``; ``None`` once handed back, or in another process."""
    return _holds().get(held.key)


def _given_back_here(held: Reserved) -> bool:
    return held.key not in _holds()


def worker_groups(held: Reserved) -> list[tuple[PlacementGroup, int]]:
    """``(group, bundle index)`` for every bundle, in rank order (slice-major); raises
    :class:`~tpuslice.errors.SliceShutdownError` once handed back."""
    if held.home == PROCESS and _given_back_here(held):
        raise SliceShutdownError("this SlicePlacementGroup has been shut down; create a new one")
    plan = held.plan
    if not plan.pg_per_slice:
        assert held.combined_pg is not None
        return [(held.combined_pg, i) for i in range(plan.num_bundles)]
    return [
        (s.worker_pg, i)
        for s in held.slices
        if s.worker_pg is not None
        for i in range(plan.bundles_per_slice)
    ]


def host_contexts(held: Reserved) -> list[HostContext]:
    """One context per bundle, in rank order (slice-major, then TPU worker id). Pure."""
    plan = held.plan
    infos = [s.info for s in held.slices]
    coordinator = infos[0].hosts[0].address if infos else ""
    contexts: list[HostContext] = []
    for slice_index, info in enumerate(infos):
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


def ranks(held: Reserved, slice_index: int | None = None) -> list[RankPlacement]:
    """Where each rank runs, in rank order: its context, bundle and TPU (tasks and actors
    alike); only ``slice_index``'s ranks if given. Raises like :func:`worker_groups`."""
    tpu = held.plan.bundle_resources.get("TPU", held.plan.devices_per_host)
    return [
        RankPlacement(context, group, bundle, tpu)
        for context, (group, bundle) in zip(host_contexts(held), worker_groups(held), strict=True)
        if slice_index is None or context.slice_index == slice_index
    ]


def rank_hosts(held: Reserved) -> list[HostInfo]:
    """Each rank's host, in rank order, as it was when reserved."""
    per_host = held.plan.bundles_per_host
    return [h for s in held.slices for h in s.info.hosts.values() for _ in range(per_host)]


def rank_env(held: Reserved, rank: int) -> CallEnv:
    """Variables to set (or, as None, unset) around rank ``rank``'s calls: nothing for
    whole slices; a sub-slice's own ``TPU_*`` values, so libtpu and JAX see it as the slice."""
    if held.subslice is None:
        return {}
    hosts = [h.address for h in held.slices[0].info.hosts.values()] if held.slices else []
    return subslice_env(held.plan.shape, hosts, rank // held.plan.bundles_per_host)


def track(
    held: Reserved,
    refs: Sequence[ray.ObjectRef],
    worker_pids: Sequence[tuple[int, ray.ObjectRef]] = (),
) -> None:
    """Remember tasks started on the reservation, so its hand-back can stop them;
    ``worker_pids``: ``(rank, ref of its pid)`` per task, stopped at hand-back if they
    still own the TPU."""
    hold = hold_of(held)
    if hold is None:
        return  # a copy in a task: its tasks end with it; the reserving driver hands back
    with hold.lock:
        hold.launched = [*_running(hold.launched), *refs]
        hold.worker_pids.extend(worker_pids)


def actor_group_of(held: Reserved) -> object | None:
    """The SliceActorGroup whose actors hold the bundles' TPUs, while it lives."""
    hold = hold_of(held)
    return None if hold is None else hold.actor_group


def hold_for_actor_group(held: Reserved, group: object) -> None:
    """Make ``group`` the reservation's one actor group, before its actors start; an
    :class:`~tpuslice.errors.InvalidArgumentError` if another lives on it."""
    hold = hold_of(held)
    if hold is None:
        return
    with hold.lock:
        if hold.actor_group is not None:
            raise InvalidArgumentError(
                "this slice already has a SliceActorGroup, whose actors hold its TPUs; "
                "shut that group down first, or reserve another slice"
            )
        hold.actor_group = group


def drop_actor_group(held: Reserved, group: object) -> None:
    """``group`` has gone (idempotent; another group's hold is left alone)."""
    hold = hold_of(held)
    if hold is not None:
        with hold.lock:
            if hold.actor_group is group:
                hold.actor_group = None


def confirm_free(held: Reserved, *, after_tasks: bool = False) -> None:
    """Confirm on every host that no process of this work owns its TPU, stopping any that
    does (killed actors, or a task's idle worker). ``after_tasks``: only if tasks ran on
    the reservation (else there is nothing to ask)."""
    hold = hold_of(held)
    if hold is None or (after_tasks and not hold.worker_pids and not hold.launched):
        return
    confirm_released(_nodes(held), _reported_pids(held, hold))


def _nodes(held: Reserved) -> list[str]:
    return sorted({h.node_id for h in rank_hosts(held)})


def _reported_pids(held: Reserved, hold: Hold) -> dict[str, set[int]]:
    """Per host, the pids of the processes that ran this reservation's finished tasks."""
    with hold.lock:
        reports, hold.worker_pids = hold.worker_pids, []
    if not reports or not ray.is_initialized():
        return {}
    nodes = [h.node_id for h in rank_hosts(held)]
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


def _cancel_launched(hold: Hold) -> None:
    """Cancel tasks still running or queued: Ray does not fail them when their group goes
    (queued ones would wait forever); cancelled, they resolve at once."""
    with hold.lock:
        launched, hold.launched = hold.launched, []
    if not launched or not ray.is_initialized():
        return
    for ref in _running(launched):
        ray.cancel(ref, force=True)


def _running(refs: list[ray.ObjectRef]) -> list[ray.ObjectRef]:
    """The tasks not finished yet, without waiting or fetching their results."""
    if not refs:
        return []
    _, running = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
    return list(running)


def hand_back(held: Reserved) -> None:
    """Give the slices back: cancel their tasks, have each host's agent stop any process
    of this work that still owns its TPU (an idle worker keeps libtpu's lock), remove the
    groups, wait (bounded) until Ray shows the hosts free, so they are claimable at once,
    and tell the queue. Idempotent. Elsewhere than the reserving process, only the groups
    are removed, as Ray's handle does."""
    holds = _holds()
    with holds.lock:
        hold = holds.pop(held.key, None)
    if hold is None:
        if held.home != PROCESS and ray.is_initialized():
            _remove_groups(held)
        return
    pids = _reported_pids(held, hold)
    _cancel_launched(hold)
    if held.slices:
        confirm_released(_nodes(held), pids)
    hosts = [h for piece in held.slices for h in piece.info.hosts.values()]
    names = [piece.info.name for piece in held.slices]
    forgotten = (
        # While the groups go: a held slice with no record counts as a claim in flight.
        connection()
        .part(HolderRecords)
        .submit(forget_held, names, [h.node_id for h in hosts], held.key)
        if held.recorded and ray.is_initialized()
        else None
    )
    _remove_groups(held)
    if held.slices and ray.is_initialized():
        # Reported free, the slices may be granted at once, so the next holder must not
        # meet this one's records (not gone in time: reported not freed, and the queue
        # reads first). Told only once Ray shows the hosts free: told before, the next
        # claimant could take them first and this wait would run to its bound.
        plan = held.plan
        head = plan.shape.head_resource if plan.needs_head_claim else None
        freed = wait_freed(hosts, head) and (forgotten is None or _settled(forgotten))
        notify_released(names, freed=freed)
    if held.slices:
        observe.released(names, time.time() - held.held_at, held.request)


def _remove_groups(held: Reserved) -> None:
    remove_group(held.combined_pg)
    for piece in held.slices:
        remove_group(piece.worker_pg)


class SliceHandle(ShutsDownOnExit):
    """A handle over one :class:`Reserved`, whose properties read the record, so it
    pickles to a task and reads the same there. Equal when the reservations are."""

    def __init__(self, held: Reserved) -> None:
        self._reserved = held

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SliceHandle) and other._reserved == self._reserved

    def __hash__(self) -> int:
        return hash(self._reserved)

    def _held_slices(self) -> list[HeldSlice]:
        return [] if self.is_shut_down else list(self._reserved.slices)

    @property
    def slice_names(self) -> list[str]:
        """Names of the reserved slices, in slice-index order (none once shut down)."""
        return [s.info.name for s in self._held_slices()]

    @property
    def slices(self) -> list[SliceInfo]:
        """Each reserved slice as seen when claimed (none once shut down)."""
        return [s.info for s in self._held_slices()]

    @property
    def num_hosts(self) -> int:
        """Hosts reserved, over every slice."""
        return self._reserved.plan.shape.num_hosts * self._reserved.plan.num_slices

    @property
    def is_shut_down(self) -> bool:
        """Whether the slices were given back: in a task, whether Ray removed the group."""
        held = self._reserved
        if held.home == PROCESS:
            return _given_back_here(held)
        group = held.combined_pg or next((s.worker_pg for s in held.slices if s.worker_pg), None)
        if group is None or not ray.is_initialized():
            return True
        return bool(ray.util.placement_group_table(group).get("state") == "REMOVED")

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Whether every worker group is placed (unless a host died since reserving).

        Args:
            timeout: Seconds to wait (``None``: effectively no limit).

        Returns:
            ``True`` once all are placed; ``False`` if the time ran out first.

        Raises:
            SliceShutdownError: the reservation was shut down.
        """
        groups = {pg.id: pg for pg, _ in worker_groups(self._reserved)}
        return all(wait_all(list(groups.values()), timeout if timeout is not None else 1e9))

    def notices(self) -> list[Notice]:
        """Preemption or maintenance notices standing on this reservation's hosts now,
        most urgent first.

        Returns:
            The notices; empty when none stands.
        """
        found = notices_for(_nodes(self._reserved))
        return sorted(found.values(), key=lambda n: n.deadline)

    def shutdown(self) -> None:
        """Give the slices back (:func:`hand_back`). Idempotent; a copy in a task only
        removes the groups, as Ray's handle does."""
        hand_back(self._reserved)


def record_of(handle: SliceHandle) -> Reserved:
    """The record a handle holds."""
    return handle._reserved


class SlicePlacementGroup(SliceHandle):
    """A reservation of ``num_slices`` whole TPU slices (Ray 2.60 ``SlicePlacementGroup``).

    A constructed object holds every slice; use it as a context manager, or call
    :meth:`shutdown`, to give them back. A copy sent to a task reads the same reservation.
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
            resources_per_bundle: Resources of each bundle (default: one whole host).
            strategy: Ray placement strategy of the worker groups.
            name: Name of the worker placement group(s).
            lifetime: ``None`` or ``"detached"`` (outlives this driver).
            num_slices: Slices to reserve at once, or ``(min, max)``: up to max, once min are idle.
            chips_per_vm: Chips on each host, for shapes offered in more than one form.
            head_reservation_timeout_s: Seconds to wait for idle slices; ``None``: no limit.
            bundle_label_selector: One label selector per bundle (may pin slice names).
            pg_per_slice: One worker placement group per slice instead of one in all.
            tpu_resource_per_chip: ``TPU`` units per chip (``RAY_TPU_RESOURCE_PER_CHIP``, else 1).
            priority: Place in the cluster-wide queue: higher first (tpuslice only).
            tenant: Whom it is charged to (``TPUSLICE_TENANT``, else the user; tpuslice only).
            preemptible: Whether the queue may preempt it, with notice (tpuslice only).

        Raises:
            InvalidArgumentError: an invalid argument (a ``ValueError`` naming what is valid).
            NotConnectedError: Ray is not initialised.
            InsufficientSlicesError: the cluster lacks the slices and cannot grow.
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
        super().__init__(reserve(request))

    # --- Ray 2.60 properties ---------------------------------------------------------

    @property
    def slice_placement_group(self) -> PlacementGroup | None:
        if self._reserved.plan.pg_per_slice:
            raise InvalidArgumentError("pg_per_slice=True, use `slice_placement_groups` instead.")
        return None if self.is_shut_down else self._reserved.combined_pg

    placement_group = slice_placement_group

    @property
    def slice_placement_groups(self) -> list[PlacementGroup]:
        if not self._reserved.plan.pg_per_slice:
            raise InvalidArgumentError("pg_per_slice=False, use `slice_placement_group` instead.")
        return [s.worker_pg for s in self._held_slices() if s.worker_pg is not None]

    @property
    def chips_per_host(self) -> int:
        return self._reserved.plan.shape.chips_per_host

    @property
    def devices_per_host(self) -> int:
        return self._reserved.plan.devices_per_host

    @property
    def num_bundles(self) -> int:
        return self._reserved.plan.num_bundles

    @property
    def topology(self) -> str:
        return self._reserved.plan.shape.topology

    @property
    def accelerator_version(self) -> str:
        return self._reserved.plan.shape.generation.name

    @property
    def num_slices(self) -> int:
        return self._reserved.plan.num_slices

    @property
    def head_placement_groups(self) -> list[PlacementGroup]:
        """None: tpuslice holds each slice's head in bundle 0 of its worker group (one
        placement round), where Ray 2.60 makes a group per slice."""
        return []

    @property
    def bundle_label_selector(self) -> list[dict[str, str]]:
        plan = self._reserved.plan
        return [
            selector
            for piece in self._held_slices()
            for selector in plan.worker_selectors(piece.index, piece.info)
        ]

    @property
    def bundle_resources(self) -> dict[str, float]:
        return dict(self._reserved.plan.bundle_resources)

    @property
    def tpu_resource_per_chip(self) -> int:
        return self._reserved.plan.tpu_resource_per_chip

    def release_head_pgs(self, slice_index: int | None = None) -> None:
        """Only checks ``slice_index``: tpuslice holds no head groups (see
        :attr:`head_placement_groups`); freeing a head would show it free while its hosts
        are held.

        Args:
            slice_index: That slice's head only (``None``: every slice's).

        Raises:
            InvalidArgumentError: ``slice_index`` is out of range.
        """
        if slice_index is not None and not 0 <= slice_index < self.num_slices:
            raise InvalidArgumentError(
                f"Invalid slice_index: {slice_index}; valid: 0..{self.num_slices - 1}."
            )

    def __repr__(self) -> str:
        state = "shut down" if self.is_shut_down else ", ".join(self.slice_names)
        pod_type = self._reserved.plan.shape.pod_type
        return f"SlicePlacementGroup({pod_type} x{self.num_slices}: {state})"


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
        **kwargs: The other arguments of :class:`SlicePlacementGroup`.

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
    """Claim one idle slice's head (Ray 2.60 ``reserve_tpu_slice``); unlike Ray, only a
    slice whose every host is idle, with no helper task.

    Args:
        topology: Chip grid of the slice, such as ``"4x4"``.
        accelerator_type: TPU generation, such as ``"v6e"``.
        timeout_s: Seconds to wait for an idle slice; ``None`` waits without limit.
        slice_name: Claim this slice only.

    Returns:
        ``(slice name, head placement group)``; ``None`` if an argument is empty (as in Ray).

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


def reserve_slices(request: SliceRequest) -> SliceHandle:
    """:func:`reserve`, as a handle: the path every tpuslice runner takes."""
    return SliceHandle(reserve(request))
