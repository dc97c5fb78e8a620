"""Read-only view of the TPU slices in a Ray cluster: which exist, and which are idle.

:func:`build_snapshot` is pure: node records and per-node available resources in, a
:class:`ClusterSnapshot` out; :func:`read_snapshot` is the one place that reads Ray. A host
with no ``TPU`` key in its available resources has 0 free, not all (Ray 2.60 gets this wrong).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import logging
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import ray

from tpuslice._host.agent import forget_free_keys
from tpuslice._host.notices import Notice
from tpuslice._host.suspects import Suspect
from tpuslice._tpu import _ray
from tpuslice._tpu._connection import Pool, connection
from tpuslice._tpu.compat import resolve_resource_per_chip
from tpuslice._tpu.keys import NAMESPACE as QUEUE_NAMESPACE
from tpuslice._tpu.keys import QUEUE_KEY
from tpuslice._tpu.labels import (
    POD_TYPE_LABEL,
    SLICE_NAME_LABEL,
    TOPOLOGY_LABEL,
    TPU_RESOURCE,
    WORKER_ID_LABEL,
)
from tpuslice._tpu.topology import SliceShape, parse_pod_type, slice_shape
from tpuslice._view.agents import recorded_notes
from tpuslice._view.holders import given_by_queue
from tpuslice._view.queue_record import QueuedRequest, QueueRecord
from tpuslice._view.quotas import Quotas, read_quotas
from tpuslice.errors import InvalidArgumentError

logger = logging.getLogger(__name__)

NodeRecord = Mapping[str, Any]
Available = Mapping[str, Mapping[str, float]]


class HostState(str, enum.Enum):
    """One TPU host in a snapshot: free, busy (a TPU or the head resource in use), dead."""

    FREE = "free"
    BUSY = "busy"
    DEAD = "dead"


class SliceState(str, enum.Enum):
    """One TPU slice in a snapshot. BROKEN is decided first, then NOTICE, SUSPECT, BUSY."""

    READY = "ready"
    """Every host alive, worker 0 present, every TPU and the head resource free."""
    BUSY = "busy"
    """Whole, but some TPU (or the head resource) is in use."""
    BROKEN = "broken"
    """A host missing or dead, no worker 0, or labels that do not add up."""
    NOTICE = "notice"
    """Whole, but a host was warned of preemption or maintenance: never reserved."""
    SUSPECT = "suspect"
    """Whole, but a host failed a run lately: reserved only as a last resort, when idle."""


class HostInfo(NamedTuple):
    """One Ray node with TPU labels or resources (a named tuple: one per TPU VM, and it
    builds faster than a dataclass). ``worker_id`` is None if its label is missing or not a
    number; ``tpu_available`` is 0 on a dead node; ``tpu_owner`` is the process its agent
    last saw owning the TPU (busy whatever Ray's resources say)."""

    node_id: str
    address: str
    slice_name: str
    worker_id: int | None
    alive: bool
    tpu_total: float
    tpu_available: float
    head_free: bool | None
    """Whether the ``TPU-<podtype>-head`` resource is free (worker 0 only)."""
    tpu_owner: str | None = None
    notice: Notice | None = None
    suspect: Suspect | None = None
    tpu_seen_free: bool = False
    """Whether its agent last saw the TPU free, with no owner."""

    @property
    def state(self) -> HostState:
        """Dead, busy (any TPU or the head resource in use, or the TPU owned), or free."""
        if not self.alive:
            return HostState.DEAD
        busy = self.tpu_available < self.tpu_total or self.head_free is False
        return HostState.BUSY if busy or self.tpu_owner else HostState.FREE


@dataclass(frozen=True)
class SliceInfo:
    """One TPU slice: its shape (None when the labels name no valid one; ``pod_type`` and
    ``topology`` are then as labelled) and its hosts by worker id. A single-host VM without
    a slice name is named by its node id. ``reason`` says why it is not ready;
    ``expected_hosts`` is the shape's host count (the hosts found, without a shape)."""

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
        """The generation's name (``v6e``); None without a shape."""
        return self.shape.generation.name if self.shape else None

    @property
    def alive_hosts(self) -> int:
        """Hosts Ray sees alive."""
        return sum(1 for h in self.hosts.values() if h.alive)

    @property
    def busy_hosts(self) -> int:
        """Live hosts with some TPU or the head resource in use."""
        return sum(1 for h in self.hosts.values() if h.state is HostState.BUSY)

    @property
    def missing_workers(self) -> list[int]:
        """Worker ids the shape has but no node claims, in order."""
        return [w for w in range(self.expected_hosts) if w not in self.hosts]

    @property
    def chips_total(self) -> float:
        """``TPU`` resource of the live hosts (chips x TPU units per chip)."""
        return sum(h.tpu_total for h in self.hosts.values() if h.alive)

    @property
    def chips_free(self) -> float:
        """Free ``TPU`` resource of the live hosts."""
        return sum(h.tpu_available for h in self.hosts.values() if h.alive)

    @property
    def notice(self) -> Notice | None:
        """The most urgent notice on a live host of the slice, if any."""
        found = [h.notice for h in self.hosts.values() if h.notice is not None and h.alive]
        return min(found, key=lambda n: n.deadline) if found else None

    @property
    def suspects(self) -> list[Suspect]:
        """The live suspect records of its live hosts, in worker-id order."""
        return [h.suspect for h in self.hosts.values() if h.suspect is not None and h.alive]

    @property
    def idle(self) -> bool:
        """Whether every host it should have is there, alive and free."""
        return len(self.hosts) == self.expected_hosts and all(
            h.state is HostState.FREE for h in self.hosts.values()
        )

    @property
    def trusted(self) -> bool:
        """Whether it can serve a request without a last resort: ready or busy, or under
        the queue's notice only (its work is leaving)."""
        if self.state is SliceState.NOTICE:
            return given_by_queue(self.notice)
        return self.state in (SliceState.READY, SliceState.BUSY)

    @property
    def last_resort(self) -> bool:
        """Whether it is suspect but idle: reservable only as a last resort."""
        return self.state is SliceState.SUSPECT and self.idle

    @property
    def head_node_id(self) -> str | None:
        """Node id of worker 0; None if there is no worker 0."""
        head = self.hosts.get(0)
        return head.node_id if head else None

    def matches(self, shape: SliceShape, tpu_resource_per_chip: int = 1) -> bool:
        """Same generation, topology and chips per VM as ``shape``, and every live host
        with that VM's ``TPU`` (a dead node reports no resources).

        Args:
            shape: The shape asked for.
            tpu_resource_per_chip: The cluster's ``TPU`` units per chip.

        Returns:
            Whether this slice has exactly that shape.
        """
        per_host = shape.chips_per_host * tpu_resource_per_chip
        return self.shape == shape and all(
            h.tpu_total == per_host for h in self.hosts.values() if h.alive
        )

    def describe(self) -> str:
        """Summarize for error messages.

        Returns:
            The name and its reason (``v6e-16-a: 4/4 hosts in use``).
        """
        return f"{self.name}: {self.reason}" if self.reason else self.name


@dataclass(frozen=True)
class ClusterSnapshot:
    """Every TPU slice of a cluster by name, when it was read (``time.time()``), the queue
    as last published, and the tenants' quotas."""

    slices: Mapping[str, SliceInfo]
    taken_at: float = field(default_factory=time.time)
    queue: QueueRecord | None = None
    quotas: Quotas = field(default_factory=Quotas)

    def queued(self) -> list[QueuedRequest]:
        """The requests waiting in the cluster-wide queue, if its record is fresh.

        Returns:
            Them, in serving order.
        """
        if self.queue is None or not self.queue.fresh(self.taken_at):
            return []
        return list(self.queue.requests)

    def matching(self, shape: SliceShape, tpu_resource_per_chip: int = 1) -> list[SliceInfo]:
        """Slices of exactly this shape, in name order.

        Args:
            shape: The shape asked for (see :meth:`SliceInfo.matches`).
            tpu_resource_per_chip: The cluster's ``TPU`` units per chip.

        Returns:
            Them, in any state.
        """
        found = [s for s in self.slices.values() if s.matches(shape, tpu_resource_per_chip)]
        return sorted(found, key=lambda s: s.name)

    def ready(self, shape: SliceShape, tpu_resource_per_chip: int = 1) -> list[SliceInfo]:
        """Slices of this shape that are idle and whole (ready to reserve).

        Args:
            shape: The shape asked for (see :meth:`SliceInfo.matches`).
            tpu_resource_per_chip: The cluster's ``TPU`` units per chip.

        Returns:
            Them, in name order.
        """
        matching = self.matching(shape, tpu_resource_per_chip)
        return [s for s in matching if s.state is SliceState.READY]

    def whole(self, shape: SliceShape, tpu_resource_per_chip: int = 1) -> list[SliceInfo]:
        """Slices of this shape that are not broken (ready, busy, suspect, under notice).

        Args:
            shape: The shape asked for (see :meth:`SliceInfo.matches`).
            tpu_resource_per_chip: The cluster's ``TPU`` units per chip.

        Returns:
            Them, in name order.
        """
        matching = self.matching(shape, tpu_resource_per_chip)
        return [s for s in matching if s.state is not SliceState.BROKEN]

    def trusted(self, shape: SliceShape, tpu_resource_per_chip: int = 1) -> list[SliceInfo]:
        """Slices of this shape that could serve a request without a last resort.

        Args:
            shape: The shape asked for (see :meth:`SliceInfo.matches`).
            tpu_resource_per_chip: The cluster's ``TPU`` units per chip.

        Returns:
            Them, in name order.
        """
        return [s for s in self.matching(shape, tpu_resource_per_chip) if s.trusted]

    def idle_suspects(self, shape: SliceShape, tpu_resource_per_chip: int = 1) -> list[SliceInfo]:
        """Suspect slices of this shape whose every host is free (a last resort).

        Args:
            shape: The shape asked for (see :meth:`SliceInfo.matches`).
            tpu_resource_per_chip: The cluster's ``TPU`` units per chip.

        Returns:
            Them, in name order.
        """
        return [s for s in self.matching(shape, tpu_resource_per_chip) if s.last_resort]


def build_snapshot(
    nodes: Sequence[NodeRecord],
    available: Available,
    tpu_resource_per_chip: int = 1,
    taken_at: float | None = None,
    tpu_owners: Mapping[str, str] | None = None,
    notices: Mapping[str, Notice] | None = None,
    suspects: Mapping[str, Suspect] | None = None,
    tpu_seen_free: Collection[str] = (),
) -> ClusterSnapshot:
    """Group ``ray.nodes()`` records into slices and classify each. Pure. ``available`` is
    free resources per node id (a node not listed: all free; no ``TPU`` key: none);
    ``taken_at`` defaults to now, and the arguments after it are the agents' records by node
    id. Nodes that do not add up make a slice broken, not an error."""
    groups: dict[str, list[NodeRecord]] = {}
    for node in nodes:
        key = _slice_key(node)
        if key is not None:
            groups.setdefault(key, []).append(node)
    now = taken_at if taken_at is not None else time.time()
    notes = _Notes(
        tpu_owners or {},
        notices or {},
        {node: s for node, s in (suspects or {}).items() if s.live(now)},
        frozenset(tpu_seen_free),
    )
    slices = {
        name: _classify(name, members, available, tpu_resource_per_chip, notes, now)
        for name, members in groups.items()
    }
    return ClusterSnapshot(slices, now)


def node_labels_of(node: NodeRecord) -> Mapping[str, str]:
    """The node labels of a ``ray.nodes()`` record (empty when it has none)."""
    labels: Mapping[str, str] = node.get("Labels") or {}
    return labels


def _resources(node: NodeRecord) -> Mapping[str, float]:
    resources: Mapping[str, float] = node.get("Resources") or {}
    return resources


def _slice_key(node: NodeRecord) -> str | None:
    """The slice a node belongs to: its slice-name label, else (a single-host TPU VM) its
    node id; ``None`` for a non-TPU node."""
    labels = node_labels_of(node)
    if labels.get(SLICE_NAME_LABEL):
        return labels[SLICE_NAME_LABEL]
    if labels.get(POD_TYPE_LABEL) and _resources(node).get(TPU_RESOURCE):
        return str(node.get("NodeID"))
    return None


class _Notes(NamedTuple):
    """What the KV store says of the hosts, by node id."""

    owners: Mapping[str, str]
    notices: Mapping[str, Notice]
    suspects: Mapping[str, Suspect]
    seen_free: frozenset[str]


def _host(
    node: NodeRecord, slice_name: str, available: Available, head: str | None, notes: _Notes
) -> HostInfo:
    """One node as a :class:`HostInfo`; ``head`` is the slice's head resource, if known."""
    node_id: str = node.get("NodeID", "")
    address: str = node.get("NodeManagerAddress", "")
    resources = _resources(node)
    alive: bool = node.get("Alive", False)
    tpu_total = float(resources.get(TPU_RESOURCE, 0.0))
    reported = available.get(node_id)
    # No entry: registered, not yet reported, so unused. No TPU key: every TPU in use.
    free = tpu_total if reported is None else float(reported.get(TPU_RESOURCE, 0.0))
    tpu_available = free if alive else 0.0
    head_free = None
    if head is not None and head in resources:
        head_free = reported is None or reported.get(head, 0.0) >= 1.0
    worker_id = _worker_id(node_labels_of(node).get(WORKER_ID_LABEL))
    owner = notes.owners.get(node_id) if notes.owners else None
    notice = notes.notices.get(node_id) if notes.notices else None
    suspect = notes.suspects.get(node_id) if notes.suspects else None
    # Positional on purpose: keyword arguments make a named tuple much slower to build.
    return HostInfo(
        node_id,
        address,
        slice_name,
        worker_id,
        alive,
        tpu_total,
        tpu_available,
        head_free,
        owner,
        notice,
        suspect,
        owner is None and node_id in notes.seen_free,
    )


def _worker_id(raw: str | None) -> int | None:
    """The worker-id label as an int, if a plain number (``int("²")`` fails; ``isdigit``
    would pass it)."""
    return int(raw) if raw and raw.isdecimal() else None


class _Claimed(NamedTuple):
    """A valid shape named by labels, with facts ``SliceShape`` derives on each access
    computed once."""

    shape: SliceShape
    num_hosts: int
    pod_type: str
    head_resource: str


@functools.lru_cache(maxsize=1024)
def _shape_of(
    pod_type: str | None, topology: str | None, chips_per_host: int | None
) -> _Claimed | None:
    """The slice shape the labels claim, if valid. Cached: a cluster has few shapes."""
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
    """The node that speaks for the slice: the first live one (a dead one may have been
    replaced), else the first."""
    for node in members:
        if node.get("Alive"):
            return node
    return members[0]


def _classify(
    name: str,
    members: list[NodeRecord],
    available: Available,
    per_chip: int,
    notes: _Notes,
    now: float,
) -> SliceInfo:
    """Pick the live node per worker id, then decide the slice's state and why."""
    reference = _first_alive(members)
    labels = node_labels_of(reference)
    pod_type, topology = labels.get(POD_TYPE_LABEL), labels.get(TOPOLOGY_LABEL)
    claimed = _shape_of(pod_type, topology, _chips_per_host(reference, per_chip))
    head = claimed.head_resource if claimed else None
    # A single-host VM with no worker-id label is its own worker 0.
    default_worker = 0 if claimed and claimed.num_hosts == 1 else None
    found = [_host(n, name, available, head, notes) for n in members]
    hosts, problems = _pick_hosts(found, default_worker)
    if claimed is None:
        problems.insert(
            0, f"labels do not name a valid slice (pod type {pod_type!r}, topology {topology!r})"
        )
    if not reference.get("Alive"):
        # Dead nodes report no resources, so the shape is a guess: say what is known.
        problems.insert(0, f"every host dead ({len(members)} known)")
    expected = claimed.num_hosts if claimed else len(hosts)
    state, reason = _state(hosts, expected, problems, now)
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
    """One host per worker id, preferring a live node over a dead one it replaced, and
    what does not add up (unlabelled live hosts, worker ids on two live hosts)."""
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
    hosts: Mapping[int, HostInfo], expected: int, problems: list[str], now: float
) -> tuple[SliceState, str]:
    """BROKEN (with the first thing wrong), else NOTICE, SUSPECT, BUSY or READY."""
    if problems:
        return SliceState.BROKEN, problems[0]
    extra, dead, busy = [], [], 0
    warned: Notice | None = None
    suspects: list[Suspect] = []
    for worker, host in hosts.items():  # one pass: this runs once per slice
        if worker >= expected:
            extra.append(worker)
        elif not host.alive:
            dead.append(worker)
        else:
            busy += host.state is HostState.BUSY
            if host.suspect is not None:
                suspects.append(host.suspect)
            if host.notice is not None and (
                warned is None or host.notice.deadline < warned.deadline
            ):
                warned = host.notice
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
    if warned is not None:
        return SliceState.NOTICE, warned.describe(now)
    in_use = f"{busy}/{expected} hosts in use" if busy else "every host free"
    if suspects:
        return SliceState.SUSPECT, "; ".join([*(s.describe(now) for s in suspects), in_use])
    if busy:
        held = [
            f"host {worker}: TPU held by {host.tpu_owner}"
            for worker, host in hosts.items()
            if host.tpu_owner and host.alive
        ]
        return SliceState.BUSY, "; ".join([in_use, *held])
    return SliceState.READY, ""


def as_freed(info: SliceInfo, now: float | None = None) -> SliceInfo | None:
    """The slice (as read while its work held it) as a hand-back that saw it free leaves
    it: every ``TPU`` and head resource free, the queue's notice gone (it warned the work
    that has left). ``None`` when something else keeps it from being ready: only a new read
    can tell that changed."""
    hosts = {
        worker: host._replace(
            tpu_available=host.tpu_total,
            head_free=None if host.head_free is None else True,
            notice=None if given_by_queue(host.notice) else host.notice,
        )
        for worker, host in info.hosts.items()
    }
    state, _ = _state(hosts, info.expected_hosts, [], time.time() if now is None else now)
    if state is not SliceState.READY:
        return None
    return dataclasses.replace(info, hosts=hosts, state=state, reason="")


def read_snapshot(tpu_resource_per_chip: int | None = None) -> ClusterSnapshot:
    """Read the connected cluster: available resources (``ray.nodes()`` only when the
    alive nodes changed) and, alongside, the agents' records, the queue and the quotas.

    Args:
        tpu_resource_per_chip: ``TPU`` units per chip (default: the environment's, or 1).

    Returns:
        Every TPU slice of the cluster now.

    Raises:
        InvalidArgumentError: the TPU units per chip is not a positive integer.
    """
    per_chip = resolve_resource_per_chip(tpu_resource_per_chip)
    # The KV reads use another GCS client than the node and resource reads: run alongside.
    reads = connection().part(SnapshotReads)
    recorded = reads.kv_reader.submit(recorded_notes)
    queued = reads.kv_reader.submit(read_queue_record)
    quotas = reads.kv_reader.submit(read_quotas)
    available = _ray.available_resources_per_node()
    nodes = reads.node_records(available)
    notes = recorded.result()
    dead = [n["NodeID"] for n in nodes if not n.get("Alive") and n.get("NodeID") in notes.seen_free]
    if dead:  # off the read's path: a dead node's key only costs a listing
        reads.kv_reader.submit(forget_free_keys, dead)
    owners = {node: owner.describe() for node, owner in notes.owners.items()}
    queue = queued.result()
    snapshot = build_snapshot(
        nodes,
        available,
        per_chip,
        tpu_owners=owners,
        notices=notes.notices,
        suspects=notes.suspects,
        tpu_seen_free=notes.seen_free,
    )
    return dataclasses.replace(snapshot, queue=queue, quotas=quotas.result())


FREED_BOUND_S = 2.0
"""How long a hand-back waits for Ray's resource view to show its hosts free."""
FREED_POLL_S = 0.01


def wait_freed(hosts: Iterable[HostInfo], head_resource: str | None) -> bool:
    """Wait (at most :data:`FREED_BOUND_S`) until Ray's resource view has shown each
    handed-back host free once: removing a placement group returns before its hosts report
    their resources back, and a group asked for meanwhile waits for a GCS retry. False on
    timeout or if a host is no longer listed (only a new read can say what its slice is)."""
    waiting = {h.node_id: h for h in hosts}
    deadline = time.monotonic() + FREED_BOUND_S
    all_listed = True
    while True:
        available = _ray.available_resources_per_node()
        for node, host in list(waiting.items()):
            free = available.get(node)
            all_listed = all_listed and free is not None
            head_ok = head_resource is None or host.head_free is None
            if free is None or (
                free.get(TPU_RESOURCE, 0.0) >= host.tpu_total
                and (head_ok or free.get(head_resource or "", 0.0) >= 1.0)
            ):
                del waiting[node]
        if not waiting:
            return all_listed
        if time.monotonic() >= deadline:
            return False
        time.sleep(FREED_POLL_S)


class SnapshotReads:
    """What a connection keeps between snapshots: the last ``ray.nodes()`` with the alive
    nodes it was read for, and threads for the KV reads. No lock: the records are one
    reference replaced whole, and two threads that both read ``ray.nodes()`` are both right.
    """

    def __init__(self) -> None:
        self._nodes_seen: tuple[frozenset[str], list[NodeRecord]] | None = None
        self.kv_reader = Pool(3, "tpuslice-snapshot")
        """Threads for the KV reads (host records, queue, quotas), started on first use."""

    def close(self) -> None:
        """Finish the reads started, then stop the threads."""
        self.kv_reader.close()

    def drop(self) -> None:
        """Stop the threads, dropping reads not started."""
        self.kv_reader.drop()

    def node_records(self, available: Available) -> list[NodeRecord]:
        """``ray.nodes()``, read again only when the alive nodes (the keys of ``available``,
        just read) changed: a node's labels and totals are fixed for its life."""
        alive = frozenset(available)
        seen = self._nodes_seen  # one read: another thread may replace it meanwhile
        if seen is not None and seen[0] == alive:
            return seen[1]
        nodes: list[NodeRecord] = ray.nodes()
        now_alive = frozenset(n["NodeID"] for n in nodes if n.get("Alive"))
        self._nodes_seen = (now_alive, nodes) if now_alive == alive else None
        return nodes


def read_queue_record() -> QueueRecord | None:
    """The cluster-wide queue's last record; ``None`` if there is none or it is unreadable."""
    raw = _ray.kv_get(QUEUE_KEY, QUEUE_NAMESPACE)
    if raw is None:
        return None
    try:
        return QueueRecord.from_json(raw)
    except ValueError as exc:
        logger.debug("ignoring an unreadable queue record: %s", exc)
        return None
