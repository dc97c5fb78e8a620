"""TPU ownership on the simulator: one process per host owns its TPU (libtpu's lock, see
tpuslice._sim.libtpu), and a slice handed back has a free TPU on every host.

Every test ends (through the ``tpu_cluster`` fixture) with no placement group left and
no simulated TPU owned."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
from click.testing import CliRunner
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

import tpuslice
from clusterutil import hold_host, wait_for
from tpuslice._reserve.queue.agents import FREE_TRUST_S
from tpuslice._reserve.reserve import record_of, worker_groups
from tpuslice._sim.libtpu import HOST_ROOT_ENV
from tpuslice._sim.procs import pid_alive
from tpuslice.cli.commands import main
from tpuslice.testing import SimulatedCluster, live_placement_groups

pytestmark = pytest.mark.cluster

V6E = {"topology": "4x4", "accelerator_version": "v6e"}
OPEN_AND_HOLD = (
    "from tpuslice._sim.libtpu import open_tpu; open_tpu(); "
    "print('held', flush=True); import time; time.sleep(300)"
)


@ray.remote
def open_tpu_and_pid() -> int:
    """What a JAX program's first device use does: take this host's TPU (libtpu's start,
    without JAX's import)."""
    from tpuslice.testing.libtpu import open_tpu

    open_tpu()
    return os.getpid()


def test_a_one_shot_that_opened_the_tpus_frees_them_while_its_job_lives(
    tpu_cluster: SimulatedCluster,
) -> None:
    """This driver's one-shot opens the TPU on every host of the only v6e 4x4 slice in
    task workers, which outlive the call; the driver lives on, and the one-shot's
    hand-back leaves no process owning those TPUs, so another job can open them (a free
    TPU is one libtpu opens: test_tpu_lock)."""
    pids = set(ray.get(tpuslice.run_on_slice(open_tpu_and_pid, **V6E), timeout=120))
    assert len(pids) == 4

    def freed() -> bool:
        owners = {owner.pid for owner in tpu_cluster.tpu_owners().values()}
        assert owners <= pids, f"owned by others meanwhile: {owners - pids}"
        return not owners

    wait_for(freed, timeout=30, what="the one-shot's hand-back to free its TPUs")


def trainer_class() -> type:
    """Defined in a function so Ray pickles it by value."""

    class Trainer:
        def __init__(self) -> None:
            from tpuslice.testing.libtpu import open_tpu

            open_tpu()

        def pid(self) -> int:
            return os.getpid()

    return Trainer


def test_an_actor_group_then_run_on_slice_in_one_job(tpu_cluster: SimulatedCluster) -> None:
    """The group's actors own the TPUs, and run_on_slice on the slice says so. After the
    group exits, run_on_slice's tasks open the TPUs; an actor group made after them finds
    the TPUs freed of their idle workers."""
    with tpuslice.SlicePlacementGroup(**V6E) as spg:
        group = tpuslice.SliceActorGroup(trainer_class(), spg)
        actor_pids = group.get(group.call("pid"), timeout=120)
        with pytest.raises(tpuslice.errors.InvalidArgumentError, match="SliceActorGroup"):
            tpuslice.run_on_slice(open_tpu_and_pid, tpu_slice=spg)
        group.shutdown()
        after = ray.get(tpuslice.run_on_slice(open_tpu_and_pid, tpu_slice=spg), timeout=120)
        assert not set(after) & set(actor_pids)
        again = ray.get(tpuslice.run_on_slice(open_tpu_and_pid, tpu_slice=spg))
        assert again == after  # warm: Ray reuses the worker that opened the TPU
        group = tpuslice.SliceActorGroup(trainer_class(), spg)
        assert not set(group.get(group.call("pid"), timeout=120)) & set(after)
        group.shutdown()


def test_concurrent_calls_on_a_held_slice_share_its_workers(
    tpu_cluster: SimulatedCluster,
) -> None:
    """Eight threads call at once: the bundle's TPU lets one call run per host at a time,
    and Ray gives each the worker that opened the TPU, so none meets an owned TPU."""
    with tpuslice.SlicePlacementGroup(**V6E) as spg:
        results: list[list[int]] = []
        errors: list[BaseException] = []

        def call() -> None:
            try:
                results.append(ray.get(tpuslice.run_on_slice(open_tpu_and_pid, tpu_slice=spg)))
            except (ray.exceptions.RayError, tpuslice.TPUSliceError) as exc:
                errors.append(exc)

        threads = [threading.Thread(target=call) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=180)
    assert errors == []
    assert len(results) == 8 and all(r == results[0] for r in results)


@ray.remote
def hold_until(flag: str) -> int:
    """Take the TPU, then run until ``flag`` exists (an attempt cut short by a host loss)."""
    from tpuslice.testing.libtpu import open_tpu

    open_tpu()
    deadline = time.monotonic() + 120
    while not os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.05)
    return os.getpid()


def test_run_resilient_after_a_host_kill_finds_the_surviving_hosts_tpu_free(
    tpu_cluster: SimulatedCluster, tmp_path: Path
) -> None:
    """Only v4-16-a is idle. Attempt 1 opens both its TPUs; host 1 dies. Host 0's worker
    survives it, still owning its TPU, until the hand-back stops it. Host 1 comes back,
    attempt 2 lands on the same slice and opens both TPUs."""
    flag = str(tmp_path / "go")
    events: list[tpuslice.AttemptEvent] = []
    got: dict[str, object] = {}

    def owners_of(name: str) -> list[int]:
        return [o.pid for (s, _), o in tpu_cluster.tpu_owners().items() if s == name]

    def run() -> None:  # in a thread: the simulator adds nodes from the main thread only
        try:
            got["pids"] = tpuslice.run_resilient(
                hold_until,
                flag,
                topology="2x2x2",
                accelerator_version="v4",
                head_reservation_timeout_s=120,
                on_event=events.append,
            )
        except tpuslice.TPUSliceError as exc:
            got["error"] = exc

    with hold_host("v4-16-b", 0, 4):
        runner = threading.Thread(target=run)
        runner.start()
        try:
            wait_for(lambda: len(owners_of("v4-16-a")) == 2, timeout=120, what="attempt 1")
            tpu_cluster.kill_host("v4-16-a", 1)
            Path(flag).touch()
            tpu_cluster.restore_slice("v4-16-a")
        finally:
            runner.join(timeout=180)
    assert "error" not in got, got
    pids = got["pids"]
    assert isinstance(pids, list)
    kinds = [(e.kind, e.slice_names) for e in events]
    assert kinds[0] == ("started", ("v4-16-a",))
    failed = [e.outcome for e in events if e.kind == "failed"]
    assert failed == [tpuslice.Outcome.HOST_FAILURE]  # killed with no notice
    assert kinds[-1] == ("succeeded", ("v4-16-a",))
    assert len(pids) == 2


def test_ctrl_c_of_tpuslice_run_stops_the_commands_owning_the_tpus(
    tpu_cluster: SimulatedCluster,
) -> None:
    """The commands open their host's TPU and hold it; Ctrl-C: the run exits 130 saying
    so, the commands are gone, the slice is given back, and (the fixture's check) no
    process owns a TPU, so the next user can open them."""
    command = f'{sys.executable} -c "{OPEN_AND_HOLD}"'
    argv = ["run", "--address", tpu_cluster.address, "--topology", "2x2x2", "--accelerator"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tpuslice.cli", *argv, "v4", "--", command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        owners = wait_for(
            lambda: len(found := tpu_cluster.tpu_owners()) == 2 and found,
            timeout=120,
            what="both TPUs owned by the commands",
        )
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err
    commands = [owner.pid for owner in owners.values()]
    wait_for(lambda: not any(map(pid_alive, commands)), timeout=20, what="the commands killed")
    wait_for(lambda: not live_placement_groups(), timeout=30, what="slices released")


@pytest.fixture
def notebook(tpu_cluster: SimulatedCluster) -> Iterator[subprocess.Popen[str]]:
    """A process outside Ray (a notebook, say) holding host 2 of v6e-16-a's TPU."""
    env = {**os.environ, HOST_ROOT_ENV: str(tpu_cluster.host_root("v6e-16-a", 2))}
    proc = subprocess.Popen(
        [sys.executable, "-c", OPEN_AND_HOLD], env=env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    # Not a synchronisation: this driver trusts its own recent finding that the host was
    # free (it handed the slice back in an earlier test) for FREE_TRUST_S; let that pass.
    time.sleep(FREE_TRUST_S)
    # The host's agent looks at the lock every half second and then withdraws its word
    # that the TPU is free; until it has, a reservation would not ask that host.
    wait_for(
        lambda: not tpuslice.read_snapshot().slices["v6e-16-a"].hosts[2].tpu_seen_free,
        timeout=30,
        what="host 2's agent to see the notebook holding its TPU",
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def test_a_foreign_owner_makes_its_slice_busy_with_a_reason(
    tpu_cluster: SimulatedCluster, notebook: subprocess.Popen[str]
) -> None:
    with pytest.raises(tpuslice.ReservationTimeoutError) as info:
        tpuslice.SlicePlacementGroup(**V6E, head_reservation_timeout_s=3)
    text = str(info.value)
    assert f"host 2: TPU held by pid {notebook.pid} (" in text
    view = tpuslice.read_snapshot().slices["v6e-16-a"]
    assert view.state is tpuslice.SliceState.BUSY
    assert view.hosts[2].tpu_owner is not None and f"pid {notebook.pid}" in view.hosts[2].tpu_owner
    assert notebook.poll() is None  # never stopped automatically
    # Once it exits, its host's agent drops the record by itself: nobody asks the host.
    notebook.kill()
    notebook.wait(timeout=30)

    # And its agent's word that the TPU is free is back, so the next reservation there
    # asks no host.
    def ready_and_vouched() -> bool:
        view = tpuslice.read_snapshot().slices["v6e-16-a"]
        vouched = all(host.tpu_seen_free for host in view.hosts.values())
        return view.state is tpuslice.SliceState.READY and vouched

    wait_for(ready_and_vouched, timeout=30, what="v6e-16-a ready after the notebook exited")


def test_release_tpu_stops_a_foreign_owner_on_request(
    tpu_cluster: SimulatedCluster, notebook: subprocess.Popen[str]
) -> None:
    runner = CliRunner()
    status = runner.invoke(main, ["status", "--owners"], env={"COLUMNS": "200"})
    assert status.exit_code == 0, status.output
    assert f"pid {notebook.pid}" in status.output and "TPU owners" in status.output
    declined = runner.invoke(main, ["release-tpu", "--host", "v6e-16-a/2"], input="n\n")
    assert declined.exit_code == 1 and notebook.poll() is None
    done = runner.invoke(main, ["release-tpu", "--host", "v6e-16-a/2", "--yes"])
    assert done.exit_code == 0, done.output
    assert f"stopped pid {notebook.pid}" in done.output
    assert notebook.wait(timeout=30) != 0
    with tpuslice.SlicePlacementGroup(**V6E, head_reservation_timeout_s=30) as spg:
        assert spg.slice_names == ["v6e-16-a"]


def test_release_tpu_names_valid_hosts_for_a_wrong_one(tpu_cluster: SimulatedCluster) -> None:
    result = CliRunner().invoke(main, ["release-tpu", "--host", "nope/9", "--yes"])
    assert result.exit_code == 2
    assert "no live TPU host 'nope/9'" in result.output and "v4-16-a/0" in result.output


def raw_task(spg: tpuslice.SlicePlacementGroup, **env: str) -> object:
    """A plain Ray task in bundle 0, outside tpuslice's path, that tries the TPU (it exits
    afterwards: max_calls=1, so no process of it is left holding anything)."""

    @ray.remote(num_cpus=0, max_calls=1)
    def try_the_tpu() -> str:
        try:
            tpuslice.jax.open_tpu()
        except tpuslice.TPUInUseError as exc:
            return f"TPUInUseError: {exc}"
        return "opened"

    pg, bundle = worker_groups(record_of(spg))[0]
    options = {"runtime_env": {"env_vars": env}} if env else {}
    strategy = PlacementGroupSchedulingStrategy(pg, bundle)
    return ray.get(
        try_the_tpu.options(scheduling_strategy=strategy, **options).remote(), timeout=120
    )


def test_code_meeting_an_owned_tpu_fails_with_tpuslices_error_naming_the_owner(
    tpu_cluster: SimulatedCluster,
) -> None:
    with tpuslice.SlicePlacementGroup(**V6E) as spg:
        owner_pid = ray.get(tpuslice.run_on_slice(open_tpu_and_pid, tpu_slice=spg))[0]
        # Another worker than the one that opened the TPU: one with an environment of
        # its own (Ray would reuse the idle owner for a plain task of the same job).
        said = str(raw_task(spg, TPUSLICE_TEST_ANOTHER_WORKER="1"))
    assert said.startswith("TPUInUseError: the TPU of host v6e-16-a/0 is in use by ")
    assert f"pid {owner_pid} (ray::" in said and "Ray job" in said
    assert "release-tpu --host v6e-16-a/0" in said


def test_an_escape_hatch_lets_a_second_process_open_an_owned_tpu(
    tpu_cluster: SimulatedCluster,
) -> None:
    """A hatch set in a task's runtime environment reaches libtpu's check on the host.
    Which settings are hatches is test_tpu_lock's (each of them, in real processes)."""
    with tpuslice.SlicePlacementGroup(**V6E) as spg:
        ray.get(tpuslice.run_on_slice(open_tpu_and_pid, tpu_slice=spg))
        assert raw_task(spg, ALLOW_MULTIPLE_LIBTPU_LOAD="1") == "opened"


@ray.remote
def own_pid() -> int:
    return os.getpid()


def test_a_held_slices_calls_run_in_the_process_that_owns_the_tpu_until_the_hand_back(
    tpu_cluster: SimulatedCluster,
) -> None:
    """A held slice's first call opens each host's TPU in a task worker that Ray gives
    every later call there; it owns the TPU until the hand-back, which frees it, and the
    next slice held on those hosts opens the TPUs in other processes."""
    with tpuslice.SlicePlacementGroup(**V6E) as spg:
        name = spg.slice_names[0]
        first = ray.get(tpuslice.run_on_slice(open_tpu_and_pid, tpu_slice=spg))
        owners = tpu_cluster.tpu_owners()
        assert [owners[name, w].pid for w in range(4)] == first
        assert ray.get(tpuslice.run_on_slice(own_pid, tpu_slice=spg)) == first
    assert not tpu_cluster.tpu_owners()  # freed by the hand-back
    assert not any(pid_alive(pid) for pid in first)
    with tpuslice.SlicePlacementGroup(**V6E) as spg:
        assert spg.slice_names == [name]
        again = ray.get(tpuslice.run_on_slice(open_tpu_and_pid, tpu_slice=spg))
    assert not set(again) & set(first)
    assert not (owned := tpu_cluster.tpu_owners()), f"the call's pids: {again}; owners: {owned}"
