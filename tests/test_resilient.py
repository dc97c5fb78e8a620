"""run_resilient on the simulator: a lost host restarts the gang on whole idle slices, the
budgets hold, every attempt gives its slices back before the next, results in rank order."""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path

import pytest
import ray

import tpuslice
from clusterutil import markers_written, run_in_background, wait_for
from tpuslice import AttemptEvent, Outcome
from tpuslice._run import resilient
from tpuslice._tpu.clock import Clock
from tpuslice._view.cluster import SliceState, read_snapshot
from tpuslice.testing import SimulatedCluster, live_placement_groups

pytestmark = pytest.mark.cluster

V4 = {"topology": "2x2x2", "accelerator_version": "v4"}
TASK_BOUND_S = 120.0
"""Longest a test task waits for the test's go-ahead before failing on its own."""


@ray.remote
def wait_for_go(marker_dir: str, go: str) -> tuple[str, int]:
    """Say "started" (a marker file naming the slice), then wait for the test's go file."""
    host = tpuslice.current_host()
    hidden = Path(marker_dir, f".{uuid.uuid4().hex}")
    hidden.write_text(host.slice_name)
    hidden.rename(Path(marker_dir, hidden.name[1:]))  # appears complete, never half-written
    deadline = time.monotonic() + TASK_BOUND_S
    while not Path(go).exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the test never said go")
        time.sleep(0.02)
    return host.slice_name, host.rank


@ray.remote
def fail_on_rank_one() -> int:
    """Rank 1 raises at once; rank 0 would run on for a long time unless cancelled."""
    host = tpuslice.current_host()
    if host.rank == 1:
        raise ValueError(f"boom on {host.slice_name}")
    time.sleep(TASK_BOUND_S)
    return 0


@ray.remote
def whoami() -> tuple[int, str, str]:
    host = tpuslice.current_host()
    return host.rank, host.slice_name, str(host.worker_id)


def wait_all_v4_ready() -> None:
    wait_for(
        lambda: tpuslice.get_num_ready_tpu_slices("2x2x2", "v4") == 2,
        timeout=30,
        what="both v4 slices ready again",
    )


def test_host_killed_mid_run_restarts_on_another_slice(
    tpu_cluster: SimulatedCluster, tmp_path: Path
) -> None:
    markers, go = tmp_path / "started", tmp_path / "go"
    markers.mkdir()
    events: list[AttemptEvent] = []
    victim = ""
    try:
        with run_in_background(
            wait_for_go,
            str(markers),
            str(go),
            **V4,
            head_reservation_timeout_s=60,
            on_event=events.append,
            go=go,
        ) as future:
            first = wait_for(
                lambda: markers_written(markers, 2), timeout=60, what="attempt 1 running"
            )
            victim = first[0]
            assert first == [victim, victim]
            tpu_cluster.kill_host(victim, 1)
            second = wait_for(
                lambda: markers_written(markers, 4), timeout=60, what="attempt 2 running"
            )
            go.touch()
            results = future.result(timeout=60)
    finally:
        if victim:
            tpu_cluster.restore_slice(victim)
    other = results[0][0]
    assert other != victim
    assert sorted(second) == sorted([victim, victim, other, other])
    assert results == [(other, 0), (other, 1)]
    assert [e.kind for e in events] == ["started", "failed", "started", "succeeded"]
    failed = events[1]
    assert failed.outcome is Outcome.HOST_FAILURE  # it died with no notice
    assert failed.evidence == "no preemption or maintenance notice on any host of the attempt"
    assert failed.slice_names == (victim,)
    assert failed.cause.startswith(f"rank 1 ({victim} host 1): ")
    assert "host_failure retry 1 of 3" in failed.next_action
    assert events[2].slice_names == (other,)
    wait_all_v4_ready()


def test_a_slice_lost_with_a_budget_of_zero_gives_up_with_its_history(
    tpu_cluster: SimulatedCluster, tmp_path: Path
) -> None:
    """The attempt's whole slice is preempted with no notice: a host failure, whose budget
    follows max_retries_preemption when not set. With a budget of 0 the run gives up at
    once, naming the attempt. The preempted slice shows broken with no host alive, and
    comes back whole when restored."""
    markers, go = tmp_path / "started", tmp_path / "go"
    markers.mkdir()
    events: list[AttemptEvent] = []
    target = ""
    try:
        with run_in_background(
            wait_for_go,
            str(markers),
            str(go),
            **V4,
            max_retries_preemption=0,
            head_reservation_timeout_s=60,
            on_event=events.append,
            go=go,
        ) as future:
            first = wait_for(lambda: markers_written(markers, 2), timeout=60, what="attempt 1")
            target = first[0]
            assert first == [target, target]
            tpu_cluster.preempt_slice(target, notice_s=0)
            with pytest.raises(tpuslice.RetriesExhaustedError) as info:
                future.result(timeout=60)
        for worker in (0, 1):
            tpu_cluster.wait_until_dead(target, worker)
        lost = read_snapshot().slices[target]
        assert lost.state is SliceState.BROKEN and lost.alive_hosts == 0
    finally:
        if target:
            tpu_cluster.restore_slice(target)
    (record,) = info.value.history
    assert (record.attempt, record.outcome, record.slice_names, record.num_hosts) == (
        1,
        Outcome.HOST_FAILURE,
        (target,),
        2,
    )
    assert record.cause.startswith("rank ") and record.duration_s > 0
    assert "host_failure budget of 0 retries used up" in str(info.value)
    cause = info.value.__cause__
    assert tpuslice.classify(cause) is Outcome.HOST_FAILURE  # type: ignore[arg-type]
    assert [e.kind for e in events] == ["started", "failed", "giving_up"]
    back = wait_for(
        lambda: (s := read_snapshot().slices[target]).state is SliceState.READY and s,
        timeout=30,
        what=f"{target} back",
    )
    assert back.alive_hosts == 2
    wait_all_v4_ready()


def test_user_exception_is_retried_exactly_max_retries_failure_times(
    tpu_cluster: SimulatedCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    pgs_at_start: list[int] = []
    sleeps: list[float] = []
    monkeypatch.setattr(resilient, "new_clock", lambda: Clock(sleep=sleeps.append))

    def on_event(event: AttemptEvent) -> None:
        if event.kind == "started":  # only this attempt's group (head in bundle 0) may exist
            pgs_at_start.append(len(live_placement_groups()))

    begin = time.monotonic()
    with pytest.raises(tpuslice.RetriesExhaustedError) as info:
        tpuslice.run_resilient(
            fail_on_rank_one,
            **V4,
            max_retries_failure=2,
            on_event=on_event,
        )
    assert time.monotonic() - begin < 30, "rank 0 of each attempt was cancelled, not awaited"
    history = info.value.history
    assert len(history) == 3
    assert {r.outcome for r in history} == {Outcome.FAILURE}
    for record in history:
        (name,) = record.slice_names
        assert record.cause == f"rank 1 ({name} host 1): ValueError: boom on {name}"
    assert "failure budget of 2 retries used up" in str(info.value)
    assert isinstance(info.value.__cause__, ValueError)  # Ray's RayTaskError(ValueError)
    assert pgs_at_start == [1, 1, 1]
    assert sleeps == pytest.approx([0.2, 0.4])


def test_no_faults_one_attempt_results_in_rank_order(
    tpu_cluster: SimulatedCluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tpuslice._run.resilient")
    events: list[AttemptEvent] = []
    results = tpuslice.run_resilient(whoami, **V4, num_slices=2, on_event=events.append)
    assert [r[0] for r in results] == [0, 1, 2, 3]
    assert [r[2] for r in results] == ["0", "1", "0", "1"]
    names = events[0].slice_names
    assert [r[1] for r in results] == [names[0], names[0], names[1], names[1]]
    assert [e.kind for e in events] == ["started", "succeeded"]
    assert all(e.attempt == 1 for e in events)
    logged = [r.getMessage() for r in caplog.records if r.name == "tpuslice._run.resilient"]
    assert logged[0] == f"attempt 1 on {', '.join(names)}: started"
    assert logged[1].startswith(f"attempt 1 on {', '.join(names)}: succeeded after ")
