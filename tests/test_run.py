"""run_on_slice and SliceActorGroup on the simulator: rank order, per-host env, one-shot
release, errors."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import ray
import ray.util.tpu as ray_tpu

import tpuslice
from clusterutil import exit_cleanly, wait_for, where_am_i
from tpuslice._host.context import MEGASCALE_VARS, HostContext
from tpuslice._reserve.reserve import ranks, record_of, worker_groups
from tpuslice._run.run import launch
from tpuslice._tpu.labels import SLICE_NAME_LABEL, WORKER_ID_LABEL
from tpuslice.testing import SimulatedCluster, live_placement_groups, remove_placement_groups

pytestmark = pytest.mark.cluster

V4 = {"topology": "2x2x2", "accelerator_version": "v4"}


@ray.remote
def context() -> dict[str, object]:
    host = tpuslice.current_host()
    return {
        "host": host,
        "TPU_NAME": os.environ["TPU_NAME"],
        "TPU_WORKER_ID": os.environ["TPU_WORKER_ID"],
        "env": {k: v for k, v in os.environ.items() if k.startswith(("TPUSLICE_", "MEGASCALE_"))},
        "pid": os.getpid(),
    }


def test_refs_are_in_rank_order_checked_inside_tasks(tpu_cluster: SimulatedCluster) -> None:
    results = ray.get(tpuslice.run_on_slice(context, topology="4x4", accelerator_version="v6e"))
    assert [r["host"].rank for r in results] == [0, 1, 2, 3]
    assert [r["TPU_WORKER_ID"] for r in results] == ["0", "1", "2", "3"]
    assert [r["host"].worker_id for r in results] == [0, 1, 2, 3]
    assert {r["host"].world_size for r in results} == {4}
    assert {r["TPU_NAME"] for r in results} == {"v6e-16-a"}
    single = results[0]["env"]
    assert not any(k.startswith("MEGASCALE_") for k in single)  # one slice: none set


def test_two_slices_get_megascale_env_and_slice_major_ranks(tpu_cluster: SimulatedCluster) -> None:
    results = ray.get(tpuslice.run_on_slice(context, **V4, num_slices=2))
    hosts = [r["host"] for r in results]
    assert [h.rank for h in hosts] == [0, 1, 2, 3]
    assert [(h.slice_index, h.worker_id) for h in hosts] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [r["TPU_WORKER_ID"] for r in results] == ["0", "1", "0", "1"]
    assert [r["TPU_NAME"] for r in results] == [h.slice_name for h in hosts]
    coordinator = hosts[0].coordinator_address
    for result, host in zip(results, hosts, strict=True):
        assert result["env"]["MEGASCALE_COORDINATOR_ADDRESS"] == coordinator
        assert result["env"]["MEGASCALE_PORT"] == "8081"
        assert result["env"]["MEGASCALE_NUM_SLICES"] == "2"
        assert result["env"]["MEGASCALE_SLICE_ID"] == str(host.slice_index)


@ray.remote(num_cpus=0)
def plant_stale_env() -> int:
    os.environ["MEGASCALE_SLICE_ID"] = "99"
    os.environ["MEGASCALE_NUM_SLICES"] = "7"
    return os.getpid()


def test_stale_megascale_values_never_leak(tpu_cluster: SimulatedCluster) -> None:
    """A warm worker left with stale MEGASCALE_* values (as hand-written code leaves them):
    our tasks (one-shots and resilient attempts run as tasks: ``launch``) overwrite them
    for 2 slices and remove them for 1."""
    with tpuslice.SlicePlacementGroup(**V4, num_slices=2) as spg:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        stale_pids = set(
            ray.get(
                [
                    plant_stale_env.options(
                        scheduling_strategy=PlacementGroupSchedulingStrategy(pg, bundle)
                    ).remote()
                    for pg, bundle in worker_groups(record_of(spg))
                ]
            )
        )
        results = ray.get(launch(context, spg, (), {}))
    reused = [r for r in results if r["pid"] in stale_pids]
    assert reused, "expected at least one warm worker to be reused"
    assert [r["env"]["MEGASCALE_SLICE_ID"] for r in results] == ["0", "0", "1", "1"]
    assert {r["env"]["MEGASCALE_NUM_SLICES"] for r in results} == {"2"}


def test_env_is_restored_after_the_task(tpu_cluster: SimulatedCluster) -> None:
    """Each host's worker sees the same TPUSLICE_/MEGASCALE_ environment after our task as
    before it (including any stale values other code left there)."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    def plain_tasks(spg: tpuslice.SlicePlacementGroup) -> list[dict[str, object]]:
        return ray.get(
            [
                where_am_i.options(
                    scheduling_strategy=PlacementGroupSchedulingStrategy(pg, bundle)
                ).remote()
                for pg, bundle in worker_groups(record_of(spg))
            ]
        )

    with tpuslice.SlicePlacementGroup(**V4) as spg:
        before = {r["pid"]: r["env"] for r in plain_tasks(spg)}
        first = ray.get(launch(context, spg, (), {}))
        after = {r["pid"]: r["env"] for r in plain_tasks(spg)}
    reused = set(before) & set(after) & {r["pid"] for r in first}
    assert reused, "expected warm workers to be reused"
    assert all(r["env"].get("TPUSLICE_RANK") for r in first)  # the context was there
    assert {pid: after[pid] for pid in reused} == {pid: before[pid] for pid in reused}


def test_ten_one_shot_calls_in_a_row_on_one_slice(tpu_cluster: SimulatedCluster) -> None:
    """The cluster has exactly one v6e 4x4: each call must give it back for the next."""
    pids: set[int] = set()
    for i in range(10):
        refs = tpuslice.run_on_slice(
            context, topology="4x4", accelerator_version="v6e", head_reservation_timeout_s=30
        )
        results = ray.get(refs)
        assert [r["host"].rank for r in results] == [0, 1, 2, 3], f"call {i}"
        pids |= {r["pid"] for r in results}
    wait_for(lambda: not live_placement_groups(), timeout=5, what="the last slice released")
    assert len(pids) <= 8, "warm workers are reused, not one fresh process per call"


@ray.remote
def fail_on_rank_one() -> int:
    if tpuslice.current_host().rank == 1:
        raise ValueError("boom on rank 1")
    time.sleep(60)
    return 0


def test_one_shot_failure_releases_the_slice_and_fails_the_rest(
    tpu_cluster: SimulatedCluster,
) -> None:
    start = time.monotonic()
    refs = tpuslice.run_on_slice(fail_on_rank_one, **V4)
    with pytest.raises(ray.exceptions.RayTaskError, match="boom on rank 1"):
        ray.get(refs[1], timeout=30)
    wait_for(lambda: not live_placement_groups(), timeout=10, what="slice released")
    with pytest.raises(ray.exceptions.RayError) as info:
        ray.get(refs[0], timeout=30)
    assert not isinstance(info.value, ray.exceptions.GetTimeoutError)
    assert time.monotonic() - start < 30
    wait_for(lambda: not live_placement_groups(), timeout=5, what="slice released")


@ray.remote(resources={"TPU": 4})
def what_ray_gave() -> dict[str, object]:
    """What Ray gave a task: its node, group, TPU ids, and the TPU variables it set.
    Declared with a whole host's TPU, as code written for Ray 2.60 often is."""
    runtime = ray.get_runtime_context()
    return {
        "node": runtime.get_node_id(),
        "group": runtime.get_placement_group_id(),
        "tpu_ids": sorted(runtime.get_accelerator_ids().get("TPU", [])),
        "tpu_env": {k: v for k, v in os.environ.items() if k.startswith("TPU_")},
    }


def test_a_call_sees_what_ray_2_60s_run_on_slice_shows(tpu_cluster: SimulatedCluster) -> None:
    """Inside a call, Ray shows what it shows under Ray 2.60's ``run_on_slice``: the
    slice's placement group, the bundle's TPU ids, and the host's ``TPU_*`` values, for a
    one-shot and for a call on a held slice alike (what docs/migrating.md says)."""
    hosts = {
        (n["Labels"].get(SLICE_NAME_LABEL), n["Labels"].get(WORKER_ID_LABEL)): n["NodeID"]
        for n in ray.nodes()
        if n["Alive"]
    }

    def by_worker(seen: list[dict[str, object]]) -> dict[object, dict[str, object]]:
        """What each worker id saw; the slice's own name checked apart (the three runs
        may get different slices)."""
        by = {}
        for r in seen:
            env = dict(r["tpu_env"])  # type: ignore[call-overload]
            assert env.pop("TPU_NAME") in {"v4-16-a", "v4-16-b"}
            by[env["TPU_WORKER_ID"]] = {"tpu_ids": r["tpu_ids"], "env": env}
        return by

    one_shot = ray.get(tpuslice.run_on_slice(what_ray_gave, **V4))
    name = next(s for (s, w), node in hosts.items() if node == one_shot[0]["node"])
    assert [r["node"] for r in one_shot] == [hosts[name, "0"], hosts[name, "1"]]
    wait_for(lambda: not live_placement_groups(), timeout=10, what="the slice given back")
    with tpuslice.SlicePlacementGroup(**V4) as spg:
        held = ray.get(tpuslice.run_on_slice(what_ray_gave, tpu_slice=spg))
        assert spg.placement_group is not None
        groups = {spg.placement_group.id.hex()}
    wait_for(lambda: not live_placement_groups(), timeout=10, what="the slice given back")
    ray_spg = ray_tpu.SlicePlacementGroup(**V4)
    try:
        theirs = ray.get(ray_tpu.run_on_slice(what_ray_gave, tpu_slice=ray_spg))
    finally:
        ray_spg.shutdown()
    for ours in (one_shot, held):
        assert all(r["group"] is not None for r in ours)
        assert by_worker(ours) == by_worker(theirs)
    assert {r["group"] for r in held} <= groups
    assert all(r["tpu_ids"] == ["0", "1", "2", "3"] for r in theirs)


@pytest.mark.parametrize("held", [False, True], ids=["one-shot", "held"])
def test_preemptible_work_ends_when_its_groups_are_taken_back(
    tpu_cluster: SimulatedCluster, tmp_path: Path, held: bool
) -> None:
    """The queue takes a preemptible reservation's slices back by removing its groups, so
    preemptible work runs inside its bundles (a one-shot's tasks, a held slice's owners):
    removing the groups, as the queue does when the grace runs out, ends it."""
    spg = tpuslice.SlicePlacementGroup(**V4, preemptible=True) if held else None
    try:
        marker = str(tmp_path / "started")
        refs = (
            tpuslice.run_on_slice(sleeper, marker, tpu_slice=spg)
            if spg is not None
            else tpuslice.run_on_slice(sleeper, marker, **V4, preemptible=True)
        )
        wait_for(lambda: len(list(tmp_path.iterdir())) == 2, timeout=60, what="work started")
        start = time.monotonic()
        assert remove_placement_groups() >= 1
        for ref in refs:
            with pytest.raises(ray.exceptions.RayError) as info:
                ray.get(ref, timeout=30)
            assert not isinstance(info.value, ray.exceptions.GetTimeoutError)
        assert time.monotonic() - start < 30
    finally:
        if spg is not None:
            spg.shutdown()
    wait_for(lambda: not live_placement_groups(), timeout=10, what="nothing left reserved")


@ray.remote
def sleeper(marker: str) -> None:
    Path(f"{marker}.{tpuslice.current_host().rank}").touch()
    time.sleep(120)


def test_shutdown_while_running_resolves_refs_promptly(
    tpu_cluster: SimulatedCluster, tmp_path: Path
) -> None:
    spg = tpuslice.SlicePlacementGroup(**V4)
    refs = tpuslice.run_on_slice(sleeper, str(tmp_path / "started"), tpu_slice=spg)
    wait_for(lambda: len(list(tmp_path.iterdir())) == 2, timeout=60, what="tasks started")
    start = time.monotonic()
    spg.shutdown()
    for ref in refs:
        with pytest.raises(ray.exceptions.RayError):
            ray.get(ref, timeout=20)
    assert time.monotonic() - start < 20


def test_callers_slice_is_never_shut_down(tpu_cluster: SimulatedCluster) -> None:
    with tpuslice.SlicePlacementGroup(**V4) as spg:
        for _ in range(2):
            ray.get(tpuslice.run_on_slice(context, tpu_slice=spg))
        assert not spg.is_shut_down
        assert len(live_placement_groups()) == 1  # the workers, the head in bundle 0


def test_slice_index_runs_on_one_slice(tpu_cluster: SimulatedCluster) -> None:
    with tpuslice.SlicePlacementGroup(**V4, num_slices=2, pg_per_slice=True) as spg:
        results = ray.get(tpuslice.run_on_slice(context, tpu_slice=spg, slice_index=1))
        assert [r["TPU_NAME"] for r in results] == [spg.slice_names[1]] * 2
        with pytest.raises(ValueError, match="Invalid slice_index 2"):
            tpuslice.run_on_slice(context, tpu_slice=spg, slice_index=2)


def test_errors_match_ray(tpu_cluster: SimulatedCluster) -> None:
    with pytest.raises(TypeError, match=r"@ray\.remote"):
        tpuslice.run_on_slice(lambda: 1, **V4)
    with pytest.raises(ValueError, match="topology and accelerator_version are required"):
        tpuslice.run_on_slice(context)
    with pytest.raises(ValueError, match="slice_index can only be used"):
        tpuslice.run_on_slice(context, **V4, slice_index=0)
    spg = tpuslice.SlicePlacementGroup(**V4)
    spg.shutdown()
    with pytest.raises(ValueError, match="already been shut down") as info:
        tpuslice.run_on_slice(context, tpu_slice=spg)
    assert isinstance(info.value, tpuslice.TPUSliceError)
    assert tpuslice.dispatch is tpuslice.run_on_slice


def counter_class() -> type:
    """Defined in a function so Ray pickles it by value (workers cannot import tests)."""

    class Counter:
        def __init__(self, start: int) -> None:
            self.value = start

        def step(self, by: int) -> tuple[int, str, str]:
            self.value += by
            return self.value, os.environ["TPUSLICE_RANK"], os.environ["TPU_WORKER_ID"]

        def megascale(self) -> str:
            return os.environ.get("MEGASCALE_SLICE_ID", "")

    return Counter


def test_actor_group_is_ordered_and_stateful(tpu_cluster: SimulatedCluster) -> None:
    with tpuslice.SliceActorGroup.create(counter_class(), 10, **V4, num_slices=2) as group:
        assert len(group) == 4
        group.get(group.call("step", 1))
        results = group.get(group.call("step", 5))
        assert [r[0] for r in results] == [16] * 4
        assert [r[1] for r in results] == ["0", "1", "2", "3"]
        assert [r[2] for r in results] == ["0", "1", "0", "1"]
        assert group.get(group.call("megascale")) == ["0", "0", "1", "1"]
        with pytest.raises(ValueError, match="no method 'nope'"):
            group.call("nope")
    wait_for(lambda: not live_placement_groups(), timeout=5, what="group released")


def test_actor_group_names_a_dead_host(tpu_cluster: SimulatedCluster) -> None:
    spg = tpuslice.SlicePlacementGroup(**V4, head_reservation_timeout_s=30)
    name = spg.slice_names[0]
    try:
        with tpuslice.SliceActorGroup(counter_class(), spg, 0) as group:
            group.get(group.call("step", 1))
            tpu_cluster.kill_host(name, 1)
            with pytest.raises(tpuslice.HostLostError, match=f"host 1 of slice {name}"):
                group.get(group.call("step", 1), timeout=60)
        tpu_cluster.wait_until_dead(name, 1)
        lost = tpuslice.read_snapshot().slices[name]
        assert lost.state is tpuslice.SliceState.BROKEN and "host 1 dead" in lost.reason
    finally:
        spg.shutdown()
        tpu_cluster.restore_slice(name)
    wait_for(lambda: tpuslice.get_num_ready_tpu_slices("2x2x2", "v4") == 2, timeout=30)


CONTEXT_VARS = {f"TPUSLICE_{name.upper()}" for name in HostContext.__annotations__} | set(
    MEGASCALE_VARS
)


@ray.remote
def env_now() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k in CONTEXT_VARS}


def test_a_held_slices_calls_run_in_one_worker_per_host_with_their_own_context(
    tpu_cluster: SimulatedCluster,
) -> None:
    """On a held slice, Ray gives each rank's calls the same worker, each call sees its
    context, and nothing of it stays in the worker between calls."""
    with tpuslice.SlicePlacementGroup(**V4, num_slices=2) as spg:
        options = [rank.task_options() for rank in ranks(record_of(spg))]
        before = ray.get([env_now.options(**o).remote() for o in options])
        first = ray.get(tpuslice.run_on_slice(context, tpu_slice=spg))
        second = ray.get(tpuslice.run_on_slice(context, tpu_slice=spg))
        assert [r["pid"] for r in first] == [r["pid"] for r in second]
        assert [r["host"].rank for r in second] == [0, 1, 2, 3]
        assert {r["env"]["MEGASCALE_NUM_SLICES"] for r in second} == {"2"}
        after = ray.get([env_now.options(**o).remote() for o in options])
    assert after == before  # nothing of a call's context stays in the worker


EXITING = """
import os, sys, time, ray, tpuslice
ray.init(address=sys.argv[1], log_to_driver=False)
started = sys.argv[2]

@ray.remote
def work(seconds):
    rank = tpuslice.current_host().rank
    open(os.path.join(started, str(rank)), "w").close()
    time.sleep(seconds)
    return rank

print("ranks", ray.get(tpuslice.run_on_slice(work, 0, topology="4x4", accelerator_version="v6e")))
for name in os.listdir(started):
    os.unlink(os.path.join(started, name))
tpuslice.run_on_slice(work, 600, topology="4x4", accelerator_version="v6e")  # never fetched
deadline = time.monotonic() + 60
while len(os.listdir(started)) < 4 and time.monotonic() < deadline:  # every rank running
    time.sleep(0.05)
print("exiting with", len(os.listdir(started)), "ranks running", flush=True)
"""


def test_a_driver_that_exits_with_a_one_shot_running_gives_it_back_and_exits_cleanly(
    tpu_cluster: SimulatedCluster, tmp_path: Path
) -> None:
    """The script exits right after a one-shot whose hand-back may still be in progress,
    and with a second one-shot still running: at exit the releaser stops touching Ray
    before Ray shuts down (else the process dies with Ray's fatal 'core worker has
    already been shutdown'), and the running one is handed back and recorded as
    interrupted."""
    from tpuslice.record import events

    stdout = exit_cleanly(EXITING, tpu_cluster.address, str(tmp_path))
    assert "ranks [0, 1, 2, 3]" in stdout and "exiting with 4 ranks running" in stdout
    wait_for(lambda: not live_placement_groups(), timeout=10, what="both slices given back")
    runs = [e for e in events.read_events(50) if e.kind == "run" and "v6e-16" in str(e.slices)]
    assert [e.outcome for e in runs[-2:]] == ["success", "interrupted"]
