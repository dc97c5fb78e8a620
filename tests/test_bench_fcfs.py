"""The contention benchmark's replay of a run under strict FCFS with no overheads
(benchmarks/bench_contention.py): on the run's own arrivals and job lengths, what each
job would have waited, and how much longer the worst job really waited; the slices idle
while a request waited, measured and replayed; which paths share a cluster. Pure."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The benchmarks are scripts, not a package: their folder is put on the path to import one.
sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))

import bench_contention as bench
from bench_contention import Job


def ran(driver: int, index: int, slices: int, submit: float, start: float, end: float) -> Job:
    return Job(driver, index, slices, submit, start=start, end=end)


def test_the_aligned_model_and_the_replay_agree_when_the_run_is_aligned() -> None:
    """Every driver submits at 0 and every job lasts 2 s with no overhead: the replay is
    the aligned schedule, and a run that was exactly that waited nothing beyond it."""
    replay_jobs = []
    # Slices free at 0, 2, 4 ...: drivers 0-3 (1 slice) run first, 4-5 (2 slices) next.
    for d in range(4):
        for i in range(3):
            start = 4.0 * i
            replay_jobs.append(ran(d, i, 1, 0.0 if i == 0 else start - 2.0, start, start + 2.0))
    for d in (4, 5):
        for i in range(3):
            start = 2.0 + 4.0 * i
            replay_jobs.append(ran(d, i, 2, 0.0 if i == 0 else start - 2.0, start, start + 2.0))
    waits = bench.fcfs_replay(replay_jobs)
    assert max(waits.values()) == pytest.approx(bench.fcfs_schedule(2.0)["longest_wait_s"])
    assert bench.beyond_fcfs(replay_jobs)[0] == pytest.approx(0.0)


def test_a_two_slice_job_waits_for_its_second_slice_when_ends_are_apart() -> None:
    """Three 1-slice jobs hold 3 of 4 slices, ending 1 s apart: the 2-slice job submitted
    then waits for the first end, and a 1-slice job behind it waits for it to start
    first, though a slice was free when it came."""
    jobs = [
        ran(0, 0, 1, 0.0, 0.0, 2.0),
        ran(1, 0, 1, 0.0, 0.0, 3.0),
        ran(2, 0, 1, 0.0, 0.0, 4.0),
        ran(3, 0, 2, 0.1, 2.0, 4.0),  # needs 2: one free at 0.1, the second at 2.0
        ran(4, 0, 1, 0.2, 3.0, 5.0),  # behind it in FCFS order, though one slice was free
    ]
    waits = bench.fcfs_replay(jobs)
    assert waits[3, 0] == pytest.approx(1.9)
    assert waits[4, 0] == pytest.approx(2.8)


def test_the_worst_job_is_named_with_its_wait_beyond_the_replay() -> None:
    jobs = [
        ran(0, 0, 1, 0.0, 0.5, 2.5),  # the replay starts it at 0: 0.5 s beyond
        ran(1, 0, 4, 0.0, 5.0, 7.0),  # waits for the first job's 2 s run: 3 s beyond
    ]
    excess, which = bench.beyond_fcfs(jobs)
    assert excess == pytest.approx(3.0)
    assert which == "driver 1 job 0: waited 5.0 s, FCFS 2.0 s"


def test_a_drivers_jobs_after_a_failed_one_are_left_out() -> None:
    failed = Job(0, 0, 1, 0.0, error="boom")
    jobs = [failed, ran(0, 1, 1, 1.0, 1.0, 3.0), ran(1, 0, 1, 0.0, 0.0, 2.0)]
    assert set(bench.fcfs_replay(jobs)) == {(1, 0)}


def test_jobs_submitted_within_the_tie_window_are_taken_in_the_order_they_started() -> None:
    """Five jobs submitted within 6 ms on four slices: the first submitted lost the race
    and started last, when a slice came back. Strict FCFS cannot order submits that
    close, so the replay keeps the run's order: that job waits for the first end."""
    jobs = [
        ran(0, 0, 1, 0.000, 2.5, 4.5),
        *(ran(d, 0, 1, 0.002 + d / 1000, 0.3, 2.5) for d in range(1, 5)),
    ]
    waits = bench.fcfs_replay(jobs)
    assert waits[0, 0] == pytest.approx(2.203)
    assert [waits[d, 0] for d in range(1, 5)] == [0.0] * 4
    assert bench.beyond_fcfs(jobs)[0] == pytest.approx(0.297)


def test_a_job_submitted_outside_the_tie_window_keeps_its_place() -> None:
    """Submitted 0.2 s before the others, a job that started after them is still owed
    the first slice: its replay wait is 0 and its real wait counts in full."""
    jobs = [
        ran(0, 0, 1, 0.0, 2.5, 4.5),
        *(ran(d, 0, 1, 0.2, 0.3, 2.5) for d in range(1, 5)),
    ]
    waits = bench.fcfs_replay(jobs)
    assert waits[0, 0] == 0.0
    assert bench.beyond_fcfs(jobs)[0] == pytest.approx(2.5)


def test_idle_while_waiting_counts_idle_slices_up_to_what_the_waiting_want() -> None:
    """Samples hold until the next; a wait's edges between samples count where they fall.
    [0, 0.5): 2 idle, 2 wanted; [0.5, 1): 2 idle, 3 wanted; [1, 2): none idle;
    [2, 2.5): 3 idle, 3 wanted; [2.5, 3): 3 idle, 2 wanted."""
    idle = [(0.0, 2), (1.0, 0), (2.0, 3), (3.0, 3)]
    waits = [(0.5, 2.5, 1), (0.0, 3.0, 2)]
    assert bench.idle_while_waiting(idle, waits) == pytest.approx(1.0 + 1.0 + 1.5 + 1.0)


def test_idle_while_waiting_needs_two_samples_and_stops_at_the_last() -> None:
    assert bench.idle_while_waiting([(0.0, 4)], [(0.0, 9.0, 1)]) == 0.0
    assert bench.idle_while_waiting([(1.0, 4), (2.0, 4)], [(0.0, 9.0, 1)]) == pytest.approx(1.0)
    assert bench.idle_while_waiting([(0.0, 4), (5.0, 4)], [(1.0, 1.0, 2)]) == 0.0


def test_the_busy_timeline_steps_at_every_start_and_end() -> None:
    runs = [(0.0, 2.0, 1), (1.0, 3.0, 2), (2.0, 4.0, 1)]
    assert bench.busy_timeline(runs) == [(0.0, 1), (1.0, 3), (2.0, 3), (3.0, 1), (4.0, 0)]


def two_slice_job_behind_three() -> list[Job]:
    """Three 1-slice jobs hold 3 of 4 slices, ending at 2, 3 and 4 s; a 2-slice job
    submitted at 0.1 s starts at 2 s, a 1-slice job submitted at 0.2 s at 3 s: the
    replay's own schedule."""
    return [
        ran(0, 0, 1, 0.0, 0.0, 2.0),
        ran(1, 0, 1, 0.0, 0.0, 3.0),
        ran(2, 0, 1, 0.0, 0.0, 4.0),
        ran(3, 0, 2, 0.1, 2.0, 4.0),
        ran(4, 0, 1, 0.2, 3.0, 5.0),
    ]


def test_strict_fcfs_leaves_a_slice_idle_while_a_two_slice_job_waits() -> None:
    """From 0.1 s to 2 s one slice is free and both late jobs wait behind the 2-slice
    one: 1.9 slice-seconds idle while waiting, even with no overheads."""
    assert bench.replay_idle_while_waiting(two_slice_job_behind_three()) == pytest.approx(1.9)


def test_a_run_that_was_its_replay_leaves_nothing_beyond_it() -> None:
    """Samples of that run's idle slices every 50 ms give the replay's integral, to
    within the 50 ms the sampling blurs at each step."""
    jobs = two_slice_job_behind_three()
    runs = [(j.start, j.end, j.slices) for j in jobs if j.start is not None and j.end is not None]
    busy = bench.busy_timeline(runs)

    def idle_at(t: float) -> int:
        return bench.SLICES - next((n for m, n in reversed(busy) if m <= t), 0)

    samples = [(k * 0.05, idle_at(k * 0.05)) for k in range(101)]
    report = bench.iww_report(jobs, samples)
    assert report["iww_replay_slice_s"] == pytest.approx(1.9)
    assert abs(report["iww_beyond_replay_slice_s"]) <= 0.05
    assert report["slices_handed_over"] == 6
    assert report["iww_beyond_per_slice_s"] == pytest.approx(
        report["iww_beyond_replay_slice_s"] / 6
    )


def test_each_fresh_path_after_the_first_starts_a_cluster_that_later_paths_share() -> None:
    groups = bench.cluster_groups(["ours-fresh", "floor-fresh", "ours", "floor"])
    assert groups == [["ours-fresh"], ["floor-fresh", "ours", "floor"]]
    assert bench.cluster_groups(["floor", "ours-fresh", "ours"]) == [
        ["floor"],
        ["ours-fresh", "ours"],
    ]
    assert bench.base_path("floor-fresh") == "floor"


def test_a_path_is_held_against_the_floor_of_its_freshness_else_the_other() -> None:
    both = [{"path": "floor-fresh"}, {"path": "floor"}]
    assert bench.floor_for("ours-fresh", both) == {"path": "floor-fresh"}
    assert bench.floor_for("ours", both) == {"path": "floor"}
    assert bench.floor_for("ours-fresh", both[1:]) == {"path": "floor"}
    assert bench.floor_for("ours", []) is None
