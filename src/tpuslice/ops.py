"""The cluster operations a reservation needs, behind one small protocol.

The claiming loop (:mod:`tpuslice.claim`) and the autoscaler demand (:mod:`tpuslice.demand`)
reach the cluster only through :class:`ClusterOps`: look at the slices, create, wait for and
remove placement groups, ask where a bundle landed, ask whether the cluster can grow.
:data:`RAY_OPS` is the real thing; :class:`tpuslice.testing.InMemoryCluster` is a faithful
in-memory stand-in, so every step of the loop is tested without a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from ray.util import placement_group_table
from ray.util.placement_group import PlacementGroup, placement_group

from tpuslice import _ray
from tpuslice.cluster import ClusterSnapshot, read_snapshot
from tpuslice.groups import remove_group, wait_all


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
        """Ask for a placement group; it is placed (or not) in the background."""
        ...

    def wait_placed(self, groups: Sequence[PlacementGroup], timeout: float) -> list[bool]:
        """Wait up to ``timeout`` seconds for every group; which ones are placed."""
        ...

    def remove_group(self, group: PlacementGroup | None) -> None:
        """Remove a group, freeing its bundles; a group already gone is fine."""
        ...

    def bundle_node(self, group: PlacementGroup, index: int) -> str | None:
        """The node id bundle ``index`` of a placed group is on; ``None`` if not placed."""
        ...

    def can_grow(self) -> bool:
        """Whether an autoscaler can add slices to this cluster."""
        ...


class RayOps:
    """:class:`ClusterOps` on the connected Ray cluster."""

    def snapshot(self, tpu_resource_per_chip: int) -> ClusterSnapshot:
        return read_snapshot(tpu_resource_per_chip)

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

    def wait_placed(self, groups: Sequence[PlacementGroup], timeout: float) -> list[bool]:
        return wait_all(groups, timeout)

    def remove_group(self, group: PlacementGroup | None) -> None:
        remove_group(group)

    def bundle_node(self, group: PlacementGroup, index: int) -> str | None:
        node: str | None = placement_group_table(group).get("bundles_to_node_id", {}).get(index)
        return node

    def can_grow(self) -> bool:
        return _ray.cluster_can_grow()


RAY_OPS: ClusterOps = RayOps()
