"""The contention benchmark's replay of a run under strict FCFS with no overheads
(benchmarks/bench_contention.py): on the run's own arrivals and job lengths, what each
job would have waited, and how much longer the worst job really waited. Pure."""

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
