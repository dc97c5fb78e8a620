"""The cluster view (``tpuslice._view.cluster``) on synthetic ``ray.nodes()`` records. Pure: no Ray.

Records are built here, from Ray's conventions spelled out literally (not from
``tpuslice._tpu.labels``), so these tests also pin what we expect a real TPU VM to look like:
``TPU`` = chips on the VM, the slice-name resource on every host, ``TPU-<pod>-head`` on
worker 0, the ``ray.io/tpu-*`` labels, and ``Resources == {}`` for a dead node (Ray
reports no resources for dead nodes). A resource fully in use is *absent* from a node's
available map, as in ``ray._private.state.available_resources_per_node()``.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

import pytest
import ray
from hypothesis import given, settings
from hypothesis import strategies as st

from test_topology import all_shapes
from tpuslice._host import agent
from tpuslice._host.notices import Notice
from tpuslice._tpu import _ray
from tpuslice._tpu.topology import SliceShape, slice_shape
from tpuslice._view.cluster import (
    ClusterSnapshot,
    HostState,
    SliceInfo,
    SliceState,
    build_snapshot,
    read_snapshot,
)
from tpuslice._view.slices import (
    get_num_ready_tpu_slices,
    get_num_tpu_slices,
    get_tpu_nodes_for_slice,
    get_tpu_slice_name_from_node,
)

Node = dict[str, Any]
Available = dict[str, dict[str, float]]

_ids = itertools.count(1)


def tpu_node(
    pod_type: str,
    topology: str,
    worker: int | None,
    tpu: float,
    *,
    slice_name: str | None = None,
    alive: bool = True,
) -> Node:
    """One TPU VM as ``ray.nodes()`` reports it."""
    serial = next(_ids)
    address = f"10.{serial // 65536 % 256}.{serial // 256 % 256}.{serial % 256}"
    generation = pod_type.rsplit("-", 1)[0]
    labels = {
        "ray.io/tpu-pod-type": pod_type,
        "ray.io/tpu-topology": topology,
        "ray.io/accelerator-type": f"TPU-{generation.upper()}",
    }
    resources = {"CPU": 8.0, "memory": 1e9, "TPU": float(tpu), f"node:{address}": 1.0}
    if slice_name is not None:
        labels["ray.io/tpu-slice-name"] = slice_name
        resources[slice_name] = 1.0
    if worker is not None:
        labels["ray.io/tpu-worker-id"] = str(worker)
    if worker == 0:
        resources[f"TPU-{pod_type}-head"] = 1.0
    node = {
        "NodeID": f"{serial:056x}",
        "Alive": True,
        "alive": True,
        "NodeManagerAddress": address,
        "NodeManagerHostname": f"tpu-vm-{serial}",
        "NodeName": address,
        "DeathReason": 0,
        "DeathReasonMessage": "",
        "Resources": resources,
        "Labels": labels,
    }
    return node if alive else killed(node)


def killed(node: Node) -> Node:
    """The record of the same node after it died: Ray drops its resources."""
    return {**node, "Alive": False, "alive": False, "Resources": {}, "DeathReason": 2}


def tpu_slice(name: str, pod_type: str, topology: str, hosts: int, tpu: float) -> list[Node]:
    return [tpu_node(pod_type, topology, w, tpu, slice_name=name) for w in range(hosts)]


def cpu_node() -> Node:
    """A head node or any other non-TPU node."""
    node = tpu_node("unused-0", "1x1", None, 0)
    node["Labels"] = {}
    node["Resources"] = {"CPU": 4.0, "node:__internal_head__": 1.0}
    return node


def idle(nodes: list[Node]) -> Available:
    """Available resources with nothing in use (dead nodes are absent, as in Ray)."""
    return {n["NodeID"]: dict(n["Resources"]) for n in nodes if n["Alive"]}


def take(available: Available, node: Node, tpu: float = 0.0, head: bool = False) -> None:
    """Put ``tpu`` TPUs (and the head resource) of ``node`` in use, the way Ray shows it."""
    entry = available[node["NodeID"]]
    if tpu:
        left = entry["TPU"] - tpu
        if left > 0:
            entry["TPU"] = left
        else:
            del entry["TPU"]
    if head:
        del entry[next(k for k in entry if k.endswith("-head"))]


def v6e_4x4(name: str = "v6e-16-a") -> list[Node]:
    return tpu_slice(name, "v6e-16", "4x4", 4, 4)


def one(nodes: list[Node], available: Available | None = None, per_chip: int = 1) -> SliceInfo:
    """The only slice of a snapshot of ``nodes``."""
    snapshot = build_snapshot(nodes, idle(nodes) if available is None else available, per_chip)
    assert len(snapshot.slices) == 1, list(snapshot.slices)
    return next(iter(snapshot.slices.values()))


# --- READY and BUSY -----------------------------------------------------------------------


def test_idle_whole_slice_is_ready() -> None:
    nodes = v6e_4x4()
    info = one([cpu_node(), *nodes])
    assert info.state is SliceState.READY
    assert info.reason == ""
    assert (info.name, info.pod_type, info.topology, info.generation) == (
        "v6e-16-a",
        "v6e-16",
        "4x4",
        "v6e",
    )
    assert info.shape == slice_shape("4x4", "v6e")
    assert list(info.hosts) == [0, 1, 2, 3]
    assert [h.node_id for h in info.hosts.values()] == [n["NodeID"] for n in nodes]
    assert info.hosts[1].address == nodes[1]["NodeManagerAddress"]
    assert info.head_node_id == nodes[0]["NodeID"]
    assert info.hosts[0].head_free is True and info.hosts[1].head_free is None
    assert (info.expected_hosts, info.alive_hosts, info.busy_hosts) == (4, 4, 0)
    assert (info.chips_free, info.chips_total) == (16, 16)
    assert info.describe() == "v6e-16-a"


def test_host_with_some_tpus_in_use_makes_the_slice_busy() -> None:
    nodes = v6e_4x4()
    available = idle(nodes)
    take(available, nodes[2], tpu=1)
    info = one(nodes, available)
    assert info.state is SliceState.BUSY
    assert info.reason == "1/4 hosts in use"
    assert info.hosts[2].state is HostState.BUSY
    assert info.hosts[2].tpu_available == 3
    assert info.hosts[1].state is HostState.FREE
    assert (info.busy_hosts, info.chips_free, info.chips_total) == (1, 15, 16)
    assert info.describe() == "v6e-16-a: 1/4 hosts in use"


def test_missing_tpu_key_in_available_means_all_in_use() -> None:
    """Ray drops a fully used resource from the available map; that is 0 free, not 4."""
    nodes = v6e_4x4()
    available = idle(nodes)
    take(available, nodes[3], tpu=4)
    assert "TPU" not in available[nodes[3]["NodeID"]]
    info = one(nodes, available)
    assert info.state is SliceState.BUSY
    assert info.hosts[3].tpu_available == 0
    assert info.hosts[3].state is HostState.BUSY
    assert info.chips_free == 12


def test_ray_2_60_counts_a_fully_used_slice_as_ready_and_we_do_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bug we fix (REFERENCE.md). If Ray fixes it, the first assert tells us."""
    import ray.util.tpu as ray_tpu

    nodes = v6e_4x4()
    available = idle(nodes)
    for node in nodes:
        take(available, node, tpu=4)
    monkeypatch.delenv("RAY_TPU_RESOURCE_PER_CHIP", raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    monkeypatch.setattr(ray._private.state, "available_resources_per_node", lambda: available)
    monkeypatch.setattr(_ray, "available_resources_per_node", lambda: available)
    assert ray_tpu.get_num_ready_tpu_slices("4x4", "TPU-V6E") == 1
    assert get_num_ready_tpu_slices("4x4", "TPU-V6E") == 0
    assert get_num_tpu_slices("4x4", "TPU-V6E") == 1


def test_head_resource_in_use_makes_the_slice_busy() -> None:
    """Every TPU free, but someone holds worker 0's head resource: not ready."""
    nodes = v6e_4x4()
    available = idle(nodes)
    take(available, nodes[0], head=True)
    info = one(nodes, available)
    assert info.state is SliceState.BUSY
    assert info.hosts[0].head_free is False
    assert info.hosts[0].state is HostState.BUSY
    assert info.chips_free == info.chips_total == 16


def test_node_not_yet_in_available_map_counts_as_free() -> None:
    """Registered but not yet reported: just provisioned, so nothing can be using it."""
    nodes = v6e_4x4()
    available = idle(nodes)
    del available[nodes[0]["NodeID"]]
    del available[nodes[1]["NodeID"]]
    info = one(nodes, available)
    assert info.state is SliceState.READY
    assert info.hosts[0].tpu_available == 4
    assert info.hosts[0].head_free is True


# --- BROKEN --------------------------------------------------------------------------------


def warning(node: Node, kind: str = "preemption") -> dict[str, Notice]:
    event = "TRUE" if kind == "preemption" else "TERMINATE_ON_HOST_MAINTENANCE"
    return {node["NodeID"]: Notice(kind, event, 990.0, 1020.0, node["NodeID"], "s", 1)}


def test_a_notice_on_a_host_puts_its_slice_under_notice_busy_or_not() -> None:
    """Never reserved (not ready), named with the time left; a busy slice under notice is
    under notice too (its work should move)."""
    for busy in (False, True):
        nodes = tpu_slice("v6e-16-a", "v6e-16", "4x4", 4, 4)
        available = idle(nodes)
        if busy:
            take(available, nodes[0], tpu=4)
        snap = build_snapshot(nodes, available, taken_at=1000.0, notices=warning(nodes[1]))
        info = snap.slices["v6e-16-a"]
        assert info.state is SliceState.NOTICE
        assert info.reason == ("preemption notice on s host 1 (instance/preempted=TRUE), 20 s left")
        assert info.notice is not None and info.notice.kind == "preemption"
        assert snap.ready(info.shape) == []  # type: ignore[arg-type]


def test_a_broken_slice_stays_broken_under_notice_and_a_dead_hosts_notice_is_ignored() -> None:
    nodes = tpu_slice("v6e-16-a", "v6e-16", "4x4", 4, 4)
    nodes[1] = killed(nodes[1])
    snap = build_snapshot(nodes, idle(nodes), taken_at=1000.0, notices=warning(nodes[1]))
    assert snap.slices["v6e-16-a"].state is SliceState.BROKEN
    assert snap.slices["v6e-16-a"].notice is None


def test_dead_host_breaks_the_slice() -> None:
    nodes = v6e_4x4()
    nodes[2] = killed(nodes[2])
    info = one(nodes)
    assert info.state is SliceState.BROKEN
    assert info.reason == "host 2 dead"
    assert info.hosts[2].state is HostState.DEAD
    assert info.hosts[2].tpu_available == 0
    assert (info.alive_hosts, info.expected_hosts, info.missing_workers) == (3, 4, [])
    assert (info.chips_free, info.chips_total) == (12, 12)
    assert info.describe() == "v6e-16-a: host 2 dead"


@pytest.mark.parametrize("replacement_first", [False, True])
def test_dead_host_replaced_by_a_new_node_is_not_broken(replacement_first: bool) -> None:
    """A VM that died and came back is a new Ray node with the same labels."""
    nodes = v6e_4x4()
    replacement = tpu_node("v6e-16", "4x4", 1, 4, slice_name="v6e-16-a")
    dead = killed(nodes[1])
    nodes[1:2] = [replacement, dead] if replacement_first else [dead, replacement]
    info = one(nodes)
    assert info.state is SliceState.READY
    assert info.hosts[1].node_id == replacement["NodeID"]
    assert info.alive_hosts == 4


def test_dead_slice_still_matches_its_shape() -> None:
    """Dead nodes report no resources; the slice is still found (as broken) by shape."""
    nodes = v6e_4x4()
    nodes[3] = killed(nodes[3])
    snapshot = build_snapshot(nodes, idle(nodes))
    shape = slice_shape("4x4", "v6e")
    assert [s.name for s in snapshot.matching(shape)] == ["v6e-16-a"]
    assert snapshot.whole(shape) == []
    assert snapshot.ready(shape) == []


def test_every_host_dead() -> None:
    nodes = [killed(n) for n in tpu_slice("v6e-8-b", "v6e-8", "2x4", 2, 4)]
    info = one(nodes)
    assert info.state is SliceState.BROKEN
    assert info.reason == "every host dead (2 known)"
    assert info.alive_hosts == 0
    assert info.chips_total == 0


def test_missing_host_breaks_the_slice() -> None:
    nodes = v6e_4x4()
    del nodes[3]
    info = one(nodes)
    assert info.state is SliceState.BROKEN
    assert info.reason == "host 3 missing"
    assert info.missing_workers == [3]
    assert info.describe() == "v6e-16-a: host 3 missing"


def test_dead_and_missing_hosts_are_both_named() -> None:
    nodes = tpu_slice("v5p-32-a", "v5p-32", "2x2x4", 4, 4)
    nodes[1] = killed(nodes[1])
    del nodes[3]
    assert one(nodes).reason == "host 1 dead, host 3 missing"


@pytest.mark.parametrize("fate", ["missing", "dead"])
def test_no_live_worker_0(fate: str) -> None:
    nodes = v6e_4x4()
    if fate == "missing":
        del nodes[0]
    else:
        nodes[0] = killed(nodes[0])
    info = one(nodes)
    assert info.state is SliceState.BROKEN
    assert info.reason == "no live worker 0"
    assert info.head_node_id == (None if fate == "missing" else nodes[0]["NodeID"])


def test_worker_id_outside_the_slice() -> None:
    nodes = [*v6e_4x4(), tpu_node("v6e-16", "4x4", 4, 4, slice_name="v6e-16-a")]
    info = one(nodes)
    assert info.state is SliceState.BROKEN
    assert info.reason == "worker id(s) [4] outside 0..3"


@pytest.mark.parametrize("label", [None, "", "one", "-1", "²", "1.0"])
def test_live_host_without_a_usable_worker_id_breaks_a_multi_host_slice(
    label: str | None,
) -> None:
    """``"²".isdigit()`` is true but ``int("²")`` raises: the label must not crash us."""
    nodes = v6e_4x4()
    if label is None:
        del nodes[2]["Labels"]["ray.io/tpu-worker-id"]
    else:
        nodes[2]["Labels"]["ray.io/tpu-worker-id"] = label
    info = one(nodes)
    assert info.state is SliceState.BROKEN
    assert info.reason == "1 live host(s) without a worker-id label"
    assert 2 not in info.hosts


def test_two_live_hosts_claiming_one_worker_id() -> None:
    nodes = [*v6e_4x4(), tpu_node("v6e-16", "4x4", 1, 4, slice_name="v6e-16-a")]
    info = one(nodes)
    assert info.state is SliceState.BROKEN
    assert info.reason == "worker id(s) [1] on more than one live host"


@pytest.mark.parametrize(
    ("pod_type", "topology"),
    [
        ("v6e-17", "4x4"),  # no such size
        ("v9-16", "4x4"),  # no such generation
        ("v6e-8", "4x4"),  # topology and pod type disagree
        ("v6e-9", "3x3"),  # invalid topology
        ("v6e", "4x4"),  # no size at all
    ],
)
def test_labels_that_name_no_valid_slice(pod_type: str, topology: str) -> None:
    nodes = [tpu_node(pod_type, topology, w, 4, slice_name="odd") for w in range(4)]
    info = one(nodes)
    assert info.state is SliceState.BROKEN
    assert info.reason == (
        f"labels do not name a valid slice (pod type {pod_type!r}, topology {topology!r})"
    )
    assert info.shape is None and info.generation is None
    assert (info.pod_type, info.topology) == (pod_type, topology)
    assert info.expected_hosts == 4
    assert build_snapshot(nodes, idle(nodes)).matching(slice_shape("4x4", "v6e")) == []


def test_pod_type_without_topology_label_is_parsed_when_unambiguous() -> None:
    nodes = tpu_slice("v5p-32-a", "v5p-32", "", 4, 4)
    info = one(nodes)
    assert info.state is SliceState.READY
    assert info.topology == "2x2x4"
    ambiguous = tpu_slice("v6e-16-a", "v6e-16", "", 4, 4)  # 4x4 or 2x8
    info = one(ambiguous)
    assert info.state is SliceState.BROKEN
    assert info.reason == "labels do not name a valid slice (pod type 'v6e-16', topology '')"


# --- single-host slices, shapes, generations ------------------------------------------------


def test_single_host_v6e_2x4_is_one_8_chip_vm() -> None:
    info = one(tpu_slice("v6e-8-a", "v6e-8", "2x4", 1, 8))
    assert info.state is SliceState.READY
    assert (info.expected_hosts, info.chips_total) == (1, 8)
    assert info.shape == slice_shape("2x4", "v6e")


def test_single_host_without_slice_name_is_grouped_by_node_id() -> None:
    first = tpu_node("v6e-8", "2x4", None, 8)
    second = tpu_node("v6e-8", "2x4", 0, 8)
    snapshot = build_snapshot([first, second], idle([first, second]))
    assert set(snapshot.slices) == {first["NodeID"], second["NodeID"]}
    for node in (first, second):
        info = snapshot.slices[node["NodeID"]]
        assert info.state is SliceState.READY
        assert info.hosts[0].node_id == node["NodeID"]  # unlabelled worker is worker 0
    assert len(snapshot.ready(slice_shape("2x4", "v6e"))) == 2


def test_single_host_with_slice_name_but_no_worker_id_is_worker_0() -> None:
    dead = killed(tpu_node("v6e-8", "2x4", None, 8, slice_name="solo"))
    alive = tpu_node("v6e-8", "2x4", None, 8, slice_name="solo")
    info = one([dead, alive])
    assert info.state is SliceState.READY
    assert info.hosts[0].node_id == alive["NodeID"]


def test_two_vm_and_one_vm_v6e_2x4_do_not_match_each_other() -> None:
    two_vms = tpu_slice("v6e-8-two", "v6e-8", "2x4", 2, 4)
    one_vm = tpu_slice("v6e-8-one", "v6e-8", "2x4", 1, 8)
    snapshot = build_snapshot(two_vms + one_vm, idle(two_vms + one_vm))
    assert snapshot.slices["v6e-8-two"].expected_hosts == 2
    assert snapshot.slices["v6e-8-one"].expected_hosts == 1
    assert [s.name for s in snapshot.matching(slice_shape("2x4", "v6e"))] == ["v6e-8-one"]
    assert [s.name for s in snapshot.matching(slice_shape("2x4", "v6e", 4))] == ["v6e-8-two"]
    assert [s.name for s in snapshot.ready(slice_shape("2x4", "v6e", 4))] == ["v6e-8-two"]


def test_mixed_generations() -> None:
    v4 = tpu_slice("v4-16-a", "v4-16", "2x2x2", 2, 4)
    v5p = tpu_slice("v5p-32-a", "v5p-32", "2x2x4", 4, 4)
    v7x = tpu_slice("v7x-16-a", "tpu7x-16", "2x2x2", 2, 8)  # 4 chips x 2 TPU per chip
    nodes = [cpu_node(), *v4, *v5p, *v7x]
    snapshot = build_snapshot(nodes, idle(nodes), tpu_resource_per_chip=2, taken_at=12.5)
    assert snapshot.taken_at == 12.5
    assert {n: s.state for n, s in snapshot.slices.items()} == {
        "v4-16-a": SliceState.BROKEN,  # 4 TPU / 2 per chip = 2 chips per VM: 4 VMs expected
        "v5p-32-a": SliceState.BROKEN,
        "v7x-16-a": SliceState.READY,
    }
    v7x_info = snapshot.slices["v7x-16-a"]
    assert (v7x_info.pod_type, v7x_info.generation, v7x_info.expected_hosts) == ("v7x-16", "v7x", 2)
    assert snapshot.matching(slice_shape("2x2x2", "v7x"), 2) == [v7x_info]

    per_chip_1 = build_snapshot(nodes, idle(nodes), tpu_resource_per_chip=1)
    assert per_chip_1.slices["v4-16-a"].state is SliceState.READY
    assert per_chip_1.slices["v5p-32-a"].state is SliceState.READY
    assert per_chip_1.slices["v5p-32-a"].shape == slice_shape("2x2x4", "v5p")
    assert per_chip_1.slices["v7x-16-a"].state is SliceState.BROKEN  # 8 chips/VM: 1 VM


def test_non_tpu_nodes_are_ignored() -> None:
    no_labels = cpu_node()
    labels_none = {**cpu_node(), "Labels": None, "Resources": None}
    pod_type_but_no_tpu = tpu_node("v6e-8", "2x4", None, 0)
    nodes = [no_labels, labels_none, pod_type_but_no_tpu]
    assert build_snapshot(nodes, idle([no_labels])).slices == {}


def test_empty_cluster() -> None:
    snapshot = build_snapshot([], {})
    assert snapshot == ClusterSnapshot({}, snapshot.taken_at)
    assert snapshot.matching(slice_shape("4x4", "v6e")) == []


# --- Ray 2.60 drop-ins -----------------------------------------------------------------------


def test_get_tpu_slice_name_from_node() -> None:
    assert get_tpu_slice_name_from_node(v6e_4x4()[0]) == "v6e-16-a"
    assert get_tpu_slice_name_from_node(cpu_node()) is None
    assert get_tpu_slice_name_from_node({"NodeID": "x", "Labels": None}) is None


def test_get_tpu_nodes_for_slice_given_nodes_returns_alive_members() -> None:
    a, b = v6e_4x4("a"), v6e_4x4("b")
    a[1] = killed(a[1])
    nodes = [cpu_node(), *a, *b]
    assert get_tpu_nodes_for_slice("a", nodes=nodes) == [a[0], a[2], a[3]]
    assert get_tpu_nodes_for_slice("c", nodes=nodes) == []


def test_drop_ins_without_ray_return_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_ray() -> None:
        raise AssertionError("must not read Ray when it is not initialised")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "nodes", no_ray)
    monkeypatch.setattr(_ray, "available_resources_per_node", no_ray)
    assert get_num_ready_tpu_slices("4x4", "v6e") == 0
    assert get_num_tpu_slices("4x4", "v6e") == 0
    assert get_tpu_nodes_for_slice("v6e-16-a") == []


def test_drop_ins_read_ray_once_connected(monkeypatch: pytest.MonkeyPatch) -> None:
    ready, busy, broken = v6e_4x4("r"), v6e_4x4("b"), v6e_4x4("x")
    broken[1] = killed(broken[1])
    nodes = [cpu_node(), *ready, *busy, *broken]
    available = idle(nodes)
    take(available, busy[0], tpu=2)
    monkeypatch.delenv("RAY_TPU_RESOURCE_PER_CHIP", raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    monkeypatch.setattr(_ray, "available_resources_per_node", lambda: available)
    assert get_num_ready_tpu_slices("4x4", "v6e") == 1
    assert get_num_tpu_slices("4x4", "TPU-V6E") == 2
    assert get_tpu_nodes_for_slice("x") == [broken[0], broken[2], broken[3]]


# --- property: states agree with hosts -----------------------------------------------------

SMALL_SHAPES = [s for s in all_shapes() if s.num_hosts <= 8]
FATES = ("free", "some_busy", "all_busy", "head_busy", "unreported", "dead", "missing")
REPLACED = ("replaced_free", "replaced_busy")


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[Node], Available, int, dict[str, SliceState]]:
    """Random clusters of valid slices with some hosts dead, missing, replaced or busy,
    plus non-TPU nodes, in random order; and the state each slice must get."""
    per_chip = draw(st.sampled_from([1, 2]))
    nodes: list[Node] = [cpu_node() for _ in range(draw(st.integers(0, 2)))]
    available: Available = {}
    states: dict[str, SliceState] = {}
    for index, shape in enumerate(draw(st.lists(st.sampled_from(SMALL_SHAPES), max_size=5))):
        fates = draw(st.lists(st.sampled_from(FATES + REPLACED), min_size=8, max_size=8))
        name = f"{shape.pod_type}-{index}"
        made, used = build_slice(name, shape, fates[: shape.num_hosts], per_chip)
        nodes += made
        available.update(used)
        if made:
            states[name] = expected_state(fates[: shape.num_hosts])
    return draw(st.permutations(nodes)), available, per_chip, states


def build_slice(
    name: str, shape: SliceShape, fates: list[str], per_chip: int
) -> tuple[list[Node], Available]:
    tpu = shape.chips_per_host * per_chip
    nodes: list[Node] = []
    available: Available = {}
    for worker, fate in enumerate(fates):
        if fate == "missing":
            continue
        node = tpu_node(shape.pod_type, shape.topology, worker, tpu, slice_name=name)
        if fate in ("dead", *REPLACED):
            nodes.append(killed(node))
            if fate == "dead":
                continue
            node = tpu_node(shape.pod_type, shape.topology, worker, tpu, slice_name=name)
        nodes.append(node)
        if fate != "unreported":
            available.update(idle([node]))
        if fate in ("some_busy", "replaced_busy"):
            take(available, node, tpu=1)
        elif fate == "all_busy":
            take(available, node, tpu=tpu)
        elif fate == "head_busy" and worker == 0:
            take(available, node, head=True)
    return nodes, available


def expected_state(fates: list[str]) -> SliceState:
    if any(f in ("dead", "missing") for f in fates):
        return SliceState.BROKEN
    busy = ("some_busy", "all_busy", "replaced_busy")
    if any(f in busy for f in fates) or fates[0] == "head_busy":
        return SliceState.BUSY
    return SliceState.READY


@settings(deadline=None, max_examples=200)
@given(clusters())
def test_slice_states_agree_with_their_hosts(
    cluster: tuple[list[Node], Available, int, dict[str, SliceState]],
) -> None:
    nodes, available, per_chip, states = cluster
    snapshot = build_snapshot(nodes, available, per_chip)
    assert {name: info.state for name, info in snapshot.slices.items()} == states
    for info in snapshot.slices.values():
        expected = range(info.expected_hosts)
        whole = all(w in info.hosts and info.hosts[w].alive for w in expected)
        idle_hosts = all(
            w in info.hosts and info.hosts[w].state is HostState.FREE for w in expected
        )
        assert (info.state is SliceState.BROKEN) == (not whole)
        assert (info.state is SliceState.READY) == idle_hosts
        if info.alive_hosts:
            assert info.shape is not None and info.expected_hosts == info.shape.num_hosts
            assert info.matches(info.shape, per_chip)
    reversed_order = build_snapshot(nodes[::-1], available, per_chip)
    assert {n: s.state for n, s in reversed_order.slices.items()} == states


@settings(deadline=None, max_examples=100)
@given(clusters())
def test_snapshot_groups_exactly_the_tpu_nodes(
    cluster: tuple[list[Node], Available, int, dict[str, SliceState]],
) -> None:
    nodes, available, per_chip, _ = cluster
    snapshot = build_snapshot(nodes, available, per_chip)
    tpu_ids = {n["NodeID"] for n in nodes if n["Labels"]}
    alive_tpu_ids = {n["NodeID"] for n in nodes if n["Labels"] and n["Alive"]}
    shown = {h.node_id for info in snapshot.slices.values() for h in info.hosts.values()}
    assert alive_tpu_ids <= shown <= tpu_ids
    for info in snapshot.slices.values():
        for host in info.hosts.values():
            assert host.slice_name == info.name


def test_a_host_is_seen_free_only_while_no_owner_is_recorded_for_it() -> None:
    """A free key left beside an owner record (written a moment apart by the agent) must
    not let a reservation skip asking a host whose TPU a process holds."""
    nodes = v6e_4x4()
    ids = [str(n["NodeID"]) for n in nodes]
    snap = build_snapshot(
        nodes,
        idle(nodes),
        tpu_owners={ids[1]: "pid 77 (python train.py)"},
        tpu_seen_free=ids[:2],
    )
    [info] = snap.slices.values()
    seen = {h.node_id: h.tpu_seen_free for h in info.hosts.values()}
    assert seen == {ids[0]: True, ids[1]: False, ids[2]: False, ids[3]: False}


def test_a_read_deletes_the_free_keys_of_dead_nodes_and_no_other(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A dead node's agent died with it, and a node that comes back has a new id: its
    key would stay forever. A live node's key is left alone."""
    nodes = v6e_4x4("v6e-16-gone")
    nodes[1], nodes[2] = killed(nodes[1]), killed(nodes[2])
    ids = [str(n["NodeID"]) for n in nodes]
    store = {f"tpu-free/{ids[0]}": b"1", f"tpu-free/{ids[1]}": b"1"}
    deleted: list[str] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    monkeypatch.setattr(_ray, "available_resources_per_node", lambda: idle(nodes))
    monkeypatch.setattr(_ray, "kv_list", lambda prefix, ns: sorted(store))
    monkeypatch.setattr(_ray, "kv_get_many", lambda keys, ns: {})
    monkeypatch.setattr(_ray, "kv_delete", lambda key, ns, prefix=False: deleted.append(key))
    forget, done = agent.forget_free_keys, threading.Event()

    def forgotten(node_ids: Any) -> None:
        forget(node_ids)
        done.set()

    monkeypatch.setattr("tpuslice._view.cluster.forget_free_keys", forgotten)
    read_snapshot(1)
    assert done.wait(10)  # the deletes run in the background; all of them by now
    assert deleted == [f"tpu-free/{ids[1]}"]
