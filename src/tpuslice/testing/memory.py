"""InMemoryCluster: :class:`~tpuslice._reserve.ops.ClusterOps` over in-memory TPU slices.

A stand-in for Ray in tests of the claiming loop, faithful where the loop could notice
(labels, all-or-nothing placement, dead nodes), on its own :class:`FakeClock`. Other parties
act through :meth:`InMemoryCluster.script` at the *n*-th call of an operation.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import ray
from ray.util.placement_group import PlacementGroup

from tpuslice._host.notices import Notice
from tpuslice._host.suspects import DEFAULT_COOLDOWN_S, Blame, Suspect, SuspectReason
from tpuslice._reserve.queue.service import QueueService, SliceQueue
from tpuslice._tpu.labels import (
    SLICE_NAME_LABEL,
    WORKER_ID_LABEL,
    host_labels,
    host_resources,
    selector_matches,
)
from tpuslice._tpu.topology import slice_shape
from tpuslice._view.cluster import ClusterSnapshot, build_snapshot
from tpuslice.errors import InvalidArgumentError, QueueUnreachableError

__all__ = ["FakeClock", "InMemoryCluster", "MemoryGroup", "MemoryNode"]

T = TypeVar("T")
NODE_ID_LABEL = "ray.io/node-id"
OPERATIONS = (
    "snapshot",
    "free_hosts",
    "start_owner_probe",
    "owner_answers",
    "create_group",
    "wait_placed",
    "remove_group",
    "bundle_node",
    "can_grow",
    "slice_queue",
    "slice_labels",
    "sleep",
)


@dataclass
class FakeClock:
    """Time that passes only when someone sleeps or a wait times out. ``on_sleep`` is
    called with the seconds of each :meth:`sleep` before time moves."""

    t: float = 0.0
    on_sleep: Callable[[float], None] | None = None
    _stamped: int = 0

    def stamp(self) -> int:
        """The time now in nanoseconds, distinct: stamps at one instant are one apart.

        Returns:
            Nanoseconds.
        """
        self._stamped = max(round(self.t * 1e9), self._stamped + 1)
        return self._stamped

    def now(self) -> float:
        """The time now.

        Returns:
            Seconds since the clock started (from 0).
        """
        return self.t

    def sleep(self, seconds: float) -> None:
        """Advance the clock at once (not backwards).

        Args:
            seconds: How long to sleep.
        """
        if self.on_sleep is not None:
            self.on_sleep(seconds)
        self.t += max(0.0, seconds)


@dataclass
class MemoryNode:
    """One in-memory host (Ray node), id ``<slice name>/<worker id>``; ``used``: what
    placed bundles hold."""

    node_id: str
    labels: dict[str, str]
    resources: dict[str, float]
    alive: bool = True
    used: dict[str, float] = field(default_factory=dict)

    def free(self, resource: str) -> float:
        """How much of a resource is not held.

        Args:
            resource: The resource's name (``"TPU"``).

        Returns:
            Total minus used; 0 for a resource the node lacks.
        """
        return self.resources.get(resource, 0.0) - self.used.get(resource, 0.0)


class MemoryGroup(PlacementGroup):  # type: ignore[misc]  # Ray's class is untyped
    """A placement group of the in-memory cluster (a real ``PlacementGroup``), made by
    ``owner``: ``"reserver"`` (the code under test) or ``"other"``."""

    def __init__(
        self,
        bundles: Sequence[Mapping[str, float]],
        selectors: Sequence[Mapping[str, str]],
        strategy: str,
        name: str,
        owner: str,
    ) -> None:
        super().__init__(
            ray.PlacementGroupID.from_random(), bundle_cache=[dict(b) for b in bundles]
        )
        self.bundles = [dict(b) for b in bundles]
        self.selectors = [dict(s) for s in selectors] or [{} for _ in bundles]
        self.strategy = strategy
        self.name = name
        self.owner = owner
        self.nodes: list[str] | None = None
        self.removed = False


class InMemoryCluster:
    """TPU slices in memory, offering the operations a reservation needs.

    Args:
        slices: ``(accelerator, topology[, count])`` items.
        can_grow: What :meth:`can_grow` answers (an autoscaler is present).
        cpus_per_host: Logical CPUs of each host.
        queue: Offer a queue on the cluster's clock; else :meth:`slice_queue` raises.

    Raises:
        InvalidArgumentError: an item names no valid slice shape.
    """

    def __init__(
        self,
        slices: Sequence[tuple[Any, ...]] = (),
        *,
        can_grow: bool = False,
        cpus_per_host: float = 8.0,
        queue: bool = True,
    ) -> None:
        self.clock = FakeClock(on_sleep=lambda s: self._call("sleep", lambda: None))
        self.growable = can_grow
        self.cpus_per_host = cpus_per_host
        self.nodes: dict[str, MemoryNode] = {}
        self.slice_hosts: dict[str, list[str]] = {}
        self.groups: list[MemoryGroup] = []
        self.tpu_owners: dict[str, str] = {}
        """Node id -> the process owning its TPU, as its agent would see it."""
        self.recorded_owners: dict[str, str] = {}
        """What the agents last recorded, which the cluster view reads."""
        self.seen_free: set[str] = set()
        """Node ids whose agents last said the TPU was free; none, so reservations ask."""
        self.suspects: dict[str, Suspect] = {}
        """Node id -> its suspect record, as in the KV store."""
        self.notices: dict[str, Notice] = {}
        """Node id -> the notice standing on it."""
        self.cooldown_s = DEFAULT_COOLDOWN_S
        self.calls: dict[str, int] = dict.fromkeys(OPERATIONS, 0)
        self._scripts: list[tuple[str, int, Callable[[], None], bool]] = []
        self._names = itertools.count()
        self.queue: QueueService | None = (
            QueueService(
                self._snapshot,
                reprobe=self._record_owners,
                clock=self.clock.now,
                # The queue actor numbers arrivals by its wall clock in nanoseconds.
                stamp=self.clock.stamp,
                wall=self.clock.now,
                decide_every_s=0.0,
            )
            if queue
            else None
        )
        for item in slices:
            count = item[2] if len(item) > 2 else 1
            for _ in range(count):
                self.add_slice(item[0], item[1])

    # --- the world -----------------------------------------------------------------------

    def add_slice(self, accelerator: str, topology: str, name: str | None = None) -> str:
        """A slice of idle hosts; waiting groups that now fit are placed.

        Args:
            accelerator: TPU generation, in any accepted spelling.
            topology: The slice's chip grid (chips per VM: the shape's default).
            name: The slice's name (default: pod type and a counter).

        Returns:
            The slice's name (``v6e-16-0``, ``v6e-16-1``, ...).

        Raises:
            InvalidArgumentError: the generation or topology is not valid.
        """
        shape = slice_shape(topology, accelerator)
        name = name or f"{shape.pod_type}-{next(self._names)}"
        hosts = []
        for worker in range(shape.num_hosts):
            node_id = f"{name}/{worker}"
            labels = {**host_labels(shape, name, worker), NODE_ID_LABEL: node_id}
            resources = {"CPU": self.cpus_per_host, **host_resources(shape, name, worker)}
            self.nodes[node_id] = MemoryNode(node_id, labels, resources)
            hosts.append(node_id)
        self.slice_hosts[name] = hosts
        self._place_pending()
        return name

    def kill_host(self, slice_name: str, worker_id: int) -> None:
        """The host dies, and its groups become unplaced.

        Args:
            slice_name: The host's slice.
            worker_id: The host's TPU worker id.
        """
        node = self.nodes[self.slice_hosts[slice_name][worker_id]]
        node.alive = False
        for group in self.live_groups():
            if group.nodes and node.node_id in group.nodes:
                self._unplace(group)

    def take(self, slice_name: str, worker_id: int, resources: Mapping[str, float]) -> MemoryGroup:
        """Another user holds ``resources`` of one host (placed at once, or never).

        Args:
            slice_name: The host's slice.
            worker_id: The host's TPU worker id.
            resources: What the other user holds.

        Returns:
            The other user's group; remove it to free the resources.
        """
        node_id = self.slice_hosts[slice_name][worker_id]
        group = MemoryGroup([resources], [{NODE_ID_LABEL: node_id}], "PACK", "", "other")
        self.groups.append(group)
        self._place_pending()
        return group

    def live_groups(self, owner: str | None = None) -> list[MemoryGroup]:
        """Groups not removed, placed or not, in creation order.

        Args:
            owner: Only this owner's groups; ``None`` for all.

        Returns:
            The groups.
        """
        return [g for g in self.groups if not g.removed and owner in (None, g.owner)]

    def script(
        self, operation: str, call: int, action: Callable[[], None], *, after: bool = False
    ) -> None:
        """Run ``action`` on the ``call``-th call of ``operation``, before it takes effect or
        (``after=True``) before it returns. A ``KeyboardInterrupt`` there is a Ctrl-C.

        Args:
            operation: One of :data:`OPERATIONS`.
            call: Which call, counting from 1 over the cluster's life.
            action: What to do; an exception it raises propagates from that call.
            after: Run it after the operation's effect instead of before.

        Raises:
            InvalidArgumentError: ``operation`` is not one of :data:`OPERATIONS`.
        """
        if operation not in OPERATIONS:
            raise InvalidArgumentError(f"unknown operation {operation!r}; one of {OPERATIONS}")
        self._scripts.append((operation, call, action, after))

    # --- ClusterOps ----------------------------------------------------------------------

    def snapshot(self, tpu_resource_per_chip: int) -> ClusterSnapshot:
        """Every slice now, as :func:`~tpuslice._view.cluster.build_snapshot` sees them.

        Args:
            tpu_resource_per_chip: The cluster's ``TPU`` units per chip.

        Returns:
            The snapshot, taken at the clock's time.
        """
        return self._call("snapshot", lambda: self._snapshot(tpu_resource_per_chip))

    def create_group(
        self,
        bundles: Sequence[Mapping[str, float]],
        selectors: Sequence[Mapping[str, str]],
        *,
        strategy: str = "PACK",
        name: str = "",
        lifetime: str | None = None,
    ) -> PlacementGroup:
        """Make a group and place it at once if it fits (else when it later does).

        Args:
            bundles: Resources of each bundle.
            selectors: One label selector per bundle, or none.
            strategy: Ray placement strategy (``STRICT_*`` are honoured).
            name: The group's name.
            lifetime: Ignored (accepted as Ray's is).

        Returns:
            The group (a :class:`MemoryGroup` owned by ``"reserver"``).
        """

        def create() -> PlacementGroup:
            group = MemoryGroup(bundles, selectors, strategy, name, "reserver")
            self.groups.append(group)
            self._place_pending()
            return group

        return self._call("create_group", create)

    def wait_placed(self, groups: Sequence[PlacementGroup], timeout: float) -> list[bool]:
        """Place what fits; if any group is still unplaced, the clock moves by ``timeout``.
        A wait of no time finds nothing placed: Ray answers it before asking the GCS.

        Args:
            groups: Groups of this cluster.
            timeout: Seconds the wait would take if a group does not place.

        Returns:
            Whether each group is placed, in order.

        Raises:
            InvalidArgumentError: a group is not of this cluster.
        """

        def wait() -> list[bool]:
            self._place_pending()
            placed = [self._group(g).nodes is not None for g in groups]
            if timeout <= 0:
                return [False] * len(placed)
            if not all(placed):
                self.clock.t += max(0.0, timeout)
            return placed

        return self._call("wait_placed", wait)

    def remove_group(self, group: PlacementGroup | None) -> None:
        """Remove a group and free its bundles; removing one twice is fine.

        Args:
            group: A group of this cluster; ``None`` does nothing.

        Raises:
            InvalidArgumentError: ``group`` is not of this cluster.
        """

        def remove() -> None:
            if group is None:
                return
            found = self._group(group)
            if not found.removed:
                self._unplace(found)
                found.removed = True
                self._place_pending()

        self._call("remove_group", remove)

    def bundle_node(self, group: PlacementGroup, index: int) -> str | None:
        """The node a bundle of a placed group is on.

        Args:
            group: A group of this cluster.
            index: The bundle's index in the group.

        Returns:
            The node id; ``None`` if the group is not placed.

        Raises:
            InvalidArgumentError: ``group`` is not of this cluster.
        """

        def node() -> str | None:
            nodes = self._group(group).nodes
            return nodes[index] if nodes else None

        return self._call("bundle_node", node)

    def can_grow(self) -> bool:
        """What the cluster was told (``can_grow=`` or :attr:`growable`).

        Returns:
            Whether an autoscaler is present.
        """
        return self._call("can_grow", lambda: self.growable)

    def free_hosts(self) -> frozenset[str]:
        """The hosts whose agents said their TPU is free (:attr:`seen_free`).

        Returns:
            Their node ids.
        """
        return self._call("free_hosts", lambda: frozenset(self.seen_free))

    def start_owner_probe(self, node_ids: Sequence[str]) -> Callable[[], dict[str, str | None]]:
        """Ask each host who owns its TPU (:attr:`tpu_owners`) and record it, as agents do.

        Args:
            node_ids: The hosts to ask.

        Returns:
            A function returning, per node, the owner or ``None``.
        """

        def start() -> Callable[[], dict[str, str | None]]:
            seen = self._record_owners(node_ids)
            return lambda: self._call("owner_answers", lambda: dict(seen))

        return self._call("start_owner_probe", start)

    def slice_queue(self) -> SliceQueue:
        """The in-memory queue (see ``queue=``).

        Returns:
            :attr:`queue`.

        Raises:
            QueueUnreachableError: the cluster was made without one.
        """

        def find() -> SliceQueue:
            if self.queue is None:
                raise QueueUnreachableError("this in-memory cluster has no queue (queue=False)")
            return self.queue

        return self._call("slice_queue", find)

    def slice_labels(self) -> dict[str, dict[int, Mapping[str, str]]]:
        """Every live host's labels, by slice name and worker id.

        Returns:
            ``{slice name: {worker id: labels}}``.
        """

        def read() -> dict[str, dict[int, Mapping[str, str]]]:
            found: dict[str, dict[int, Mapping[str, str]]] = {}
            for node in self.nodes.values():
                name = node.labels.get(SLICE_NAME_LABEL)
                worker = node.labels.get(WORKER_ID_LABEL, "")
                if node.alive and name and worker.isdigit():
                    found.setdefault(name, {})[int(worker)] = dict(node.labels)
            return found

        return self._call("slice_labels", read)

    def mark_suspects(self, blames: Sequence[Blame]) -> list[Suspect]:
        """Mark hosts suspect for :attr:`cooldown_s` from now, as Ray's KV store would.

        Args:
            blames: The hosts and why.

        Returns:
            The records.
        """
        records = [Suspect.of(b, self.clock.t, self.cooldown_s) for b in blames]
        self.suspects.update((r.node_id, r) for r in records)
        return records

    def suspect(
        self,
        slice_name: str,
        worker_id: int,
        reason: SuspectReason = SuspectReason.HANG,
        evidence: str = "",
    ) -> Suspect:
        """Mark one host suspect (see :meth:`mark_suspects`).

        Args:
            slice_name: The host's slice.
            worker_id: Its TPU worker id.
            reason: Why.
            evidence: What was seen.

        Returns:
            The record.
        """
        node_id = self.slice_hosts[slice_name][worker_id]
        return self.mark_suspects([Blame(node_id, slice_name, worker_id, reason, evidence)])[0]

    def own_tpu(self, slice_name: str, worker_id: int, owner: str | None) -> None:
        """A process takes that host's TPU (``owner`` describes it); ``None``: it exits.
        Taking drops the host from :attr:`seen_free`; exiting does not put it back.

        Args:
            slice_name: The host's slice.
            worker_id: Its TPU worker id.
            owner: The process, described, or ``None``.
        """
        node_id = self.slice_hosts[slice_name][worker_id]
        if owner is None:
            self.tpu_owners.pop(node_id, None)
        else:
            self.tpu_owners[node_id] = owner
            self.seen_free.discard(node_id)

    # --- internals -----------------------------------------------------------------------

    def _record_owners(self, node_ids: Sequence[str]) -> dict[str, str | None]:
        """What agents do when asked: find each TPU's owner and record it."""
        seen = {node: self.tpu_owners.get(node) for node in node_ids}
        for node, owner in seen.items():
            if owner is None:
                self.recorded_owners.pop(node, None)
            else:
                self.recorded_owners[node] = owner
        return seen

    def _call(self, operation: str, effect: Callable[[], T]) -> T:
        self.calls[operation] += 1
        due = [s for s in self._scripts if s[0] == operation and s[1] == self.calls[operation]]
        for _, _, action, after in due:
            if not after:
                action()
        result = effect()
        for _, _, action, after in due:
            if after:
                action()
        return result

    def _group(self, group: PlacementGroup) -> MemoryGroup:
        if not isinstance(group, MemoryGroup) or group not in self.groups:
            raise InvalidArgumentError(f"placement group {group.id.hex()} is not of this cluster")
        return group

    def _snapshot(self, per_chip: int) -> ClusterSnapshot:
        records = [
            {
                "NodeID": n.node_id,
                "NodeManagerAddress": f"10.0.0.{i}",  # a string; nothing connects to it
                "Alive": n.alive,
                "Labels": dict(n.labels),
                "Resources": dict(n.resources) if n.alive else {},
            }
            for i, n in enumerate(self.nodes.values())
        ]
        available = {
            n.node_id: {k: n.free(k) for k in n.resources if n.free(k) > 0}
            for n in self.nodes.values()
            if n.alive
        }
        snapshot = build_snapshot(
            records,
            available,
            per_chip,
            taken_at=self.clock.t,
            tpu_owners=self.recorded_owners,
            notices=self.notices,
            suspects=self.suspects,
            tpu_seen_free=self.seen_free,
        )
        if self.queue is None:
            return snapshot
        return dataclasses.replace(snapshot, queue=self.queue.record())

    def _unplace(self, group: MemoryGroup) -> None:
        self._hold(group, -1.0)
        group.nodes = None

    def _place_pending(self) -> None:
        """Place waiting groups in creation order, each all-or-nothing."""
        for group in self.live_groups():
            if group.nodes is None:
                group.nodes = self._fit(group)
                self._hold(group, 1.0)

    def _hold(self, group: MemoryGroup, sign: float) -> None:
        """Add (``sign`` 1) or give back (-1) the resources of the group's placed bundles."""
        for node_id, bundle in zip(group.nodes or [], group.bundles, strict=False):
            node = self.nodes[node_id]
            for key, value in bundle.items():
                node.used[key] = node.used.get(key, 0.0) + sign * value

    def _fit(self, group: MemoryGroup) -> list[str] | None:
        """Nodes for every bundle (first fit), or ``None`` if any bundle has none."""
        chosen: list[str] = []
        planned: dict[str, dict[str, float]] = {}
        for bundle, selector in zip(group.bundles, group.selectors, strict=True):
            for node in self.nodes.values():
                if not selector_matches(node.labels, selector) or not node.alive:
                    continue
                if group.strategy == "STRICT_SPREAD" and node.node_id in chosen:
                    continue
                if group.strategy == "STRICT_PACK" and chosen and node.node_id != chosen[0]:
                    continue
                extra = planned.setdefault(node.node_id, {})
                if all(node.free(k) - extra.get(k, 0.0) >= v for k, v in bundle.items() if v > 0):
                    for key, value in bundle.items():
                        extra[key] = extra.get(key, 0.0) + value
                    chosen.append(node.node_id)
                    break
            else:
                return None
        return chosen
