"""SimulatedCluster: hosts look like real TPU VMs to Ray (and to Ray's own TPU code);
faults are real; shutdown leaves nothing behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import ray
import ray.util.tpu as ray_tpu
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

import tpuslice
from clusterutil import exported_metrics, wait_for, where_am_i
from tpuslice._tpu.labels import HOST_ENV_VARS
from tpuslice.testing import (
    SimulatedCluster,
    SimulatorError,
    remove_placement_groups,
)

pytestmark = pytest.mark.cluster


def test_every_host_has_labels_resources_and_env(tpu_cluster: SimulatedCluster) -> None:
    nodes = {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}
    hosts = [(name, s.shape, host) for name, s in tpu_cluster.slices.items() for host in s.hosts]
    refs = [  # one task per host, all at once: each host starts a worker of its own
        where_am_i.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(host.node.node_id, soft=False)
        ).remote()
        for _, _, host in hosts
    ]
    for (name, shape, host), seen in zip(hosts, ray.get(refs, timeout=120), strict=True):
        node_id = host.node.node_id
        assert seen["TPU_NAME"] == name
        assert seen["TPU_WORKER_ID"] == str(host.worker_id)
        assert seen["TPU_ACCELERATOR_TYPE"] == shape.pod_type
        assert seen["TPU_TOPOLOGY"] == shape.topology
        labels = nodes[node_id]["Labels"]
        assert labels["ray.io/tpu-slice-name"] == name
        assert labels["ray.io/tpu-worker-id"] == str(host.worker_id)
        assert labels["ray.io/tpu-pod-type"] == shape.pod_type
        assert labels["ray.io/tpu-topology"] == shape.topology
        assert labels["ray.io/accelerator-type"] == shape.accelerator_type
        resources = nodes[node_id]["Resources"]
        assert resources["TPU"] == shape.chips_per_host
        assert resources[name] == 1
        assert (shape.head_resource in resources) == (host.worker_id == 0)


def test_tpu_hosts_run_rays_minimal_agent_and_the_head_the_full_one(
    tpu_cluster: SimulatedCluster,
) -> None:
    """The head's agent exports metrics (the drivers' and the queue actor's); the hosts'
    agents are Ray's minimal ones, which export none and cost less while idle."""
    exporting = {node: "ray_" in (text or "") for node, text in exported_metrics().items()}
    hosts = {h.node.node_id for s in tpu_cluster.slices.values() for h in s.hosts if h.alive}
    assert hosts and hosts < set(exporting)
    assert not any(exporting[node] for node in hosts)
    assert [node for node, yes in exporting.items() if yes and node not in hosts] != []


def test_driver_env_stays_clean(tpu_cluster: SimulatedCluster) -> None:
    """The hosts' TPU identity never reaches the driver (JAX may set other TPU_* vars)."""
    assert not [k for k in HOST_ENV_VARS if k in os.environ]


def test_head_node_has_no_tpu(tpu_cluster: SimulatedCluster) -> None:
    heads = [n for n in ray.nodes() if n["Alive"] and "node:__internal_head__" in n["Resources"]]
    assert len(heads) == 1
    assert "TPU" not in heads[0]["Resources"]
    assert not any(k.startswith("ray.io/tpu") for k in heads[0]["Labels"])


def test_slice_names_are_unique_and_readable(tpu_cluster: SimulatedCluster) -> None:
    assert {"v4-16-a", "v4-16-b", "v6e-16-a", "v6e-8-a", "v6e-8-b"} == set(tpu_cluster.slices)


def test_rays_own_run_on_slice_works_on_the_simulator(tpu_cluster: SimulatedCluster) -> None:
    """Fidelity: Ray 2.60's own TPU utilities find and use our simulated slices."""
    results = ray.get(ray_tpu.run_on_slice(where_am_i, topology="4x4", accelerator_version="v6e"))
    assert sorted(int(r["TPU_WORKER_ID"]) for r in results) == [0, 1, 2, 3]
    assert {r["TPU_NAME"] for r in results} == {"v6e-16-a"}
    # Ray's one-shot run_on_slice keeps its slice until the driver exits: clean up here.
    assert remove_placement_groups() >= 1


def test_rays_own_slice_placement_group_works(tpu_cluster: SimulatedCluster) -> None:
    spg = ray_tpu.SlicePlacementGroup(topology="2x2x2", accelerator_version="v4")
    try:
        ray.get(spg.placement_group.ready(), timeout=30)
        assert spg.num_hosts == 2
        assert ray_tpu.get_num_tpu_slices("2x2x2", "TPU-V4") == 2
    finally:
        spg.shutdown()


def test_fault_injection_rejects_unknown_hosts(tpu_cluster: SimulatedCluster) -> None:
    with pytest.raises(SimulatorError, match="no simulated slice 'nope'"):
        tpu_cluster.kill_host("nope", 0)
    with pytest.raises(SimulatorError, match=r"workers 0\.\.1"):
        tpu_cluster.kill_host("v4-16-a", 5)
    with pytest.raises(SimulatorError, match="no simulated slice 'nope'"):
        tpu_cluster.preempt_slice("nope", notice_s=1)
    with pytest.raises(SimulatorError, match="notice_s must be seconds >= 0"):
        tpu_cluster.preempt_slice("v4-16-a", notice_s=-1)
    with pytest.raises(SimulatorError, match="is not one GCE sends"):
        tpu_cluster.schedule_maintenance("v4-16-a", 0, 1, event="REBOOT")
    with pytest.raises(SimulatorError, match=r"workers 0\.\.1"):
        tpu_cluster.hang_host("v4-16-a", 7)
    # Nothing was set on the way: no notice stands, the slice is still idle.
    assert tpu_cluster.metadata_server("v4-16-a", 0).get("instance/preempted") == "FALSE"
    assert tpu_cluster.metadata_server("v4-16-a", 0).get("instance/maintenance-event") == "NONE"


@ray.remote(num_cpus=0)
class Squatter:
    """Holds a host's TPU resource outside any placement group: Ray counts it in use, and
    no TPU owner is recorded there."""

    def ready(self) -> bool:
        return True


def test_a_slice_held_outside_any_group_is_named_and_a_restart_frees_it(
    tpu_cluster: SimulatedCluster,
) -> None:
    """What the cluster fixture relies on: a slice held by an actor outside any group is
    not taken for Ray's own accounting (the actor is named), and restarting the slice's
    hosts leaves it ready."""
    from tpuslice.testing.checks import held_by_nothing, holders, slices_not_ready

    node = tpuslice.read_snapshot().slices["v4-16-b"].hosts[1].node_id
    strategy = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
    squatter = Squatter.options(resources={"TPU": 4}, scheduling_strategy=strategy).remote()
    ray.get(squatter.ready.remote(), timeout=60)
    busy = wait_for(
        lambda: (info := tpuslice.read_snapshot().slices["v4-16-b"]).busy_hosts == 1 and info,
        what="v4-16-b host 1 busy in the resource view",
    )
    assert not held_by_nothing(busy)
    assert [h.split(" pid ")[0] for h in holders(busy)] == ["Squatter"]
    assert holders(busy)[0].endswith("on host 1")
    tpu_cluster.restart_slice("v4-16-b")
    assert slices_not_ready(["v4-16-b"], timeout=30) == []
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(squatter.ready.remote(), timeout=30)


RAISING = textwrap.dedent(
    """
    import json, ray
    import ray.cluster_utils
    from tpuslice.testing import SimulatedCluster

    own = ValueError("the user's own error")
    sim = SimulatedCluster([], head_cpus=1)  # the head alone: teardown is the point
    real = ray.cluster_utils.Cluster.shutdown

    def broken(self):
        raise RuntimeError("teardown broke halfway")  # before Ray stopped anything

    ray.cluster_utils.Cluster.shutdown = broken
    caught, pids = None, []
    try:
        with sim:
            ray.init(address=sim.address, log_to_driver=False)  # not sim.connect()
            pids = sorted(sim.pids())
            raise own
    except BaseException as exc:
        caught = exc
    finally:
        ray.cluster_utils.Cluster.shutdown = real
    print(json.dumps({"same": caught is own, "caught": repr(caught),
                      "connected": ray.is_initialized(), "pids": pids,
                      "left": sorted(sim.leftover_pids())}))
    """
)


def test_an_error_in_the_block_propagates_unchanged_and_nothing_is_left() -> None:
    """A head-only separate cluster in a child process, connected through its own
    ray.init. The block raises, and Ray's own teardown then fails before it stops
    anything. The block's exception propagates unchanged, the teardown's failure is
    logged, not raised over it, the driver is disconnected, and every process the cluster
    had is gone all the same: the simulator kills what it started by pid, the step a
    teardown that works also ends with."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    child = subprocess.Popen(
        [sys.executable, "-c", RAISING],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        stdout, stderr = child.communicate(timeout=240)
    finally:
        child.kill()  # a no-op unless a timeout left it running
    assert child.returncode == 0, stderr[-2000:]
    report = json.loads(stdout.strip().splitlines()[-1])
    assert report["same"], report["caught"]
    assert report["connected"] is False
    assert len(report["pids"]) >= 3
    assert report["left"] == []
    assert [pid for pid in report["pids"] if _alive(pid)] == []
    assert "teardown broke halfway" in stderr  # logged, not raised over the user's error


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
