"""Read-only view of the TPU slices in a Ray cluster: which exist, and which are idle.

The core, :func:`build_snapshot`, is pure: it turns node records (``ray.nodes()`` shape)
and per-node available resources into a :class:`ClusterSnapshot`. :func:`read_snapshot`
is the one place that reads Ray: one read of the nodes, one of available resources.

A host whose TPUs are all in use has *no* ``TPU`` key in its available resources; that
means 0 free, not "all free" (Ray 2.60's ``get_num_ready_tpu_slices`` gets this wrong).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import ray

from tpuslice import _ray
from tpuslice.compat import resolve_resource_per_chip
from tpuslice.errors import InvalidArgumentError
from tpuslice.labels import (
    POD_TYPE_LABEL,
    SLICE_NAME_LABEL,
    TOPOLOGY_LABEL,
    TPU_RESOURCE,
    WORKER_ID_LABEL,
)
from tpuslice.topology import SliceShape, normalize_generation_name, parse_pod_type, slice_shape

NodeRecord = Mapping[str, Any]
Available = Mapping[str, Mapping[str, float]]


class HostState(str, enum.Enum):
    FREE = "free"
    BUSY = "busy"
    DEAD = "dead"


class SliceState(str, enum.Enum):
    READY = "ready"
    """Every host alive, worker 0 present, every TPU and the head resource free."""
    BUSY = "busy"
    """Whole, but some TPU (or the head resource) is in use."""
    BROKEN = "broken"
    """A host missing or dead, no worker 0, or labels that do not add up."""


@dataclass(frozen=True)
class HostInfo:
    """One Ray node that carries TPU labels or resources."""

    node_id: str
    address: str
    slice_name: str
    worker_id: int | None
    alive: bool
    tpu_total: float
    tpu_available: float
    head_free: bool | None
    """Whether the ``TPU-<podtype>-head`` resource is free (worker 0 only)."""

    @property
    def state(self) -> HostState:
        if not self.alive:
            return HostState.DEAD
        busy = self.tpu_available < self.tpu_total or self.head_free is False
        return HostState.BUSY if busy else HostState.FREE


@dataclass(frozen=True)
class SliceInfo:
    """One TPU slice: its shape (when the labels give it) and its hosts by worker id."""

    name: str
    pod_type: str
    topology: str
    shape: SliceShape | None
    hosts: Mapping[int, HostInfo]
    state: SliceState
    reason: str
    expected_hosts: int

    @property
    def generation(self) -> str | None:
        return self.shape.generation.name if self.shape else None

    @property
    def alive_hosts(self) -> int:
        return sum(1 for h in self.hosts.values() if h.alive)

    @property
    def busy_hosts(self) -> int:
        return sum(1 for h in self.hosts.values() if h.state is HostState.BUSY)

    @property
    def missing_workers(self) -> list[int]:
        return [w for w in range(self.expected_hosts) if w not in self.hosts]

    @property
    def chips_total(self) -> float:
        return sum(h.tpu_total for h in self.hosts.values() if h.alive)

    @property
    def chips_free(self) -> float:
        return sum(h.tpu_available for h in self.hosts.values() if h.alive)

    @property
    def head_node_id(self) -> str | None:
        head = self.hosts.get(0)
        return head.node_id if head else None

    def matches(self, shape: SliceShape, tpu_resource_per_chip: int = 1) -> bool:
        """Same pod type, topology and TPU per host as ``shape``."""
        per_host = shape.chips_per_host * tpu_resource_per_chip
        return (
            self.shape is not None
            and self.pod_type == shape.pod_type
            and self.topology == shape.topology
            and all(h.tpu_total == per_host for h in self.hosts.values())
        )

    def describe(self) -> str:
        """``v6e-16-a: 4/4 hosts in use`` style summary for error messages."""
        if self.state is SliceState.BUSY:
            return f"{self.name}: {self.busy_hosts}/{self.expected_hosts} hosts in use"
        return f"{self.name}: {self.reason}" if self.reason else self.name


@dataclass(frozen=True)
class ClusterSnapshot:
    """Every TPU slice of a cluster at one moment."""

    slices: Mapping[str, SliceInfo]
    taken_at: float = field(default_factory=time.time)

    def matching(self, shape: SliceShape, tpu_resource_per_chip: int = 1) -> list[SliceInfo]:
        """Slices of exactly this shape, in name order."""
        return [
            s for _, s in sorted(self.slices.items()) if s.matches(shape, tpu_resource_per_chip)
        ]

    def ready(self, shape: SliceShape, tpu_resource_per_chip: int = 1) -> list[SliceInfo]:
        return [
            s for s in self.matching(shape, tpu_resource_per_chip) if s.state is SliceState.READY
        ]

    def whole(self, shape: SliceShape, tpu_resource_per_chip: int = 1) -> list[SliceInfo]:
        """Slices of this shape that are not broken (ready or busy)."""
        return [
            s
            for s in self.matching(shape, tpu_resource_per_chip)
            if s.state is not SliceState.BROKEN
        ]


# --- pure core ------------------------------------------------------------------------


def build_snapshot(
    nodes: Sequence[NodeRecord],
    available: Available,
    tpu_resource_per_chip: int = 1,
    taken_at: float | None = None,
) -> ClusterSnapshot:
    """Group TPU nodes into slices and classify each. Pure; linear in the node count.

    ``tpu_resource_per_chip`` is the cluster's ``RAY_TPU_RESOURCE_PER_CHIP`` (TPU resource
    units per physical chip), needed to tell chips per VM from the ``TPU`` resource.
    """
    groups: dict[str, list[NodeRecord]] = {}
    for node in nodes:
        key = _slice_key(node)
        if key is not None:
            groups.setdefault(key, []).append(node)
    slices = {
        name: _classify(name, members, available, tpu_resource_per_chip)
        for name, members in groups.items()
    }
    return ClusterSnapshot(slices, taken_at if taken_at is not None else time.time())


def _labels(node: NodeRecord) -> Mapping[str, str]:
    labels: Mapping[str, str] = node.get("Labels") or {}
    return labels


def _slice_key(node: NodeRecord) -> str | None:
    """The slice a node belongs to: its slice-name label, else (a single-host TPU VM
    without one) its node id. ``None`` for nodes that are not TPU hosts."""
    labels = _labels(node)
    if labels.get(SLICE_NAME_LABEL):
        return labels[SLICE_NAME_LABEL]
    if labels.get(POD_TYPE_LABEL) and (node.get("Resources") or {}).get(TPU_RESOURCE):
        return str(node.get("NodeID"))
    return None


def _host(node: NodeRecord, name: str, available: Available, head: str | None) -> HostInfo:
    node_id = str(node.get("NodeID", ""))
    total = float((node.get("Resources") or {}).get(TPU_RESOURCE, 0.0))
    reported = available.get(node_id)
    # Absent node entry: registered but not yet reported, so nothing can be using it.
    # Absent TPU key in a reported entry: every TPU is in use.
    free = total if reported is None else float(reported.get(TPU_RESOURCE, 0.0))
    head_free = None
    if head and head in (node.get("Resources") or {}):
        head_free = reported is None or reported.get(head, 0.0) >= 1.0
    raw_worker = _labels(node).get(WORKER_ID_LABEL)
    return HostInfo(
        node_id=node_id,
        address=str(node.get("NodeManagerAddress", "")),
        slice_name=name,
        worker_id=int(raw_worker) if raw_worker and raw_worker.isdigit() else None,
        alive=bool(node.get("Alive")),
        tpu_total=total,
        tpu_available=free if node.get("Alive") else 0.0,
        head_free=head_free,
    )


def _shape_of(labels: Mapping[str, str], chips_per_host: int | None) -> SliceShape | None:
    """The slice shape the labels claim, or ``None`` if they do not name a valid one."""
    pod_type, topology = labels.get(POD_TYPE_LABEL), labels.get(TOPOLOGY_LABEL)
    if not pod_type:
        return None
    try:
        if not topology:
            return parse_pod_type(pod_type, chips_per_host)
        shape = slice_shape(topology, pod_type.rsplit("-", 1)[0], chips_per_host)
    except InvalidArgumentError:
        return None
    return shape if shape.pod_type == parse_pod_type_name(pod_type) else None


def parse_pod_type_name(pod_type: str) -> str:
    """``"tpu7x-16"`` -> ``"v7x-16"``: the pod type as Ray normalises it."""
    prefix, _, size = pod_type.rpartition("-")
    return f"{normalize_generation_name(prefix)}-{size}"


def _chips_per_host(members: list[NodeRecord], per_chip: int) -> int | None:
    """Chips per VM as the nodes report them, if that is a whole number of chips."""
    per_host = max(float((n.get("Resources") or {}).get(TPU_RESOURCE, 0.0)) for n in members)
    chips = per_host / per_chip
    return int(chips) if chips.is_integer() and chips > 0 else None


def _classify(
    name: str, members: list[NodeRecord], available: Available, per_chip: int
) -> SliceInfo:
    """Pick the live node per worker id, then decide READY / BUSY / BROKEN and why."""
    labels = _labels(next((n for n in members if n.get("Alive")), members[0]))
    shape = _shape_of(labels, _chips_per_host(members, per_chip))
    head = shape.head_resource if shape else None
    hosts: dict[int, HostInfo] = {}
    unlabelled = 0
    for node in members:
        host = _host(node, name, available, head)
        worker = host.worker_id
        if worker is None and len(members) == 1 and shape and shape.is_single_host:
            worker = 0  # a single-host VM with no worker-id label is its own worker 0
        if worker is None:
            unlabelled += host.alive
            continue
        if worker not in hosts or (host.alive and not hosts[worker].alive):
            hosts[worker] = host if host.worker_id == worker else _with_worker(host, worker)
    expected = shape.num_hosts if shape else len(hosts)
    state, reason = _state(shape, labels, hosts, expected, unlabelled)
    return SliceInfo(
        name=name,
        pod_type=labels.get(POD_TYPE_LABEL, ""),
        topology=shape.topology if shape else labels.get(TOPOLOGY_LABEL, ""),
        shape=shape,
        hosts=dict(sorted(hosts.items())),
        state=state,
        reason=reason,
        expected_hosts=expected,
    )


def _with_worker(host: HostInfo, worker: int) -> HostInfo:
    return replace(host, worker_id=worker)


def _state(
    shape: SliceShape | None,
    labels: Mapping[str, str],
    hosts: Mapping[int, HostInfo],
    expected: int,
    unlabelled: int,
) -> tuple[SliceState, str]:
    if shape is None:
        got = f"pod type {labels.get(POD_TYPE_LABEL)!r}, topology {labels.get(TOPOLOGY_LABEL)!r}"
        return SliceState.BROKEN, f"labels do not name a valid slice ({got})"
    if unlabelled:
        return SliceState.BROKEN, f"{unlabelled} host(s) without a worker-id label"
    extra = sorted(w for w in hosts if w >= expected)
    if extra:
        return SliceState.BROKEN, f"worker id(s) {extra} outside 0..{expected - 1}"
    missing = [w for w in range(expected) if w not in hosts]
    dead = [w for w, h in hosts.items() if not h.alive]
    if 0 in missing or 0 in dead:
        return SliceState.BROKEN, "no live worker 0"
    if missing or dead:
        parts = [f"host {_join(dead)} dead"] if dead else []
        parts += [f"host {_join(missing)} missing"] if missing else []
        return SliceState.BROKEN, ", ".join(parts)
    busy = [w for w, h in hosts.items() if h.state is HostState.BUSY]
    if busy:
        return SliceState.BUSY, f"{len(busy)}/{expected} hosts in use"
    return SliceState.READY, ""


def _join(workers: list[int]) -> str:
    return ", ".join(map(str, workers))


# --- the one Ray read -------------------------------------------------------------------


def read_snapshot(tpu_resource_per_chip: int | None = None) -> ClusterSnapshot:
    """Read the connected cluster: one ``ray.nodes()`` and one available-resources call."""
    per_chip = resolve_resource_per_chip(tpu_resource_per_chip)
    return build_snapshot(ray.nodes(), _ray.available_resources_per_node(), per_chip)


# --- Ray 2.60 drop-in functions ----------------------------------------------------------


def get_tpu_slice_name_from_node(node: dict[str, Any]) -> str | None:
    """The slice-name label of a ``ray.nodes()`` record, or ``None``."""
    return _labels(node).get(SLICE_NAME_LABEL)


def get_tpu_nodes_for_slice(
    slice_name: str, nodes: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Alive nodes of the slice; ``[]`` when Ray is not initialised and no nodes are given."""
    if nodes is None:
        if not ray.is_initialized():
            return []
        nodes = ray.nodes()
    return [n for n in nodes if n.get("Alive") and get_tpu_slice_name_from_node(n) == slice_name]


def _count(
    topology: str, accelerator_type: str, per_chip: int | None, states: set[SliceState]
) -> int:
    if not ray.is_initialized():
        return 0
    shape = slice_shape(topology, accelerator_type)
    resolved = resolve_resource_per_chip(per_chip)
    snapshot = read_snapshot(resolved)
    return sum(1 for s in snapshot.matching(shape, resolved) if s.state in states)


def get_num_ready_tpu_slices(
    topology: str, accelerator_type: str, tpu_resource_per_chip: int | None = None
) -> int:
    """Slices of this shape that are whole and idle (every TPU free); 0 without Ray."""
    return _count(topology, accelerator_type, tpu_resource_per_chip, {SliceState.READY})


def get_num_tpu_slices(
    topology: str, accelerator_type: str, tpu_resource_per_chip: int | None = None
) -> int:
    """Slices of this shape that are whole (idle or busy); 0 without Ray."""
    return _count(
        topology, accelerator_type, tpu_resource_per_chip, {SliceState.READY, SliceState.BUSY}
    )
