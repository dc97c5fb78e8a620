"""The cluster operations a reservation needs, behind one small protocol.

The claiming loop (:mod:`tpuslice._reserve.claim`) and the autoscaler demand
(:mod:`tpuslice._reserve.demand`) reach the cluster only through :class:`ClusterOps`:
look at the slices, create, wait for and remove placement groups, ask where a bundle
landed, ask whether the cluster can grow.
:data:`RAY_OPS` is the real thing; :class:`tpuslice.testing.InMemoryCluster` is a faithful
in-memory stand-in, so every step of the loop is tested without a cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import ray
from ray.util import placement_group_table
from ray.util.placement_group import PlacementGroup, placement_group

from tpuslice._reserve.groups import remove_group, wait_all
from tpuslice._reserve.queue.agents import start_probe
from tpuslice._reserve.queue.service import SliceQueue
from tpuslice._tpu import _ray
from tpuslice._tpu.labels import SLICE_NAME_LABEL, WORKER_ID_LABEL
from tpuslice._view.agents import free_hosts
from tpuslice._view.cluster import ClusterSnapshot, read_snapshot


class ClusterOps(Protocol):
    """What a reservation asks of the cluster."""

    def snapshot(self, tpu_resource_per_chip: int) -> ClusterSnapshot:
        """Every TPU slice and its state now.

        Args:
            tpu_resource_per_chip: The cluster's ``TPU`` units per chip.

        Returns:
            The snapshot.
        """
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
        """Ask for a placement group; it is placed (or not) in the background.

        Args:
            bundles: Resources of each bundle.
            selectors: One label selector per bundle (may be empty: no selectors).
            strategy: Ray placement strategy.
            name: The group's name.
            lifetime: ``None`` or ``"detached"``.

        Returns:
            The group, placed or not yet.
        """
        ...

    def wait_placed(self, groups: Sequence[PlacementGroup], timeout: float) -> list[bool]:
        """Wait up to ``timeout`` seconds for every group; which ones are placed.

        Args:
            groups: The groups to wait for.
            timeout: Seconds to wait at most.

        Returns:
            Whether each group is placed, in order.
        """
        ...

    def remove_group(self, group: PlacementGroup | None) -> None:
        """Remove a group, freeing its bundles; a group already gone is fine.

        Args:
            group: The group; ``None`` does nothing.
        """
        ...

    def bundle_node(self, group: PlacementGroup, index: int) -> str | None:
        """The node id bundle ``index`` of a placed group is on; ``None`` if not placed.

        Args:
            group: A group.
            index: The bundle's index in the group.

        Returns:
            The node id (hex), or ``None``.
        """
        ...

    def can_grow(self) -> bool:
        """Whether an autoscaler can add slices to this cluster.

        Returns:
            True if the cluster can grow.
        """
        ...

    def free_hosts(self) -> frozenset[str]:
        """The hosts whose agents say now that their TPU is free (their ``tpu-free/``
        keys), in one listing: as good as a fresh cluster read's, and cheaper than asking
        the hosts.

        Returns:
            Their node ids.
        """
        ...

    def start_owner_probe(self, node_ids: Sequence[str]) -> Callable[[], dict[str, str | None]]:
        """Start asking each host who owns its TPU; the answer comes from the returned call.

        Args:
            node_ids: The hosts to ask.

        Returns:
            A function that waits for the answers: per node, the owner (described) or
            ``None`` when its TPU is free or the host could not answer.
        """
        ...

    def slice_queue(self) -> SliceQueue:
        """The cluster-wide queue of waiting reservations.

        Returns:
            A handle to it.

        Raises:
            QueueUnreachableError: there is none to be reached.
        """
        ...

    def slice_labels(self) -> dict[str, dict[int, Mapping[str, str]]]:
        """Every live TPU host's node labels, by slice name and worker id (for the slices
        a request's label selectors accept).

        Returns:
            ``{slice name: {worker id: labels}}``.
        """
        ...


class RayOps:
    """:class:`ClusterOps` on the connected Ray cluster."""

    def snapshot(self, tpu_resource_per_chip: int) -> ClusterSnapshot:
        """Read the cluster with :func:`~tpuslice._view.cluster.read_snapshot`.

        Args:
            tpu_resource_per_chip: The cluster's ``TPU`` units per chip.

        Returns:
            The snapshot.

        Raises:
            InvalidArgumentError: ``tpu_resource_per_chip`` is not a positive integer.
        """
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
        """Create a Ray placement group with one ``bundle_label_selector`` per bundle.

        Args:
            bundles: Resources of each bundle.
            selectors: One label selector per bundle (may be empty: no selectors).
            strategy: Ray placement strategy.
            name: The group's name.
            lifetime: ``None`` or ``"detached"``.

        Returns:
            The group, placed or not yet.
        """
        return placement_group(
            bundles=[dict(b) for b in bundles],
            strategy=strategy,
            name=name,
            lifetime=lifetime,
            bundle_label_selector=[dict(s) for s in selectors],
        )

    def wait_placed(self, groups: Sequence[PlacementGroup], timeout: float) -> list[bool]:
        """Wait with :func:`~tpuslice._reserve.groups.wait_all`.

        Args:
            groups: The groups to wait for.
            timeout: Seconds to wait at most.

        Returns:
            Whether each group is placed, in order.
        """
        return wait_all(groups, timeout)

    def remove_group(self, group: PlacementGroup | None) -> None:
        """Remove with :func:`~tpuslice._reserve.groups.remove_group` (idempotent).

        Args:
            group: The group; ``None`` does nothing.
        """
        remove_group(group)

    def bundle_node(self, group: PlacementGroup, index: int) -> str | None:
        """Where a bundle is, from Ray's placement group table.

        Args:
            group: A group.
            index: The bundle's index in the group.

        Returns:
            The node id (hex), or ``None`` if the bundle is not placed.
        """
        node: str | None = placement_group_table(group).get("bundles_to_node_id", {}).get(index)
        return node or None  # an unplaced bundle's node id is the empty string

    def can_grow(self) -> bool:
        """Whether the connected cluster has an autoscaler that can add slices.

        Returns:
            True if the cluster can grow.
        """
        return _ray.cluster_can_grow()

    def free_hosts(self) -> frozenset[str]:
        """List the hosts' ``tpu-free/`` keys (:func:`tpuslice._view.agents.free_hosts`).

        Returns:
            The node ids whose keys are there.
        """
        return free_hosts()

    def start_owner_probe(self, node_ids: Sequence[str]) -> Callable[[], dict[str, str | None]]:
        """Ask the hosts' TPU agents (:func:`tpuslice._reserve.queue.agents.start_probe`).

        Args:
            node_ids: The hosts to ask.

        Returns:
            A function that waits for the answers.
        """
        return start_probe(node_ids)

    def slice_queue(self) -> SliceQueue:
        """The queue actor, created if needed
        (:func:`tpuslice._reserve.queue.actor.slice_queue`).

        Returns:
            A handle to it.

        Raises:
            QueueUnreachableError: it could neither be found nor created.
        """
        from tpuslice._reserve.queue.actor import slice_queue

        return slice_queue()

    def slice_labels(self) -> dict[str, dict[int, Mapping[str, str]]]:
        """Read every live TPU host's labels from Ray's node table, in one call.

        Returns:
            ``{slice name: {worker id: labels}}``.
        """
        found: dict[str, dict[int, Mapping[str, str]]] = {}
        for node in ray.nodes():
            labels: Mapping[str, str] = node.get("Labels") or {}
            worker = labels.get(WORKER_ID_LABEL, "")
            if node.get("Alive") and labels.get(SLICE_NAME_LABEL) and worker.isdigit():
                found.setdefault(labels[SLICE_NAME_LABEL], {})[int(worker)] = labels
        return found


RAY_OPS: ClusterOps = RayOps()
"""The cluster operations on the connected Ray cluster."""
