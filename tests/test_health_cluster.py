"""Suspect hosts and health checks on the simulator: a slice that failed someone is kept
out of service until checked, a retry lands on it only after a check that passes, a host
whose TPU hangs whoever opens it fails its check and the run gives up naming it, and a
replaced host is trusted again."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import tpuslice
from clusterutil import beat_until_go, hold_host, markers_written, run_in_background, wait_for
from tpuslice import AttemptEvent, Outcome
from tpuslice._host.suspects import SuspectReason
from tpuslice._run import health
from tpuslice._view.cluster import SliceState, read_snapshot
from tpuslice.cli.commands import main
from tpuslice.testing import SimulatedCluster

V4 = {"topology": "2x2x2", "accelerator_version": "v4"}


def state(name: str) -> SliceState:
    return read_snapshot().slices[name].state


def suspect_hosts(name: str) -> list[tuple[int, SuspectReason]]:
    """The slice's suspect hosts and why, once the view shows the slice suspect."""
    found = read_snapshot().slices[name]
    assert found.state is SliceState.SUSPECT, f"{name} is {found.state.value}: {found.reason}"
    return [(s.worker_id, s.reason) for s in found.suspects]


def hang_on_the_only_slice(
    tpu_cluster: SimulatedCluster, tmp_path: Path, *, wedge: bool
) -> tuple[list[AttemptEvent], BaseException | list[str]]:
    """Hold one host of v4-16-b; run with health checks on v4-16-a, the only slice idle;
    hang (or wedge) its host 1 once both ranks beat; let the run finish.
    A reservation waits for a trusted slice until 30 s before its deadline, so the
    31 s timeout makes the suspect slice the last resort at once."""
    markers, go = tmp_path / "started", tmp_path / "go"
    markers.mkdir()
    events: list[AttemptEvent] = []
    with (
        hold_host("v4-16-b", 1),
        run_in_background(
            beat_until_go,
            str(markers),
            str(go),
            wedge,
            **V4,
            head_reservation_timeout_s=31,
            heartbeat_timeout_s=2.0,
            max_retries_hang=2,
            backoff_s=(0.1, 0.2),
            health_check=True,
            on_event=events.append,
            go=go,
        ) as future,
    ):
        assert wait_for(lambda: markers_written(markers, 2), 60, "attempt 1") == ["v4-16-a"] * 2
        if wedge:
            tpu_cluster.wedge_tpu("v4-16-a", 1)
            outcome: BaseException | list[str] = future.exception(timeout=120) or []
        else:
            tpu_cluster.hang_host("v4-16-a", 1)
            wait_for(lambda: markers_written(markers, 4), 60, "attempt 2 running")
            go.touch()
            outcome = future.result(timeout=60)
    return events, outcome


def test_a_retry_on_the_only_slice_left_runs_there_after_a_check_that_passes(
    tpu_cluster: SimulatedCluster, tmp_path: Path
) -> None:
    events, results = hang_on_the_only_slice(tpu_cluster, tmp_path, wedge=False)
    assert results == ["v4-16-a", "v4-16-a"]
    kinds = [(e.kind, e.outcome) for e in events]
    assert kinds == [
        ("started", None),
        ("failed", Outcome.HANG),
        ("started", None),
        ("succeeded", None),
    ]
    assert events[2].cause.startswith("health check passed in ")
    assert events[2].cause.endswith("on v4-16-a (suspect)")
    assert state("v4-16-a") is SliceState.READY  # the check cleared it


def test_a_host_whose_tpu_hangs_fails_its_check_and_the_run_gives_up_naming_it(
    tpu_cluster: SimulatedCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(health, "TPU_OPEN_S", 3.0)  # each check waits this long for it
    try:
        events, error = hang_on_the_only_slice(tpu_cluster, tmp_path, wedge=True)
        assert isinstance(error, tpuslice.SliceUnhealthyError)
        assert "v4-16-a host 1: TPU did not start in 3 s" in str(error)
        assert [e.kind for e in events] == [
            "started",
            "failed",
            "check_failed",
            "giving_up",
        ]
        assert suspect_hosts("v4-16-a") == [(1, SuspectReason.HEALTH_CHECK)]
    finally:
        tpu_cluster.repair_host("v4-16-a", 1)
        monkeypatch.undo()  # the check below waits as long as a user's would, on a loaded machine
    assert tpuslice.check_slice("v4-16-a").ok  # repaired: trusted again
    assert state("v4-16-a") is SliceState.READY


def test_tpuslice_health_gives_each_hosts_verdict_and_fails_on_an_unreachable_one(
    tpu_cluster: SimulatedCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    healthy = CliRunner().invoke(main, ["health", "v6e-16-a", "--json"])
    assert healthy.exit_code == 0, healthy.output
    found = json.loads(healthy.output)["slices"][0]
    assert found["ok"] and [h["worker_id"] for h in found["hosts"]] == [0, 1, 2, 3]
    assert all(h["tpu"].startswith("started in ") for h in found["hosts"])
    monkeypatch.setattr(health, "REACH_S", 2.0)  # how long a dropped connection waits
    tpu_cluster.cut_off_host("v6e-16-a", 2)
    try:
        failed = CliRunner().invoke(main, ["health", "v6e-16-a"], env={"COLUMNS": "200"})
        assert failed.exit_code == 1, failed.output
        assert "v6e-16-a: 1 host(s) failed" in failed.output
        assert "host 2: FAILED: reach: could not reach rank 0" in failed.output  # peers did
        assert suspect_hosts("v6e-16-a") == [(2, SuspectReason.HEALTH_CHECK)]
    finally:
        tpu_cluster.repair_host("v6e-16-a", 2)
    cleared = CliRunner().invoke(main, ["health", "v6e-16-a", "--clear"], env={"COLUMNS": "200"})
    assert cleared.exit_code == 0 and "v6e-16-a: trusted again (hosts: 2)" in cleared.output
    assert state("v6e-16-a") is SliceState.READY


MARK_IN_ANOTHER_DRIVER = """
import sys, ray
from tpuslice._host.suspects import Blame, SuspectReason
from tpuslice._reserve.suspects import mark_suspects
ray.init(address=sys.argv[1], log_to_driver=False)
mark_suspects([Blame(sys.argv[2], "v4-16-a", 1, SuspectReason.HANG, "another driver's hang")])
"""


def test_reservations_keep_off_a_suspect_slice_until_nothing_else_can_serve_and_a_new_vm_is_trusted(
    tpu_cluster: SimulatedCluster,
) -> None:
    host = read_snapshot().slices["v4-16-a"].hosts[1]
    # Another driver's run marks the host, as a resilient run does after a hang there.
    other_driver = subprocess.run(
        [sys.executable, "-c", MARK_IN_ANOTHER_DRIVER, tpu_cluster.address, host.node_id],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert other_driver.returncode == 0, other_driver.stderr[-2000:]
    assert state("v4-16-a") is SliceState.SUSPECT
    with tpuslice.SlicePlacementGroup(**V4) as spg:  # v4-16-a comes first when trusted
        assert spg.slice_names == ["v4-16-b"]
    with tpuslice.SlicePlacementGroup(**V4, num_slices=2) as spg:  # fewer trusted than asked
        assert "v4-16-a" in spg.slice_names
    assert state("v4-16-a") is SliceState.SUSPECT
    tpu_cluster.kill_host("v4-16-a", 1)
    tpu_cluster.wait_until_dead("v4-16-a", 1)
    tpu_cluster.restore_slice("v4-16-a")  # a new VM, a new node id: nothing against it
    wait_for(lambda: state("v4-16-a") is SliceState.READY, 30, "the replaced host's slice ready")
