"""Keep a waiting reservation visible to Ray's autoscaler: one pending head claim per
missing slice, whose selector excludes the slices the cluster has (``!in(...)``), so that
a partly busy slice with a free worker 0 does not absorb it.
"""

from __future__ import annotations

from collections.abc import Collection

from ray.util.placement_group import PlacementGroup

from tpuslice._reserve.ops import ClusterOps
from tpuslice._reserve.plan import ReservationPlan
from tpuslice._tpu.labels import POD_TYPE_LABEL, SLICE_NAME_LABEL, TOPOLOGY_LABEL, WORKER_ID_LABEL
from tpuslice._view.cluster import ClusterSnapshot, SliceInfo


class AutoscalerDemand:
    """The pending, unpinned head claims of one waiting reservation."""

    def __init__(self, plan: ReservationPlan, ops: ClusterOps) -> None:
        self.plan = plan
        self.ops = ops
        self.groups: list[PlacementGroup] = []

    def keep(self, missing: int, existing: Collection[str] = ()) -> None:
        """Have exactly ``missing`` demand groups pending, none on the ``existing`` slices
        (those of this shape the cluster has now)."""
        shape = self.plan.shape
        selector = {
            WORKER_ID_LABEL: "0",
            POD_TYPE_LABEL: shape.pod_type,
            TOPOLOGY_LABEL: shape.topology,
        }
        if existing:
            selector[SLICE_NAME_LABEL] = f"!in({','.join(sorted(existing))})"
        while len(self.groups) < missing:
            self.groups.append(
                self.ops.create_group(
                    [{shape.head_resource: 1}], [selector], lifetime=self.plan.lifetime
                )
            )
        while len(self.groups) > missing:
            self.ops.remove_group(self.groups.pop())

    def landed(self, snapshot: ClusterSnapshot) -> list[tuple[PlacementGroup, SliceInfo]]:
        """Take the placed demand groups out, each with the slice whose worker 0 holds it
        (one on a node the snapshot does not show yet stays for the next look)."""
        heads = {s.head_node_id: s for s in snapshot.slices.values() if s.head_node_id}
        found = []
        for pg in self.groups:
            # Ray's table, not a wait of no time: Ray answers that before the GCS knows.
            node = self.ops.bundle_node(pg, 0)
            if node in heads:
                found.append((pg, heads[node]))
        taken = {id(pg) for pg, _ in found}
        self.groups = [pg for pg in self.groups if id(pg) not in taken]
        return found

    def release(self) -> None:
        """Remove every pending demand group."""
        for pg in self.groups:
            self.ops.remove_group(pg)
        self.groups = []
