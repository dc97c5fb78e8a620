"""SlicePlacementGroup on the simulator: whole idle slices only, N at once, bundle i is
worker i, clean timeouts and failures, nothing left behind."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

import tpuslice
from clusterutil import hold_host, wait_for, where_am_i
from tpuslice._reserve.reserve import record_of, worker_groups
from tpuslice.testing import SimulatedCluster, live_placement_groups

pytestmark = pytest.mark.cluster

V4 = {"topology": "2x2x2", "accelerator_version": "v4"}
V4_SLICES = ["v4-16-a", "v4-16-b"]


def run_everywhere(spg: tpuslice.SlicePlacementGroup) -> list[dict[str, object]]:
    """One raw task per bundle, in bundle order (not through run_on_slice)."""
    tpu = spg.bundle_resources["TPU"]
    refs = [
        where_am_i.options(
            resources={"TPU": tpu},
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, bundle),
        ).remote()
        for pg, bundle in worker_groups(record_of(spg))
    ]
    return ray.get(refs, timeout=60)


@ray.remote(num_cpus=0)
def read_in_a_task(spg: tpuslice.SlicePlacementGroup) -> tuple[list[str], int, bool]:
    """What a copy of the handle sent to a task reads there."""
    return spg.slice_names, spg.num_hosts, spg.is_shut_down


def test_reserve_ready_shutdown(tpu_cluster: SimulatedCluster) -> None:
    spg = tpuslice.SlicePlacementGroup(**V4)
    try:
        # A copy sent to a task reads the same reservation; it is the same handle.
        assert ray.get(read_in_a_task.remote(spg), timeout=60) == (spg.slice_names, 2, False)
        assert ray.get(ray.put(spg)) == spg
        assert spg.slice_names[0] in V4_SLICES
        assert spg.num_hosts == 2 and spg.num_bundles == 2 and spg.chips_per_host == 4
        assert spg.wait_ready(timeout=10)
        # The head is claimed by bundle 0 of the worker group, not by a group of its own.
        assert spg.head_placement_groups == []
        assert spg.bundle_resources == {"CPU": 1, "TPU": 4}
        info = tpuslice.read_snapshot().slices[spg.slice_names[0]]
        assert info.state is tpuslice.SliceState.BUSY
        assert info.hosts[0].head_free is False
    finally:
        spg.shutdown()
    spg.shutdown()  # idempotent
    assert spg.is_shut_down
    assert ray.get(read_in_a_task.remote(spg), timeout=60) == ([], 2, True)  # asks Ray
    with pytest.raises(tpuslice.SliceShutdownError):
        worker_groups(record_of(spg))


def test_context_manager_gives_the_slice_back(tpu_cluster: SimulatedCluster) -> None:
    with tpuslice.slice_placement_group("4x4", "v6e") as spg:
        assert spg.slice_names == ["v6e-16-a"]
        (group,) = live_placement_groups()  # one group: the head is in bundle 0
        assert group["bundles"][0]["TPU-v6e-16-head"] == 1
    wait_for(lambda: not live_placement_groups(), what="groups removed")


def test_bundle_i_is_tpu_worker_i(tpu_cluster: SimulatedCluster) -> None:
    with tpuslice.SlicePlacementGroup("4x4", "v6e") as spg:
        seen = run_everywhere(spg)
    assert [s["TPU_WORKER_ID"] for s in seen] == ["0", "1", "2", "3"]
    assert {s["TPU_NAME"] for s in seen} == {"v6e-16-a"}


def test_split_hosts_keep_consecutive_bundles_on_one_host(tpu_cluster: SimulatedCluster) -> None:
    with tpuslice.SlicePlacementGroup(**V4, resources_per_bundle={"TPU": 2}) as spg:
        assert spg.num_bundles == 4
        seen = run_everywhere(spg)
    assert [s["TPU_WORKER_ID"] for s in seen] == ["0", "0", "1", "1"]


def test_busy_slice_is_never_chosen(tpu_cluster: SimulatedCluster) -> None:
    """One of two v4 slices, the first in order, has one busy host (not worker 0):
    always the idle one."""
    with hold_host("v4-16-a", 1):
        wait_for(lambda: tpuslice.get_num_ready_tpu_slices("2x2x2", "v4") == 1)
        for _ in range(6):
            with tpuslice.SlicePlacementGroup(**V4, head_reservation_timeout_s=20) as spg:
                assert spg.slice_names == ["v4-16-b"]
            wait_for(lambda: tpuslice.get_num_ready_tpu_slices("2x2x2", "v4") == 1)


@pytest.mark.parametrize("count", [1, 2])
def test_n_slices_at_once(tpu_cluster: SimulatedCluster, count: int) -> None:
    with tpuslice.SlicePlacementGroup(**V4, num_slices=count) as spg:
        assert len(set(spg.slice_names)) == count
        assert spg.num_hosts == 2 * count
        seen = run_everywhere(spg)
    names = [s["TPU_NAME"] for s in seen]
    expected = [name for name in spg_names_of(names) for _ in range(2)]
    assert names == expected  # slice-major
    assert [s["TPU_WORKER_ID"] for s in seen] == ["0", "1"] * count


def spg_names_of(names: list[object]) -> list[object]:
    return list(dict.fromkeys(names))


def test_pg_per_slice(tpu_cluster: SimulatedCluster) -> None:
    with tpuslice.SlicePlacementGroup(**V4, num_slices=2, pg_per_slice=True) as spg:
        assert len(spg.slice_placement_groups) == 2
        with pytest.raises(ValueError, match="slice_placement_groups"):
            _ = spg.slice_placement_group
        seen = run_everywhere(spg)
        spg.release_head_pgs(slice_index=0)
        spg.release_head_pgs()
        assert spg.head_placement_groups == []
        with pytest.raises(ValueError, match="Invalid slice_index"):
            spg.release_head_pgs(slice_index=2)
        # Each slice's head stays claimed by bundle 0 of its group until the shutdown.
        slices = tpuslice.read_snapshot().slices
        assert [slices[name].hosts[0].head_free for name in spg.slice_names] == [False] * 2
    assert [s["TPU_WORKER_ID"] for s in seen] == ["0", "1", "0", "1"]


def test_chips_per_vm_picks_the_two_vm_form(tpu_cluster: SimulatedCluster) -> None:
    with tpuslice.SlicePlacementGroup("2x4", "v6e", chips_per_vm=4) as spg:
        assert spg.num_hosts == 2
        seen = run_everywhere(spg)
    assert [(s["TPU_NAME"], s["TPU_WORKER_ID"]) for s in seen] == [
        ("v6e-8-b", "0"),
        ("v6e-8-b", "1"),
    ]
    with tpuslice.SlicePlacementGroup("2x4", "v6e") as spg:
        assert spg.slice_names == ["v6e-8-a"]  # the single 8-chip VM, no head claim
        assert spg.head_placement_groups == []
        assert spg.bundle_resources["TPU"] == 8


def test_tpu_resource_per_chip(tpu_cluster: SimulatedCluster) -> None:
    name = tpu_cluster.add_slice("v7x", "2x2x1", tpu_resource_per_chip=2)
    try:
        with tpuslice.SlicePlacementGroup("2x2x1", "v7x", tpu_resource_per_chip=2) as spg:
            assert spg.slice_names == [name]
            assert spg.devices_per_host == 8 and spg.chips_per_host == 4
            assert spg.bundle_resources["TPU"] == 8
    finally:
        tpu_cluster.remove_slice(name)
    tpu_cluster.wait_until_dead(name, 0)  # gone from Ray's view, as a scaled-down slice


def test_user_label_selectors_merge_and_pin(tpu_cluster: SimulatedCluster) -> None:
    selectors = [
        {"ray.io/tpu-slice-name": "v4-16-b", "ray.io/accelerator-type": "TPU-V4"},
        {"ray.io/accelerator-type": "TPU-V4"},
    ]
    with tpuslice.SlicePlacementGroup(**V4, bundle_label_selector=selectors) as spg:
        assert spg.slice_names == ["v4-16-b"]
        assert spg.bundle_label_selector[1] == {
            "ray.io/accelerator-type": "TPU-V4",
            "ray.io/tpu-slice-name": "v4-16-b",
            "ray.io/tpu-worker-id": "1",
        }
    with pytest.raises(ValueError, match="one selector per bundle"):
        tpuslice.SlicePlacementGroup(**V4, bundle_label_selector=selectors[:1])


def test_all_busy_times_out_cleanly_with_an_explanation(tpu_cluster: SimulatedCluster) -> None:
    with hold_host("v6e-16-a", 2, tpu=4):
        start = time.monotonic()
        with pytest.raises(TimeoutError) as info:
            tpuslice.SlicePlacementGroup("4x4", "v6e", head_reservation_timeout_s=1.5)
        elapsed = time.monotonic() - start
    assert isinstance(info.value, tpuslice.ReservationTimeoutError)
    assert 1.5 <= elapsed < 2.5
    message = str(info.value)
    assert "no idle v6e 4x4 slice" in message
    assert "v6e-16-a: 1/4 hosts in use" in message


def test_impossible_request_fails_at_once(tpu_cluster: SimulatedCluster) -> None:
    start = time.monotonic()
    with pytest.raises(tpuslice.InsufficientSlicesError, match="no v6e-32 4x8 slice"):
        tpuslice.SlicePlacementGroup("4x8", "v6e")
    with pytest.raises(tpuslice.InsufficientSlicesError, match="asked for 3, the cluster has 2"):
        tpuslice.SlicePlacementGroup(**V4, num_slices=3)
    assert time.monotonic() - start < 2.0


def queued_here() -> bool:
    """Whether a request of this process waits in the cluster-wide queue."""
    mine = f"pid {os.getpid()} "
    return any(r.who.startswith(mine) for r in tpuslice.read_snapshot().queued())


def test_ctrl_c_while_waiting_removes_everything(tpu_cluster: SimulatedCluster) -> None:
    """Two slices asked, one idle: we wait in the queue holding nothing; SIGINT takes the
    ticket out and leaves no group behind."""
    with hold_host("v4-16-a", 1):
        before = {pg["placement_group_id"] for pg in live_placement_groups()}

        def interrupt_once_queued() -> None:
            wait_for(queued_here, what="our ticket in the queue")
            assert {pg["placement_group_id"] for pg in live_placement_groups()} == before
            os.kill(os.getpid(), signal.SIGINT)

        thread = threading.Thread(target=interrupt_once_queued)
        thread.start()
        with pytest.raises(KeyboardInterrupt):
            tpuslice.SlicePlacementGroup(**V4, num_slices=2, head_reservation_timeout_s=60)
        thread.join()
        after = {pg["placement_group_id"] for pg in live_placement_groups()}
        assert after == before
        wait_for(lambda: not queued_here(), what="our ticket to leave")


def test_threads_racing_for_fewer_slices(tpu_cluster: SimulatedCluster) -> None:
    """Six threads, two slices: nobody shares a slice, everybody gets one in the end."""
    held: dict[str, int] = {}
    lock = threading.Lock()
    overlaps: list[str] = []
    got: list[str] = []

    def worker() -> None:
        with tpuslice.SlicePlacementGroup(**V4, head_reservation_timeout_s=60) as spg:
            name = spg.slice_names[0]
            with lock:
                held[name] = held.get(name, 0) + 1
                if held[name] > 1:
                    overlaps.append(name)
                got.append(name)
            time.sleep(0.3)  # hold the slice for a while (work, not synchronisation)
            with lock:
                held[name] -= 1

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    assert overlaps == []
    assert len(got) == 6
    assert set(got) <= set(V4_SLICES)


def test_reserve_tpu_slice_claims_an_idle_head(tpu_cluster: SimulatedCluster) -> None:
    with hold_host("v4-16-a", 1):
        name, head = tpuslice.reserve_tpu_slice("2x2x2", "TPU-V4", timeout_s=10)
        try:
            assert name in V4_SLICES and name != "v4-16-a"
        finally:
            ray.util.remove_placement_group(head)


def test_a_waiting_request_shows_the_autoscaler_its_demand_and_adopts_the_new_slice(
    tpu_cluster: SimulatedCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a cluster that can grow, a request for a shape it lacks waits with a pending
    head claim (the autoscaler's signal) and takes the slice that arrives. Then, with
    that slice busy (its TPUs held) and its head resource free, the next request's claim
    stays pending for the autoscaler rather than landing on it (``!in(...)``)."""
    monkeypatch.setenv("TPUSLICE_CLUSTER_CAN_GROW", "1")
    got: dict[str, object] = {}
    errors: list[BaseException] = []

    def adopt() -> None:  # in a thread: the simulator must add nodes from the main one
        try:
            with tpuslice.SlicePlacementGroup("2x2x1", "v4", head_reservation_timeout_s=90) as spg:
                got["names"] = spg.slice_names
                got["hosts"] = [s["TPU_NAME"] for s in run_everywhere(spg)]
        except tpuslice.TPUSliceError as exc:
            got["error"] = exc

    def wait_beside_a_busy_slice() -> None:
        try:
            tpuslice.SlicePlacementGroup("2x2x1", "v4", head_reservation_timeout_s=4)
        except tpuslice.ReservationTimeoutError as exc:
            errors.append(exc)

    def demand_states() -> list[str]:
        return [
            pg["state"]
            for pg in live_placement_groups()
            if {"TPU-v4-8-head": 1.0} in pg["bundles"].values()
        ]

    thread = threading.Thread(target=adopt)
    thread.start()
    name = None
    try:
        wait_for(lambda: "PENDING" in demand_states(), timeout=30, what="a pending head claim")
        name = tpu_cluster.add_slice("v4", "2x2x1")
        thread.join(timeout=90)
        assert got == {"names": [name], "hosts": [name]}
        with hold_host(name, 0, tpu=4):
            thread = threading.Thread(target=wait_beside_a_busy_slice)
            thread.start()
            wait_for(lambda: "PENDING" in demand_states(), timeout=30, what="pending demand")
            seen: set[str] = set()
            while thread.is_alive():  # the whole wait: bounded by the 4 s timeout
                seen |= set(demand_states())
                time.sleep(0.05)
            thread.join()
    finally:
        thread.join(timeout=90)
        if name:
            tpu_cluster.remove_slice(name)
    assert seen <= {"PENDING"}, f"the demand claim was placed on the busy slice: {seen}"
    assert len(errors) == 1 and "1 busy" in str(errors[0])
