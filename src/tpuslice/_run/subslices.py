"""Sub-slices: some hosts of a bigger slice, reserved as a slice of their own (Ray 2.60's
``subslice_placement_group``, drop-in), through the whole-slice claiming loop with
:class:`SubSlices` as targets: only wholly idle sub-slices are picked, and a slice's layout
is learned only while the whole slice is idle."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping

import ray
from ray.util.placement_group import PlacementGroup

from tpuslice._reserve.ops import RAY_OPS, ClusterOps
from tpuslice._reserve.queue.schedule import last_resort
from tpuslice._reserve.request import SliceRequest
from tpuslice._reserve.reserve import (
    Reserved,
    SliceHandle,
    SubsliceAt,
    hand_back,
    reserve,
    reserve_slices,
)
from tpuslice._run import layout_records
from tpuslice._run.health import whole_slice_request
from tpuslice._run.run import launch
from tpuslice._tpu import subslice
from tpuslice._tpu.compat import DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S
from tpuslice._tpu.labels import SLICE_NAME_LABEL
from tpuslice._view import layouts
from tpuslice._view.cluster import ClusterSnapshot, HostInfo, HostState, SliceInfo, SliceState
from tpuslice.errors import (
    DiscoveryFailedError,
    InsufficientSlicesError,
    InvalidArgumentError,
    NoSubsliceParentError,
    ReservationTimeoutError,
    SubsliceUnavailableError,
)

logger = logging.getLogger(__name__)

TPU_SUBSLICE_LABEL_PREFIX = subslice.SUBSLICE_LABEL_PREFIX
DISCOVERY_TIMEOUT_S = 30.0
"""Longest wait to reserve an idle slice for discovery (it was idle a moment ago)."""
RELEARN_S = 10.0
"""After a failed attempt to learn a slice's layout, wait this long before trying again."""


class SubSlices:
    """The targets of a sub-slice reservation. A sub-slice with a suspect host is taken
    only as a last resort; ``discover``, ``load`` and ``now`` are seams for tests."""

    def __init__(
        self,
        request: SliceRequest,
        ops: ClusterOps = RAY_OPS,
        discover: Callable[[SliceInfo, SliceRequest], layouts.Layout] | None = None,
        load: Callable[[SliceInfo], layouts.Layout | None] | None = None,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.request = request
        self.plan = request.plan
        self.ops = ops
        self._discover = discover or _discover_layout
        self._load = load or layout_records.load
        self.layouts: dict[str, layouts.Layout] = {}
        # (slice, worker ids) of each picked sub-slice -> its parent topology, index.
        self.chosen: dict[tuple[str, tuple[int, ...]], tuple[str, int]] = {}
        self.now = now
        timeout = request.head_reservation_timeout_s
        self.deadline = None if timeout is None else now() + timeout
        self.failed: dict[str, float] = {}  # slices whose layout could not be learned: when

    @property
    def head_claims(self) -> bool:
        return False

    @property
    def autoscaling(self) -> bool:
        return False

    def _parents(self, snapshot: ClusterSnapshot) -> list[SliceInfo]:
        """Slices that can hold the sub-slice, smallest topology first, then by name."""
        shape = self.plan.shape
        per_host = shape.chips_per_host * self.plan.tpu_resource_per_chip
        candidates = [
            s
            for s in snapshot.slices.values()
            if s.shape is not None
            and s.shape.generation == shape.generation
            and s.shape.chips_per_host == shape.chips_per_host
            and all(h.tpu_total == per_host for h in s.hosts.values() if h.alive)
        ]
        order = subslice.valid_parents(shape.topology, [s.topology for s in candidates])
        rank = {t: i for i, t in enumerate(order)}
        return sorted(
            (s for s in candidates if s.topology in rank), key=lambda s: (rank[s.topology], s.name)
        )

    def prepare(self, snapshot: ClusterSnapshot) -> ClusterSnapshot:
        """Load the parents' layouts; if no known sub-slice is idle, learn an idle parent's.
        Returns the snapshot to pick from (a new one after a discovery)."""
        parents = self._parents(snapshot)
        for info in parents:
            known = self.layouts.get(info.name)
            if known is None or not known.current_for(info):
                found = self._load(info)
                if found is not None:
                    self.layouts[info.name] = found
                else:
                    self.layouts.pop(info.name, None)
        if self.pick(snapshot, {}):
            return snapshot
        # A wholly idle parent with a suspect host is learned too, after the trusted ones.
        for info in sorted(parents, key=lambda p: p.state is SliceState.SUSPECT):
            failed_at = self.failed.get(info.name)
            retry = failed_at is None or self.now() - failed_at >= RELEARN_S
            unknown = info.name not in self.layouts and retry
            if unknown and info.idle and info.state in (SliceState.READY, SliceState.SUSPECT):
                self._learn(info)
                return self.ops.snapshot(self.plan.tpu_resource_per_chip)
        return snapshot

    def _learn(self, info: SliceInfo) -> None:
        # Bounded by what is left of the caller's timeout too.
        budget = DISCOVERY_TIMEOUT_S
        if self.deadline is not None:
            budget = max(1.0, min(budget, self.deadline - self.now()))
        request = dataclasses.replace(self.request, head_reservation_timeout_s=budget)
        try:
            self.layouts[info.name] = self._discover(info, request)
        except DiscoveryFailedError as exc:
            logger.warning("could not learn the layout of %s: %s", info.name, exc)
            self.failed[info.name] = self.now()

    def pick(self, snapshot: ClusterSnapshot, taken: Mapping[int, str]) -> dict[int, SliceInfo]:
        """``{0: sub-slice}`` for the first idle one with no suspect host, else (last
        resort) one with; ``{}`` if none, or once taken (one per reservation)."""
        if taken:
            return {}
        trusted = 0
        fallback: tuple[SliceInfo, int, list[int], list[HostInfo], float] | None = None
        for info in self._parents(snapshot):
            layout = self.layouts.get(info.name)
            if layout is None or not layout.current_for(info):
                continue
            for index, members in self._members(info, layout).items():
                # Ranks follow the physical layout (libtpu's host order), not worker ids.
                workers = sorted(members, key=lambda w: layout.physical[w])
                hosts = [h for w in workers if (h := info.hosts.get(w)) is not None]
                suspect = any(h.suspect is not None for h in hosts)
                trusted += not suspect
                if len(hosts) < len(workers) or any(h.state is not HostState.FREE for h in hosts):
                    continue
                if not suspect:
                    return self._chose(info, index, workers, hosts, snapshot.taken_at)
                fallback = fallback or (info, index, workers, hosts, snapshot.taken_at)
        left = None if self.deadline is None else self.deadline - self.now()
        if fallback is not None and last_resort(trusted, 1, left):
            return self._chose(*fallback)
        return {}

    def _chose(
        self, info: SliceInfo, index: int, workers: list[int], hosts: list[HostInfo], now: float
    ) -> dict[int, SliceInfo]:
        self.chosen[(info.name, tuple(workers))] = (info.topology, index)
        return {0: self._view(info, hosts, now)}

    def _members(
        self, info: SliceInfo, layout: layouts.Layout, every: bool = False
    ) -> dict[int, list[int]]:
        """Each sub-slice's worker ids, by index: only the one asked for, unless ``every``."""
        found = subslice.members(layout.physical, info.topology, self.plan.shape.topology)
        wanted = None if every else self.request.subslice_index
        return found if wanted is None else {i: w for i, w in found.items() if i == wanted}

    def _view(self, parent: SliceInfo, hosts: list[HostInfo], now: float) -> SliceInfo:
        """The sub-slice as a slice of its own: the parent's name, its hosts by rank."""
        shape = self.plan.shape
        suspects = [h.suspect for h in hosts if h.suspect is not None]
        return SliceInfo(
            name=parent.name,
            pod_type=shape.pod_type,
            topology=shape.topology,
            shape=shape,
            hosts=dict(enumerate(hosts)),
            state=SliceState.SUSPECT if suspects else SliceState.READY,
            reason="; ".join(s.describe(now) for s in suspects),
            expected_hosts=len(hosts),
        )

    def placement(self, target: SliceInfo) -> tuple[str, int]:
        """Where a sub-slice :meth:`pick` returned sits: ``(parent topology, index)``."""
        workers = tuple(h.worker_id for h in target.hosts.values() if h.worker_id is not None)
        return self.chosen[(target.name, workers)]

    def shortage(self, snapshot: ClusterSnapshot) -> str | None:
        """Why no slice of the cluster can ever hold this sub-slice or its index (None:
        some slice can)."""
        parents = self._parents(snapshot)
        if not parents:
            have = sorted({f"{s.pod_type} {s.topology}" for s in snapshot.slices.values()})
            return (
                f"no slice can hold a {self.plan.shape.generation.name} "
                f"{self.plan.shape.topology} sub-slice (the cluster has: "
                f"{', '.join(have) or 'no TPU slices'}); use slice_placement_group for a "
                "slice of exactly that shape"
            )
        wanted = self.request.subslice_index
        learned = self.layouts
        known = [len(self._members(p, learned[p.name], True)) for p in parents if p.name in learned]
        if wanted is not None and known and wanted >= max(known):
            return (
                f"subslice_index {wanted} is out of range: the slices here have "
                f"{max(known)} {self.plan.shape.topology} sub-slices (valid: 0..{max(known) - 1})"
            )
        return None

    def explain(self, snapshot: ClusterSnapshot) -> str:
        """One line for a timeout's message: each parent and how many of its sub-slices
        are busy, naming a busy host of each."""
        parts = []
        for info in self._parents(snapshot):
            layout = self.layouts.get(info.name)
            if layout is None and info.name in self.failed:
                parts.append(f"{info.name}: its layout could not be learned (see the log)")
                continue
            if layout is None:
                parts.append(f"{info.name}: layout not known yet ({info.reason or 'idle'})")
                continue
            found = self._members(info, layout)
            busy: dict[int, str] = {}
            for i, workers in found.items():
                for w in workers:
                    h = info.hosts.get(w)
                    if h is None or h.state is not HostState.FREE:
                        why = "missing" if h is None else _why(h)
                        busy[i] = f"#{i}: worker {w} {why}"
                        break
            detail = f" ({', '.join(busy.values())})" if busy else ""
            parts.append(f"{info.name}: {len(busy)} of {len(found)} busy{detail}")
        topology = self.plan.shape.topology
        return f"sub-slices of {topology}: " + ("; ".join(parts) or "no slice can hold one")


def _why(host: HostInfo) -> str:
    if host.state is HostState.DEAD:
        return "dead"
    return f"TPU held by {host.tpu_owner}" if host.tpu_owner else "in use"


def _discover_layout(info: SliceInfo, request: SliceRequest) -> layouts.Layout:
    """Learn a slice's layout: reserve it whole, ask every host's libtpu for its chips'
    coordinates, give it back, and record the result for every program to read."""
    shape = info.shape
    assert shape is not None
    bound = min(DISCOVERY_TIMEOUT_S, request.head_reservation_timeout_s or DISCOVERY_TIMEOUT_S)
    whole = whole_slice_request(info, bound, request.tpu_resource_per_chip)
    started = time.monotonic()
    try:
        with reserve_slices(whole) as spg:
            refs = launch(layouts.coordinates_task, spg, (), {})
            answers = ray.get(refs, timeout=max(1.0, bound - (time.monotonic() - started)))
            nodes = {w: h.node_id for w, h in spg.slices[0].hosts.items()}
    except (TimeoutError, ray.exceptions.RayError) as exc:
        raise DiscoveryFailedError(f"learning the layout of {info.name} failed: {exc}") from exc
    try:
        physical = layouts.positions_from_coordinates(dict(enumerate(answers)), shape.topology)
    except ValueError as exc:
        raise DiscoveryFailedError(str(exc)) from exc
    layout = layouts.Layout(info.name, shape.topology, physical, nodes)
    layout_records.save(layout)
    took = time.monotonic() - started
    logger.info("learned the layout of %s (%s) in %.1f s", info.name, shape.topology, took)
    return layout


class SubslicePlacementGroup(SliceHandle):
    """Some hosts of a bigger slice, reserved as a slice of their own (Ray 2.60's
    ``SubslicePlacementGroup``): ranks follow the physical order, and each call on it sees
    the sub-slice's own ``TPU_*`` values."""

    def __init__(self, held: Reserved) -> None:
        if held.subslice is None:
            raise InvalidArgumentError("a SubslicePlacementGroup is a sub-slice's reservation")
        super().__init__(held)
        self._at = held.subslice

    @property
    def placement_group(self) -> PlacementGroup | None:
        """The placement group, one bundle per host in rank order; None once shut down."""
        return None if self.is_shut_down else self._reserved.combined_pg

    @property
    def parent_topology(self) -> str:
        """The topology of the slice it is part of."""
        return self._at.parent_topology

    @property
    def subslice_topology(self) -> str:
        """Its own topology."""
        return self._reserved.plan.shape.topology

    @property
    def subslice_index(self) -> int:
        """Its index within the parent slice (Ray's label value)."""
        return self._at.index

    @property
    def slice_name(self) -> str:
        """The parent slice's name (kept after :meth:`shutdown`, as Ray's is)."""
        return dict(self._at.selectors[0])[SLICE_NAME_LABEL]

    @property
    def chips_per_host(self) -> int:
        """TPU chips on each host."""
        return self._reserved.plan.shape.chips_per_host

    @property
    def bundle_resources(self) -> dict[str, float]:
        """Resources of each bundle."""
        return dict(self._reserved.plan.bundle_resources)

    @property
    def head_placement_groups(self) -> list[PlacementGroup]:
        """Head claims held as groups of their own: none (a sub-slice claims no head)."""
        return []

    @property
    def bundle_label_selector(self) -> list[dict[str, str]]:
        """One selector per bundle, in rank order; kept after :meth:`shutdown`, as Ray's."""
        return [dict(s) for s in self._at.selectors]

    def release_head_pgs(self) -> None:
        """Ray's developer API; a sub-slice holds no head claim, so nothing to remove."""

    def __repr__(self) -> str:
        state = "shut down" if self.is_shut_down else f"{self.slice_name} #{self.subslice_index}"
        return (
            f"SubslicePlacementGroup({self.subslice_topology} of {self.parent_topology}: {state})"
        )


def subslice_placement_group(
    subslice_topology: str,
    accelerator_version: str,
    chips_per_vm: int | None = None,
    resources_per_bundle: dict[str, float] | None = None,
    strategy: str = "STRICT_SPREAD",
    name: str = "",
    lifetime: str | None = None,
    head_reservation_timeout_s: float | None = DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S,
    subslice_index: int | None = None,
) -> SubslicePlacementGroup:
    """Reserve an idle sub-slice in any bigger slice (Ray 2.60's function, same parameters).
    Unlike Ray's, it returns once placed, picks only wholly idle sub-slices, and a timeout
    says which are busy.

    Args:
        subslice_topology: The sub-slice's chip grid, such as ``"2x4"``.
        accelerator_version: TPU generation, such as ``"v6e"``.
        chips_per_vm: Chips per host (sub-slices are cut from 4-chip hosts; leave out).
        resources_per_bundle: Resources of each bundle (default: one whole host).
        strategy: Placement strategy (Ray's default for sub-slices, ``STRICT_SPREAD``).
        name: Name of the placement group.
        lifetime: ``None`` or ``"detached"``.
        head_reservation_timeout_s: Seconds to wait (``None``: no limit).
        subslice_index: Only that sub-slice of a parent.

    Returns:
        The reservation.

    Raises:
        InvalidArgumentError: an invalid topology, index or option.
        NotConnectedError: Ray is not initialised.
        NoSubsliceParentError: no slice can hold such a sub-slice (a ``ValueError``, as Ray's).
        SubsliceUnavailableError: none was idle in time (a ``RuntimeError``, as Ray's).
    """
    request = SliceRequest(
        topology=subslice_topology,
        accelerator_version=accelerator_version,
        chips_per_vm=chips_per_vm,
        resources_per_bundle=resources_per_bundle,
        strategy=strategy,
        name=name,
        lifetime=lifetime,
        head_reservation_timeout_s=head_reservation_timeout_s,
        subslice=True,
        subslice_index=subslice_index,
    )
    targets = SubSlices(request)
    try:
        held = reserve(request, targets=targets)
    except InsufficientSlicesError as exc:
        raise NoSubsliceParentError(str(exc)) from None
    except ReservationTimeoutError as exc:
        raise SubsliceUnavailableError(str(exc)) from None
    try:
        piece = held.slices[0]
        parent_topology, index = targets.placement(piece.info)
        selectors = held.plan.worker_selectors(piece.index, piece.info)
        at = SubsliceAt(parent_topology, index, tuple(tuple(s.items()) for s in selectors))
        return SubslicePlacementGroup(dataclasses.replace(held, subslice=at))
    except BaseException:
        hand_back(held)
        raise
