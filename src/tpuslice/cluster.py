"""Read-only view of the TPU slices in a Ray cluster: which exist, and which are idle.

The core, :func:`build_snapshot`, is pure: it turns node records (``ray.nodes()`` shape)
and per-node available resources into a :class:`ClusterSnapshot`. :func:`read_snapshot`
is the one place that reads Ray: one read of the nodes, one of available resources.

A host whose TPUs are all in use has *no* ``TPU`` key in its available resources; that
means 0 free, not "all free" (Ray 2.60's ``get_num_ready_tpu_slices`` gets this wrong).
"""

from __future__ import annotations

import enum
import functools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

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
from tpuslice.topology import SliceShape, parse_pod_type, slice_shape

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


class HostInfo(NamedTuple):
    """One Ray node that carries TPU labels or resources. A named tuple, not a frozen
    dataclass: there is one per TPU VM, and it is built in half the time (benchmarks/)."""

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
        """Same generation, topology and chips per VM as ``shape`` (so the 1-VM and 2-VM
        forms of a v6e 2x4 differ), and every live host with that VM's ``TPU``. Dead
        hosts are not compared: ``ray.nodes()`` reports no resources for a dead node."""
        per_host = shape.chips_per_host * tpu_resource_per_chip
        return self.shape == shape and all(
            h.tpu_total == per_host for h in self.hosts.values() if h.alive
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
        found = [s for s in self.slices.values() if s.matches(shape, tpu_resource_per_chip)]
        return sorted(found, key=lambda s: s.name)

    def ready(self, shape: SliceShape, tpu_resource_per_chip: int = 1) -> list[SliceInfo]:
        return [
            s for s in self.matching(shape, tpu_resource_per_chip) if s.state is SliceState.READY
        ]

    def whole(self, shape: SliceShape, tpu_resource_per_chip: int = 1) -> list[SliceInfo]:
        """Slices of this shape that are not broken (ready or busy)."""
        matching = self.matching(shape, tpu_resource_per_chip)
        return [s for s in matching if s.state is not SliceState.BROKEN]


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


def node_labels_of(node: NodeRecord) -> Mapping[str, str]:
    labels: Mapping[str, str] = node.get("Labels") or {}
    return labels


def _resources(node: NodeRecord) -> Mapping[str, float]:
    resources: Mapping[str, float] = node.get("Resources") or {}
    return resources


def _slice_key(node: NodeRecord) -> str | None:
    """The slice a node belongs to: its slice-name label, else (a single-host TPU VM
    without one) its node id. ``None`` for nodes that are not TPU hosts."""
    labels = node_labels_of(node)
    if labels.get(SLICE_NAME_LABEL):
        return labels[SLICE_NAME_LABEL]
    if labels.get(POD_TYPE_LABEL) and _resources(node).get(TPU_RESOURCE):
        return str(node.get("NodeID"))
    return None


def _host(node: NodeRecord, slice_name: str, available: Available, head: str | None) -> HostInfo:
    """One node as a :class:`HostInfo`; ``head`` is the slice's head resource, if known."""
    node_id: str = node.get("NodeID", "")
    address: str = node.get("NodeManagerAddress", "")
    resources: Mapping[str, float] = node.get("Resources") or {}
    alive: bool = node.get("Alive", False)
    tpu_total = float(resources.get(TPU_RESOURCE, 0.0))
    reported = available.get(node_id)
    # Absent node entry: registered but not yet reported, so nothing can be using it.
    # Absent TPU key in a reported entry: every TPU is in use.
    free = tpu_total if reported is None else float(reported.get(TPU_RESOURCE, 0.0))
    tpu_available = free if alive else 0.0
    head_free = None
    if head is not None and head in resources:
        head_free = reported is None or reported.get(head, 0.0) >= 1.0
    worker_id = _worker_id((node.get("Labels") or {}).get(WORKER_ID_LABEL))
    # Positional on purpose (same names, same order as the fields): keyword arguments
    # make a named tuple three times slower to build, and there is one per TPU VM.
    return HostInfo(
        node_id, address, slice_name, worker_id, alive, tpu_total, tpu_available, head_free
    )


def _worker_id(raw: str | None) -> int | None:
    """The worker-id label as an int; ``None`` if absent or not a plain number
    (``isdecimal``, not ``isdigit``: ``"²".isdigit()`` is true but ``int("²")`` fails)."""
    return int(raw) if raw and raw.isdecimal() else None


class _Claimed(NamedTuple):
    """A valid slice shape named by labels, with the facts classification needs
    computed once (``SliceShape`` derives them from the topology string on each access)."""

    shape: SliceShape
    num_hosts: int
    pod_type: str
    head_resource: str


@functools.lru_cache(maxsize=1024)
def _shape_of(
    pod_type: str | None, topology: str | None, chips_per_host: int | None
) -> _Claimed | None:
    """The slice shape the labels claim, or ``None`` if they do not name a valid one.
    Cached: a cluster has a few shapes, and parsing them per slice was most of the time."""
    if not pod_type:
        return None
    prefix, _, size = pod_type.rpartition("-")
    try:
        if topology:
            shape = slice_shape(topology, prefix, chips_per_host)
        else:
            shape = parse_pod_type(pod_type, chips_per_host)
    except InvalidArgumentError:
        return None
    if size != str(shape.cores):
        return None  # topology and pod type disagree (``v6e-8`` labelled ``4x4``)
    return _Claimed(shape, shape.num_hosts, shape.pod_type, shape.head_resource)


def _chips_per_host(node: NodeRecord, per_chip: int) -> int | None:
    """Chips per VM as this node reports them, if that is a whole number of chips."""
    chips = float(_resources(node).get(TPU_RESOURCE, 0.0)) / per_chip
    return int(chips) if chips.is_integer() and chips > 0 else None


def _first_alive(members: list[NodeRecord]) -> NodeRecord:
    """The node that speaks for the slice: the first live one (a dead one may be a VM
    that was since replaced), else the first."""
    for node in members:
        if node.get("Alive"):
            return node
    return members[0]


def _classify(
    name: str, members: list[NodeRecord], available: Available, per_chip: int
) -> SliceInfo:
    """Pick the live node per worker id, then decide READY / BUSY / BROKEN and why."""
    reference = _first_alive(members)
    labels = node_labels_of(reference)
    pod_type, topology = labels.get(POD_TYPE_LABEL), labels.get(TOPOLOGY_LABEL)
    claimed = _shape_of(pod_type, topology, _chips_per_host(reference, per_chip))
    head = claimed.head_resource if claimed else None
    # A single-host VM with no worker-id label is its own worker 0.
    default_worker = 0 if claimed and claimed.num_hosts == 1 else None
    found = [_host(n, name, available, head) for n in members]
    hosts, problems = _pick_hosts(found, default_worker)
    if claimed is None:
        problems.insert(
            0, f"labels do not name a valid slice (pod type {pod_type!r}, topology {topology!r})"
        )
    if not reference.get("Alive"):
        # Dead nodes report no resources, so the shape is a guess: say what is known.
        problems.insert(0, f"every host dead ({len(members)} known)")
    expected = claimed.num_hosts if claimed else len(hosts)
    state, reason = _state(hosts, expected, problems)
    return SliceInfo(
        name=name,
        pod_type=claimed.pod_type if claimed else pod_type or "",
        topology=claimed.shape.topology if claimed else topology or "",
        shape=claimed.shape if claimed else None,
        hosts=dict(sorted(hosts.items())),
        state=state,
        reason=reason,
        expected_hosts=expected,
    )


def _pick_hosts(
    found: list[HostInfo], default_worker: int | None
) -> tuple[dict[int, HostInfo], list[str]]:
    """One host per worker id, preferring a live node over a dead one it replaced.

    Returns the hosts and what does not add up: live hosts without a worker-id label,
    and worker ids claimed by more than one live host.
    """
    hosts: dict[int, HostInfo] = {}
    unlabelled = 0
    doubled: set[int] = set()
    for host in found:
        worker = host.worker_id if host.worker_id is not None else default_worker
        if worker is None:
            unlabelled += host.alive
            continue
        if host.worker_id is None:
            host = host._replace(worker_id=worker)
        held = hosts.get(worker)
        if held is None or (host.alive and not held.alive):
            hosts[worker] = host
        elif host.alive:
            doubled.add(worker)
    problems = [f"{unlabelled} live host(s) without a worker-id label"] if unlabelled else []
    if doubled:
        problems.append(f"worker id(s) {sorted(doubled)} on more than one live host")
    return hosts, problems


def _state(
    hosts: Mapping[int, HostInfo], expected: int, problems: list[str]
) -> tuple[SliceState, str]:
    """BROKEN (with the first thing wrong), else BUSY if any host is in use, else READY."""
    if problems:
        return SliceState.BROKEN, problems[0]
    extra, dead, busy = [], [], 0
    for worker, host in hosts.items():  # one pass: this runs once per slice
        if worker >= expected:
            extra.append(worker)
        elif not host.alive:
            dead.append(worker)
        elif host.state is HostState.BUSY:
            busy += 1
    if extra:
        return SliceState.BROKEN, f"worker id(s) {sorted(extra)} outside 0..{expected - 1}"
    # Every key is now in 0..expected-1, so a full count means nothing is missing.
    missing = [] if len(hosts) == expected else [w for w in range(expected) if w not in hosts]
    if 0 in missing or 0 in dead:
        return SliceState.BROKEN, "no live worker 0"
    if missing or dead:
        parts = [f"host {', '.join(map(str, sorted(dead)))} dead"] if dead else []
        parts += [f"host {', '.join(map(str, missing))} missing"] if missing else []
        return SliceState.BROKEN, ", ".join(parts)
    if busy:
        return SliceState.BUSY, f"{busy}/{expected} hosts in use"
    return SliceState.READY, ""


# --- the one Ray read -------------------------------------------------------------------


def read_snapshot(tpu_resource_per_chip: int | None = None) -> ClusterSnapshot:
    """Read the connected cluster: one ``ray.nodes()`` and one available-resources call."""
    per_chip = resolve_resource_per_chip(tpu_resource_per_chip)
    return build_snapshot(ray.nodes(), _ray.available_resources_per_node(), per_chip)
