"""Keep a waiting reservation visible to Ray's autoscaler, and adopt what it brings.

On a cluster that can grow, a reservation that finds too few idle slices keeps one
*unpinned* head claim per missing slice pending (``TPU-<podtype>-head`` on any worker 0
of that pod type and topology). The autoscaler sees the demand and adds a slice; when a
demand group is placed, it sits on some slice's worker 0, which we look up in the cluster
view (no helper task) and adopt as a claim if every host of it is idle.
"""

from __future__ import annotations

from ray.util import placement_group_table
from ray.util.placement_group import PlacementGroup, placement_group

from tpuslice.cluster import ClusterSnapshot, SliceInfo
from tpuslice.groups import remove_group, wait_all
from tpuslice.labels import POD_TYPE_LABEL, TOPOLOGY_LABEL, WORKER_ID_LABEL
from tpuslice.plan import ReservationPlan


class AutoscalerDemand:
    """The pending, unpinned head claims of one waiting reservation."""

    def __init__(self, plan: ReservationPlan) -> None:
        self.plan = plan
        self.groups: list[PlacementGroup] = []

    def keep(self, missing: int) -> None:
        """Have exactly ``missing`` demand groups pending."""
        while len(self.groups) < missing:
            shape = self.plan.shape
            selector = {
                WORKER_ID_LABEL: "0",
                POD_TYPE_LABEL: shape.pod_type,
                TOPOLOGY_LABEL: shape.topology,
            }
            self.groups.append(
                placement_group(
                    [{shape.head_resource: 1}],
                    bundle_label_selector=[selector],
                    lifetime=self.plan.lifetime,
                )
            )
        while len(self.groups) > missing:
            remove_group(self.groups.pop())

    def landed(self, snapshot: ClusterSnapshot) -> list[tuple[PlacementGroup, SliceInfo]]:
        """Demand groups that were placed, with the slice whose worker 0 holds each. A
        group whose node the snapshot does not show yet stays pending for the next look."""
        heads = {s.head_node_id: s for s in snapshot.slices.values() if s.head_node_id}
        found = []
        for pg, placed in zip(self.groups, wait_all(self.groups, 0.0), strict=True):
            node = (
                placement_group_table(pg).get("bundles_to_node_id", {}).get(0) if placed else None
            )
            if node in heads:
                found.append((pg, heads[node]))
        taken = {id(pg) for pg, _ in found}
        self.groups = [pg for pg in self.groups if id(pg) not in taken]
        return found

    def release(self) -> None:
        for pg in self.groups:
            remove_group(pg)
        self.groups = []
