"""Pure planning for a slice reservation: pick slices, build bundles, explain shortfalls.
Nothing here talks to Ray."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any

from tpuslice._reserve.queue.schedule import last_resort
from tpuslice._tpu.labels import SLICE_NAME_LABEL, WORKER_ID_LABEL, selector_matches
from tpuslice._tpu.topology import SliceShape
from tpuslice._view.cluster import ClusterSnapshot, SliceInfo, SliceState

NODE_ID_LABEL = "ray.io/node-id"


def thaw(value: Any) -> Any:
    """A field's value with its read-only mappings (also in a tuple) made dicts, to pickle."""
    if isinstance(value, MappingProxyType):
        return dict(value)
    if isinstance(value, tuple):
        return tuple(thaw(item) for item in value)
    return value


def _freeze(value: Any) -> Any:
    """The inverse of :func:`thaw`."""
    if isinstance(value, dict):
        return MappingProxyType(value)
    if isinstance(value, tuple):
        return tuple(_freeze(item) for item in value)
    return value


def _plan_of(*values: Any) -> ReservationPlan:
    return ReservationPlan(*(_freeze(v) for v in values))


@dataclass(frozen=True)
class ReservationPlan:
    """Everything about a reservation that does not depend on the cluster.
    ``user_selectors``: the user's label selector per bundle (may be empty)."""

    shape: SliceShape
    num_slices: int
    tpu_resource_per_chip: int
    bundle_resources: Mapping[str, float]
    bundles_per_host: int
    user_selectors: tuple[Mapping[str, str], ...]
    strategy: str
    name: str
    lifetime: str | None
    pg_per_slice: bool
    subslice: bool = False
    """The shape is part of a bigger slice (no head claim: worker 0 may be another's)."""

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickle the read-only mappings as dicts: a ``mappingproxy`` does not pickle."""
        return (_plan_of, tuple(thaw(getattr(self, f.name)) for f in fields(self)))

    @property
    def devices_per_host(self) -> int:
        """``TPU`` resource of one host: chips per host x units per chip."""
        return self.shape.chips_per_host * self.tpu_resource_per_chip

    @property
    def bundles_per_slice(self) -> int:
        return self.shape.num_hosts * self.bundles_per_host

    @property
    def num_bundles(self) -> int:
        return self.bundles_per_slice * self.num_slices

    @property
    def needs_head_claim(self) -> bool:
        """Multi-host slices are claimed through worker 0's head resource, as in Ray;
        sub-slices are not."""
        return not self.shape.is_single_host and not self.subslice

    def _user_selector(self, bundle_index: int) -> Mapping[str, str]:
        """The user's label selector for one bundle of the reservation (may be empty)."""
        if bundle_index < len(self.user_selectors):
            return self.user_selectors[bundle_index] or {}
        return {}

    def pinned_slice_name(self, slice_index: int) -> str | None:
        """The slice name the user's label selectors fix for this slice index (the first
        among its bundles' selectors), or ``None``."""
        first = slice_index * self.bundles_per_slice
        for bundle in range(first, first + self.bundles_per_slice):
            name = self._user_selector(bundle).get(SLICE_NAME_LABEL)
            if name:
                return name
        return None

    def worker_selectors(self, slice_index: int, target: SliceInfo) -> list[dict[str, str]]:
        """Label selectors for one slice's bundles, in bundle order, on the slice chosen
        for it: bundle ``k`` lands on worker ``k // bundles_per_host``. Our pins win over
        the user's labels, as in Ray."""
        first = slice_index * self.bundles_per_slice
        selectors = []
        for k in range(self.bundles_per_slice):
            worker = k // self.bundles_per_host
            pin = _pin(target, worker)
            selectors.append({**self._user_selector(first + k), **pin})
        return selectors

    def describe(self) -> str:
        """What the plan asks for, for messages: ``2 idle v6e 4x4 slices (v6e-16, 4
        host(s) each)``."""
        count = f"{self.num_slices} " if self.num_slices > 1 else ""
        plural = "s" if self.num_slices > 1 else ""
        what = f"{self.shape.generation.name} {self.shape.topology}"
        if self.subslice:
            return f"idle {what} sub-slice ({self.shape.num_hosts} host(s) of a bigger slice)"
        return (
            f"{count}idle {what} slice{plural} "
            f"({self.shape.pod_type}, {self.shape.num_hosts} host(s) each)"
        )


def _pin(target: SliceInfo, worker: int) -> dict[str, str]:
    """Labels that select the target's ``worker``-th host, by its own slice name and
    worker id (a sub-slice's host: its place in the parent)."""
    host = target.hosts[worker]
    if target.name == host.node_id:  # a single-host VM without a slice-name label
        return {NODE_ID_LABEL: host.node_id}
    worker_id = worker if host.worker_id is None else host.worker_id
    return {SLICE_NAME_LABEL: host.slice_name or target.name, WORKER_ID_LABEL: str(worker_id)}


def accepted_slices(
    plan: ReservationPlan, labels: Mapping[str, Mapping[int, Mapping[str, str]]]
) -> frozenset[str]:
    """The slices on which some slice index's bundles would each match its host's labels
    (``labels``: every TPU host's, by slice name and worker id)."""

    def fits(hosts: Mapping[int, Mapping[str, str]], index: int) -> bool:
        first = index * plan.bundles_per_slice
        return all(
            selector_matches(
                hosts.get(k // plan.bundles_per_host, {}), plan._user_selector(first + k)
            )
            for k in range(plan.bundles_per_slice)
        )

    return frozenset(
        name
        for name, hosts in labels.items()
        if any(fits(hosts, index) for index in range(plan.num_slices))
    )


def pick_slices(
    snapshot: ClusterSnapshot,
    plan: ReservationPlan,
    taken: Mapping[int, str],
    *,
    least: int | None = None,
    time_left_s: float | None = None,
) -> dict[int, SliceInfo]:
    """Choose an idle whole slice for every slice index not in ``taken`` (index to the
    slice held): a ready one, or, as a last resort, one with a suspect host. A slice
    pinned by name is taken even if suspect: no other could serve its index. ``least``:
    the fewest that serve (a range's minimum; default: the plan's count)."""
    per_chip = plan.tpu_resource_per_chip
    ready = {s.name: s for s in snapshot.ready(plan.shape, per_chip)}
    suspects = {s.name: s for s in snapshot.idle_suspects(plan.shape, per_chip)}
    trusted = len(snapshot.trusted(plan.shape, per_chip))
    least = plan.num_slices if least is None else least
    used = set(taken.values())
    chosen: dict[int, SliceInfo] = {}
    open_indices = [i for i in range(plan.num_slices) if i not in taken]
    for index in open_indices:  # pinned first, so free picks do not steal them
        pinned = plan.pinned_slice_name(index)
        found = ready.get(pinned or "") or suspects.get(pinned or "")
        if pinned and found is not None and pinned not in used:
            chosen[index] = found
            used.add(pinned)
    free = [s for name, s in ready.items() if name not in used]
    if suspects and last_resort(trusted, least, time_left_s):
        free += [s for name, s in suspects.items() if name not in used]
    for index in open_indices:
        if index not in chosen and not plan.pinned_slice_name(index) and free:
            chosen[index] = free.pop(0)
    return chosen


def shortage(snapshot: ClusterSnapshot, plan: ReservationPlan) -> str | None:
    """Why this cluster as it is can never meet the request; ``None`` if the slices
    exist (perhaps busy)."""
    whole = snapshot.whole(plan.shape, plan.tpu_resource_per_chip)
    names = {s.name for s in whole}
    missing = [
        pin
        for i in range(plan.num_slices)
        if (pin := plan.pinned_slice_name(i)) and pin not in names
    ]
    if missing:
        return f"slice(s) {', '.join(missing)} named in bundle_label_selector do not exist"
    if len(whole) < plan.num_slices:
        return f"asked for {plan.num_slices}, the cluster has {len(whole)} whole"
    return None


def explain(snapshot: ClusterSnapshot, plan: ReservationPlan) -> str:
    """What the cluster has for this request, or the shapes it has when none match."""
    matching = snapshot.matching(plan.shape, plan.tpu_resource_per_chip)
    if not matching:
        shapes = sorted({f"{s.pod_type} {s.topology}" for s in snapshot.slices.values()})
        have = ", ".join(shapes) if shapes else "no TPU slices at all"
        return (
            f"the cluster has no {plan.shape.pod_type} {plan.shape.topology} slice (it has: {have})"
        )
    ready, busy, suspect, broken = (
        [s for s in matching if s.state is state]
        for state in (SliceState.READY, SliceState.BUSY, SliceState.SUSPECT, SliceState.BROKEN)
    )
    whole = f"{len(ready) + len(busy) + len(suspect)} whole slice(s)"
    if busy:
        whole += f", {len(busy)} busy ({_described(busy)})"
    if suspect:
        whole += f", {len(suspect)} with a suspect host, taken only as a last resort "
        whole += f"({_described(suspect)})"
    if ready:
        whole += f", {len(ready)} idle"
    return f"{whole}; {len(broken)} broken ({_described(broken)})" if broken else whole


def _described(slices: list[SliceInfo]) -> str:
    return "; ".join(s.describe() for s in slices)
