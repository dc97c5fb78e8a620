"""Sub-slice reservations (tpuslice._run.subslices) through the claiming loop, against an
in-memory cluster: picking idle sub-slices by physical layout, busy hosts, discovery only
of wholly idle slices and only once (again after a host is replaced), layout records read
back by another driver, the sub-slice's own environment. Pure: no Ray."""

from __future__ import annotations

import json
import os
import random
from typing import Any

import pytest

from tpuslice._host.context import with_context
from tpuslice._reserve import claim
from tpuslice._reserve.request import SliceRequest
from tpuslice._run import layout_records
from tpuslice._run.subslices import SubSlices
from tpuslice._tpu import keys, subslice
from tpuslice._tpu.clock import Clock
from tpuslice._tpu.subslice import subslice_env
from tpuslice._tpu.topology import slice_shape
from tpuslice._view import layouts
from tpuslice._view.cluster import SliceInfo
from tpuslice._view.layouts import Layout, positions_from_coordinates
from tpuslice.errors import (
    DiscoveryFailedError,
    InsufficientSlicesError,
    InvalidArgumentError,
    ReservationTimeoutError,
)
from tpuslice.testing.memory import NODE_ID_LABEL, InMemoryCluster, MemoryNode


class Layouts:
    """Stands in for discovery and the KV records: a fixed physical layout per slice,
    learned on first discovery and counted."""

    def __init__(self, physical: dict[str, dict[int, int]]) -> None:
        self.physical = physical
        self.recorded: dict[str, Layout] = {}
        self.discovered: list[str] = []

    def discover(self, info: SliceInfo, request: SliceRequest) -> Layout:
        assert info.state.value == "ready", "discovery only of a wholly idle slice"
        self.discovered.append(info.name)
        nodes = {w: h.node_id for w, h in info.hosts.items()}
        self.recorded[info.name] = Layout(info.name, info.topology, self.physical[info.name], nodes)
        return self.recorded[info.name]

    def load(self, info: SliceInfo) -> Layout | None:
        found = self.recorded.get(info.name)
        return found if found is not None and found.current_for(info) else None


class RecordedLayouts(Layouts):
    """As :class:`Layouts`, but each layout learned is recorded, and read back, by
    tpuslice's own records (:mod:`tpuslice._run.layout_records`) in a :class:`Store`."""

    def discover(self, info: SliceInfo, request: SliceRequest) -> Layout:
        learned = super().discover(info, request)
        layout_records.save(learned)
        return learned

    def load(self, info: SliceInfo) -> Layout | None:
        return layout_records.load(info)


class Store:
    """Stands in for Ray's KV store where the layout records live; the test's connection
    starts with no copy of any layout."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.data: dict[tuple[str, str | None], bytes] = {}
        self.asked: list[tuple[list[str], str | None]] = []  # each kv_get_many: keys, namespace
        monkeypatch.setattr(layouts._ray, "kv_get", lambda k, ns: self.data.get((k, ns)))
        monkeypatch.setattr(layouts._ray, "kv_get_many", self.get_many)
        monkeypatch.setattr(layouts._ray, "kv_put", self.put)

    def get_many(self, wanted: list[str], namespace: str | None) -> dict[str, bytes]:
        self.asked.append((list(wanted), namespace))
        return {k: self.data[k, namespace] for k in wanted if (k, namespace) in self.data}

    def put(self, key: str, value: bytes, namespace: str | None) -> None:
        self.data[key, namespace] = value

    def record(self, slice_name: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(
            self.data[keys.LAYOUT_KEY_PREFIX + slice_name, keys.NAMESPACE]
        )
        return found


def replace_host(cluster: InMemoryCluster, slice_name: str, worker_id: int) -> str:
    """The host dies and a new VM takes its place: the same labels, a new node id."""
    cluster.kill_host(slice_name, worker_id)
    old = cluster.nodes[cluster.slice_hosts[slice_name][worker_id]]
    node_id = f"{old.node_id}-new"
    labels = {**old.labels, NODE_ID_LABEL: node_id}
    cluster.nodes[node_id] = MemoryNode(node_id, labels, dict(old.resources))
    cluster.slice_hosts[slice_name][worker_id] = node_id
    return node_id


def scrambled(hosts: int, seed: int) -> dict[int, int]:
    positions = list(range(hosts))
    random.Random(seed).shuffle(positions)
    return dict(enumerate(positions))


def reserve(
    cluster: InMemoryCluster, known: Layouts, topology: str = "2x4", **request: Any
) -> tuple[claim.Reservation, SubSlices]:
    req = SliceRequest(
        topology=topology,
        accelerator_version=request.pop("accelerator_version", "v6e"),
        subslice=True,
        strategy="STRICT_SPREAD",
        **request,
    )
    targets = SubSlices(req, cluster, known.discover, known.load, cluster.clock.now)
    clock = Clock(cluster.clock.now, cluster.clock.sleep, cluster.clock.stamp)
    reserver = claim.Reserver(req, clock=clock, ops=cluster, targets=targets)
    return reserver.run(), targets


def workers(reservation: claim.Reservation) -> list[int]:
    return [h.worker_id for h in reservation.claims[0].target.hosts.values()]  # type: ignore[misc]


def test_a_sub_slice_is_picked_by_physical_layout_with_ranks_in_physical_order() -> None:
    cluster = InMemoryCluster([("v6e", "4x4")])
    layout = {0: 3, 1: 0, 2: 2, 3: 1}  # worker -> physical position
    known = Layouts({"v6e-16-0": layout})
    reservation, targets = reserve(cluster, known)
    assert workers(reservation) == [1, 3]  # positions 0 and 1: the first row of the grid
    assert targets.placement(reservation.claims[0].target) == ("4x4", 0)
    assert known.discovered == ["v6e-16-0"]
    assert reservation.claims[0].head_pg is None  # a sub-slice takes no head claim
    nodes = [cluster.bundle_node(reservation.combined_pg, i) for i in range(2)]  # type: ignore[arg-type]
    assert nodes == ["v6e-16-0/1", "v6e-16-0/3"]


def test_two_sub_slices_of_one_slice_are_held_at_once_without_overlap() -> None:
    cluster = InMemoryCluster([("v6e", "4x4")])
    known = Layouts({"v6e-16-0": scrambled(4, 1)})
    first, _ = reserve(cluster, known)
    second, _ = reserve(cluster, known)
    assert set(workers(first)).isdisjoint(workers(second))
    assert sorted(workers(first) + workers(second)) == [0, 1, 2, 3]
    assert known.discovered == ["v6e-16-0"]  # learned once, reused
    with pytest.raises(ReservationTimeoutError, match="v6e-16-0: 2 of 2 busy"):
        reserve(cluster, known, head_reservation_timeout_s=1.0)


def test_a_busy_host_blocks_only_its_own_sub_slice() -> None:
    """One host of 4x4 sub-slice #3 of an 8x8 is busy: the other three are taken, #3 not."""
    cluster = InMemoryCluster([("v6e", "8x8")])
    layout = scrambled(16, 2)
    known = Layouts({"v6e-64-0": layout})
    first, _ = reserve(cluster, known, topology="4x4")  # learns the layout while idle
    cluster.remove_group(first.combined_pg)
    busy = next(w for w, p in layout.items() if p == 15)  # the last position: in #3
    cluster.take("v6e-64-0", busy, {"TPU": 1})
    indices = []
    for _ in range(3):
        reservation, targets = reserve(cluster, known, topology="4x4")
        indices.append(targets.placement(reservation.claims[0].target)[1])
    assert sorted(indices) == [0, 1, 2]
    with pytest.raises(ReservationTimeoutError, match="v6e-64-0: 4 of 4 busy"):
        reserve(cluster, known, topology="4x4", head_reservation_timeout_s=1.0)


def test_discovery_waits_for_the_whole_slice_to_be_idle() -> None:
    """No layout known and one host busy: no discovery (that would take the whole
    slice); the reservation waits and says why."""
    cluster = InMemoryCluster([("v6e", "4x4")])
    known = Layouts({"v6e-16-0": scrambled(4, 3)})
    other = cluster.take("v6e-16-0", 2, {"TPU": 4})
    with pytest.raises(ReservationTimeoutError, match="v6e-16-0: layout not known yet"):
        reserve(cluster, known, head_reservation_timeout_s=2.0)
    assert known.discovered == []
    cluster.remove_group(other)
    reservation, _ = reserve(cluster, known)
    assert known.discovered == ["v6e-16-0"] and len(workers(reservation)) == 2


def test_a_layout_learned_on_hosts_since_replaced_is_learned_again() -> None:
    cluster = InMemoryCluster([("v6e", "4x4")])
    known = Layouts({"v6e-16-0": scrambled(4, 4)})
    held, _ = reserve(cluster, known)
    cluster.remove_group(held.combined_pg)
    info = cluster.snapshot(1).slices["v6e-16-0"]
    stale = known.recorded["v6e-16-0"]
    moved = {w: f"new-{n}" for w, n in (stale.nodes or {}).items()}
    assert not Layout(stale.slice_name, stale.topology, stale.physical, moved).current_for(info)
    assert stale.current_for(info)


def test_a_slice_whose_host_was_replaced_is_learned_again_before_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Learned once and reused while its hosts live; after a host is replaced (same
    name, new node) neither this process's copy nor the record describes the slice, so
    the next reservation learns it again, on the new node."""
    store = Store(monkeypatch)
    cluster = InMemoryCluster([("v6e", "4x4")])
    known = RecordedLayouts({"v6e-16-0": scrambled(4, 4)})
    for _ in range(2):
        held, _ = reserve(cluster, known)
        cluster.remove_group(held.combined_pg)
    assert known.discovered == ["v6e-16-0"]
    new_node = replace_host(cluster, "v6e-16-0", 2)
    reservation, _ = reserve(cluster, known)
    assert known.discovered == ["v6e-16-0", "v6e-16-0"]
    assert store.record("v6e-16-0")["nodes"]["2"] == new_node
    assert len(workers(reservation)) == 2


def test_a_layout_another_driver_recorded_is_read_not_learned_until_a_host_is_replaced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A driver that never learned the slice reads the record another one wrote (its
    own and Ray's); once a host is replaced, that record is not used, and nor is Ray's
    (it names no nodes)."""
    Store(monkeypatch)
    cluster = InMemoryCluster([("v6e", "4x4")])
    info = cluster.snapshot(1).slices["v6e-16-0"]
    nodes = {w: h.node_id for w, h in info.hosts.items()}
    learned = Layout("v6e-16-0", "4x4", scrambled(4, 9), nodes)
    layout_records.save(learned)  # by the other driver
    layouts.forget("v6e-16-0")  # this one has no copy
    assert layout_records.load(info) == learned
    replace_host(cluster, "v6e-16-0", 1)
    assert layout_records.load(cluster.snapshot(1).slices["v6e-16-0"]) is None


def test_subslice_index_picks_that_sub_slice_and_out_of_range_fails_at_once() -> None:
    cluster = InMemoryCluster([("v6e", "4x4")])
    known = Layouts({"v6e-16-0": {0: 0, 1: 1, 2: 2, 3: 3}})
    reservation, _ = reserve(cluster, known, topology="2x2", subslice_index=2)
    assert workers(reservation) == [2]
    with pytest.raises(InsufficientSlicesError, match="subslice_index 7 is out of range"):
        reserve(cluster, known, topology="2x2", subslice_index=7)


def test_no_slice_that_can_hold_it_fails_at_once_and_points_at_slice_placement_group() -> None:
    cluster = InMemoryCluster([("v6e", "2x4", 2)])  # single-host 2x4s: no sub-slices
    known = Layouts({})
    with pytest.raises(InsufficientSlicesError, match="use slice_placement_group"):
        reserve(cluster, known, topology="2x2")


def test_a_3d_sub_slice_of_a_v4_slice() -> None:
    cluster = InMemoryCluster([("v4", "2x2x4")])
    layout = scrambled(4, 5)
    known = Layouts({"v4-32-0": layout})
    reservation, _ = reserve(cluster, known, topology="2x2x2", accelerator_version="v4")
    got = workers(reservation)
    assert sorted(layout[w] for w in got) in ([0, 1], [2, 3])
    assert [layout[w] for w in got] == sorted(layout[w] for w in got)  # physical order


@pytest.mark.parametrize(
    ("topology", "generation", "bounds", "pod_type"),
    [("2x4", "v6e", "1,2,1", "v6e-8"), ("2x2x2", "v4", "1,1,2", "v4-16")],
)
def test_the_sub_slice_environment(
    topology: str, generation: str, bounds: str, pod_type: str
) -> None:
    shape = slice_shape(topology, generation, 4)
    env = subslice_env(shape, ["10.0.0.7", "10.0.0.9"], 1)
    assert env["TPU_WORKER_ID"] == env["CLOUD_TPU_TASK_ID"] == "1"
    assert env["TPU_WORKER_HOSTNAMES"] == "10.0.0.7,10.0.0.9"
    assert env["TPU_ACCELERATOR_TYPE"] == pod_type and env["TPU_TOPOLOGY"] == topology
    assert env["TPU_HOST_BOUNDS"] == env["TPU_PROCESS_BOUNDS"] == bounds
    assert env["TPU_CHIPS_PER_HOST_BOUNDS"] == env["TPU_CHIPS_PER_PROCESS_BOUNDS"] == "2,2,1"
    assert env["TPU_SKIP_MDS_QUERY"] == "true" and env["TPU_PROCESS_ADDRESSES"] is None
    assert (
        subslice.worker_dims(topology)
        == tuple(int(b) for b in bounds.split(","))[: len(subslice.worker_dims(topology))]
    )


def test_jax_reads_the_sub_slice_from_the_call_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a host of the parent (its worker 3 of 4, run multi-process, so
    ``TPU_PROCESS_ADDRESSES`` names the parent's processes), a call with the sub-slice's
    environment gives JAX's own TPU cluster detection the sub-slice: its two hosts and
    this host's place among them; the host's values are back after the call."""
    pytest.importorskip("jax")
    from jax._src.clusters.cloud_tpu_cluster import GkeTpuCluster

    parent = {
        "TPU_WORKER_HOSTNAMES": "10.0.0.1,10.0.0.2,10.0.0.3,10.0.0.4",
        "TPU_WORKER_ID": "3",
        "TPU_PROCESS_ADDRESSES": "10.0.0.1:8476,10.0.0.2:8476,10.0.0.3:8476,10.0.0.4:8476",
    }
    for key, value in parent.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("TPU_SKIP_MDS_QUERY", raising=False)

    def seen() -> tuple[list[str], int, str | None]:
        return (
            GkeTpuCluster._get_worker_list_in_slice(),
            GkeTpuCluster._get_process_id_in_slice(),
            os.environ.get("TPU_SKIP_MDS_QUERY"),
        )

    env = subslice_env(slice_shape("2x4", "v6e", 4), ["10.0.0.2", "10.0.0.4"], 1)
    assert with_context(seen)(env) == (["10.0.0.2", "10.0.0.4"], 1, "true")
    assert {k: os.environ.get(k) for k in parent} == parent
    assert "TPU_SKIP_MDS_QUERY" not in os.environ


def test_a_layout_that_does_not_fit_is_not_used(caplog: pytest.LogCaptureFixture) -> None:
    """Two hosts reporting one place (Ray 2.60 would store labels giving a sub-slice the
    wrong number of hosts): nothing is stored, the slice is skipped, another is used,
    and a timeout names the slice that could not be learned."""
    with pytest.raises(DiscoveryFailedError, match="two workers at one place"):
        positions_from_coordinates({0: [[0, 0]], 1: [[1, 0]], 2: [[0, 0]], 3: [[2, 2]]}, "4x4")

    cluster = InMemoryCluster([("v6e", "4x4", 2)])
    known = Layouts({"v6e-16-1": scrambled(4, 6)})
    real = known.discover

    def discover(info: SliceInfo, request: SliceRequest) -> Layout:
        if info.name == "v6e-16-0":
            raise DiscoveryFailedError("chip coordinates put two workers at one place")
        return real(info, request)

    known.discover = discover  # type: ignore[method-assign]
    reservation, _ = reserve(cluster, known)
    assert reservation.claims[0].target.name == "v6e-16-1"
    assert "v6e-16-0" not in known.recorded and "could not learn the layout" in caplog.text
    with pytest.raises(ReservationTimeoutError, match="v6e-16-0: its layout could not be"):
        reserve(cluster, known, head_reservation_timeout_s=1.0, subslice_index=0)


def test_a_layout_that_failed_to_be_learned_is_tried_again_later() -> None:
    """A passing failure (someone took part of the slice while it was being learned)
    does not rule the slice out: it is tried again after RELEARN_S."""
    cluster = InMemoryCluster([("v6e", "4x4")])
    known = Layouts({"v6e-16-0": scrambled(4, 8)})
    real, calls = known.discover, []

    def flaky(info: SliceInfo, request: SliceRequest) -> Layout:
        calls.append(request.head_reservation_timeout_s)
        if len(calls) == 1:
            raise DiscoveryFailedError("could not reserve v6e-16-0 whole in time")
        return real(info, request)

    known.discover = flaky  # type: ignore[method-assign]
    reservation, _ = reserve(cluster, known, head_reservation_timeout_s=20.0)
    assert len(calls) == 2 and len(workers(reservation)) == 2
    assert calls[0] is not None and calls[0] <= 20.0  # learning is bounded by the caller's


def test_no_slice_that_can_hold_it_fails_at_once_even_where_the_cluster_can_grow() -> None:
    """New slices of the sub-slice's own shape would not help, so a cluster with an
    autoscaler does not make it wait (Ray raises at once too)."""
    cluster = InMemoryCluster([("v6e", "2x4", 2)], can_grow=True)
    with pytest.raises(InsufficientSlicesError, match="no slice can hold a v6e 2x2"):
        reserve(cluster, Layouts({}), topology="2x2")
    assert cluster.clock.now() == 0.0


def test_several_bundles_per_host_say_how_to_ask_for_a_sub_slice() -> None:
    with pytest.raises(InvalidArgumentError, match=r"one bundle per host: give each bundle"):
        SliceRequest(
            topology="2x4",
            accelerator_version="v6e",
            subslice=True,
            strategy="STRICT_SPREAD",
            resources_per_bundle={"TPU": 2},
        )


def test_every_slices_layout_is_read_at_once_ours_first_then_rays_and_kept_when_learned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``load_all`` (status, the web view): one read per namespace for the slices this
    process has no copy of; our record first, Ray's where ours is missing or unreadable;
    a learned layout (it names nodes) is kept and not read again."""
    store = Store(monkeypatch)
    cluster = InMemoryCluster([("v6e", "4x4", 3)])
    snapshot = cluster.snapshot(1)
    a, b = snapshot.slices["v6e-16-0"], snapshot.slices["v6e-16-1"]
    learned = Layout(a.name, "4x4", scrambled(4, 1), {w: h.node_id for w, h in a.hosts.items()})
    layout_records.save(learned)  # by another driver: our record and Ray's
    layouts.forget(a.name)
    from_ray = Layout(b.name, "4x4", scrambled(4, 2), None)
    ray_key = subslice.kv_key(b.name).decode()
    store.put(ray_key, json.dumps(from_ray.ray_labels()).encode(), keys.RAY_SUBSLICE_NAMESPACE)
    store.put(keys.LAYOUT_KEY_PREFIX + b.name, b"not json", keys.NAMESPACE)  # Ray's is used
    expected = {a.name: dict(learned.physical), b.name: dict(from_ray.physical)}
    assert layouts.load_all(snapshot) == expected  # v6e-16-2: never learned
    assert [ns for _, ns in store.asked] == [keys.NAMESPACE, keys.RAY_SUBSLICE_NAMESPACE]
    assert layouts.load_all(snapshot) == expected
    again = [k for wanted, _ in store.asked[2:] for k in wanted]
    assert len(store.asked) == 4 and not any(a.name in k for k in again)  # a was kept
    assert any(b.name in k for k in again)  # a layout from Ray's record names no nodes
