"""Keep a waiting reservation visible to Ray's autoscaler, and adopt what it brings.

On a cluster that can grow, a reservation that finds too few idle slices keeps one head
claim per missing slice pending (``TPU-<podtype>-head`` on a worker 0 of that pod type and
topology) that no slice the cluster already has can satisfy: its selector excludes their
names (``!in(...)``), so a partly busy slice with a free worker 0 does not absorb it. The
autoscaler sees the demand and adds a slice; when a demand group is placed, it sits on the
new slice's worker 0, which we look up in the cluster view (no helper task) and adopt as a
claim if every host of it is idle.
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
        """Have exactly ``missing`` demand groups pending, none satisfiable by the
        ``existing`` slices (new groups exclude them by name).

        Args:
            missing: Slices the reservation still lacks.
            existing: Names of the slices of this shape the cluster has now.
        """
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
        """Demand groups that were placed, with the slice whose worker 0 holds each. A
        group whose node the snapshot does not show yet stays pending for the next look.

        Args:
            snapshot: The cluster now.

        Returns:
            ``(group, slice)`` for each landed group; they are no longer tracked here.
        """
        heads = {s.head_node_id: s for s in snapshot.slices.values() if s.head_node_id}
        found = []
        for pg in self.groups:
            # Where the group is, read from Ray's table: a wait of no time would not do,
            # since Ray answers it before the GCS has said whether the group is placed.
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
