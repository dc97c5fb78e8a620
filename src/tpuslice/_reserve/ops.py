"""The cluster operations a reservation needs, behind one small protocol.

The claiming loop and the autoscaler demand reach the cluster only through
:class:`ClusterOps`: :data:`RAY_OPS` is the real thing, :class:`tpuslice.testing.InMemoryCluster`
a faithful in-memory stand-in, so every step of the loop is tested without a cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import ray
from ray.util import placement_group_table
from ray.util.placement_group import PlacementGroup, placement_group

from tpuslice._reserve import groups as pgs
from tpuslice._reserve.queue.agents import start_probe
from tpuslice._reserve.queue.service import SliceQueue
from tpuslice._tpu import _ray
from tpuslice._tpu.labels import SLICE_NAME_LABEL, WORKER_ID_LABEL
from tpuslice._view import agents
from tpuslice._view.cluster import ClusterSnapshot, read_snapshot


class ClusterOps(Protocol):
    """What a reservation asks of the cluster."""

    def snapshot(self, tpu_resource_per_chip: int) -> ClusterSnapshot:
        """Every TPU slice and its state now."""
        ...

    def create_group(
        self,
        bundles: Sequence[Mapping[str, float]],
        selectors: Sequence[Mapping[str, str]],
        *,
        strategy: str = "PACK",
        name: str = "",
        lifetime: str | None = None,
    ) -> PlacementGroup:
        """Ask for a placement group, one label selector per bundle (each may be empty);
        it is placed (or not) in the background."""
        ...

    def wait_placed(self, groups: Sequence[PlacementGroup], timeout: float) -> list[bool]:
        """Wait up to ``timeout`` seconds for every group; whether each placed, in order."""
        ...

    def remove_group(self, group: PlacementGroup | None) -> None:
        """Remove a group, freeing its bundles; one already gone, or ``None``, is fine."""
        ...

    def bundle_node(self, group: PlacementGroup, index: int) -> str | None:
        """The node id (hex) bundle ``index`` of a group is on; ``None`` if not placed."""
        ...

    def can_grow(self) -> bool:
        """Whether an autoscaler can add slices to this cluster."""
        ...

    def free_hosts(self) -> frozenset[str]:
        """Node ids of the hosts whose agents say their TPU is free: one listing, cheaper
        than asking each host."""
        ...

    def start_owner_probe(self, node_ids: Sequence[str]) -> Callable[[], dict[str, str | None]]:
        """Start asking each host who owns its TPU; the call returned waits for the
        answers: per node, the owner, or ``None`` (free, or no answer)."""
        ...

    def slice_queue(self) -> SliceQueue:
        """The cluster-wide queue of waiting reservations; raises
        :class:`~tpuslice.errors.QueueUnreachableError` if none can be reached."""
        ...

    def slice_labels(self) -> dict[str, dict[int, Mapping[str, str]]]:
        """Every live TPU host's node labels, ``{slice name: {worker id: labels}}``, to
        match a request's label selectors."""
        ...


class RayOps:
    """:class:`ClusterOps` on the connected Ray cluster. An operation that is just a
    function of another module is that function."""

    remove_group = staticmethod(pgs.remove_group)
    can_grow = staticmethod(_ray.cluster_can_grow)
    free_hosts = staticmethod(agents.free_hosts)
    start_owner_probe = staticmethod(start_probe)
    wait_placed = staticmethod(pgs.wait_all)
    snapshot = staticmethod(read_snapshot)

    def create_group(
        self,
        bundles: Sequence[Mapping[str, float]],
        selectors: Sequence[Mapping[str, str]],
        *,
        strategy: str = "PACK",
        name: str = "",
        lifetime: str | None = None,
    ) -> PlacementGroup:
        return placement_group(
            bundles=[dict(b) for b in bundles],
            strategy=strategy,
            name=name,
            lifetime=lifetime,
            bundle_label_selector=[dict(s) for s in selectors],
        )

    def bundle_node(self, group: PlacementGroup, index: int) -> str | None:
        node: str | None = placement_group_table(group).get("bundles_to_node_id", {}).get(index)
        return node or None  # an unplaced bundle's node id is the empty string

    def slice_queue(self) -> SliceQueue:
        """The queue actor, created if needed."""
        from tpuslice._reserve.queue.actor import slice_queue

        return slice_queue()

    def slice_labels(self) -> dict[str, dict[int, Mapping[str, str]]]:
        """Read from Ray's node table, in one call."""
        found: dict[str, dict[int, Mapping[str, str]]] = {}
        for node in ray.nodes():
            labels: Mapping[str, str] = node.get("Labels") or {}
            worker = labels.get(WORKER_ID_LABEL, "")
            if node.get("Alive") and labels.get(SLICE_NAME_LABEL) and worker.isdigit():
                found.setdefault(labels[SLICE_NAME_LABEL], {})[int(worker)] = labels
        return found


RAY_OPS: ClusterOps = RayOps()
