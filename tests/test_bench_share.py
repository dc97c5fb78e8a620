"""The contention benchmark's two-tenant report (benchmarks/bench_contention.py): how the
drivers are split between tenants, each tenant's slice-seconds and share against its
weight, the window in which every driver still asked, and Jain's fairness index. Pure."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The benchmarks are scripts, not a package: their folder is put on the path to import one.
sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))

import bench_contention as bench
from bench_contention import Job


def job(
    tenant: str,
    slices: int,
    granted: float,
    back_end: float,
    driver: int = 0,
    index: int = 0,
    submit: float = 0.0,
) -> Job:
    return Job(
        driver,
        index,
        slices,
        submit,
        start=granted + 0.1,
        end=back_end - 0.1,
        granted=granted,
        back_end=back_end,
        tenant=tenant,
    )


def test_drivers_are_dealt_so_that_each_tenant_has_the_same_demand() -> None:
    dealt = bench.driver_tenants(bench.DRIVERS, 2)
    demand = [0, 0]
    for d, n in enumerate(bench.DRIVERS):
        demand[dealt[d]] += n
    assert demand == [4, 4]
    assert dealt == [0, 1, 0, 1, 0, 1]
    # Each size dealt on from where the last left off: three 1s, one 2, two tenants.
    assert bench.driver_tenants((1, 1, 1, 2), 2) == [0, 1, 0, 1]
    assert bench.driver_tenants((2, 1), 1) == [0, 0]


def test_slice_seconds_count_slices_times_grant_to_hand_back_end() -> None:
    jobs = [job("a", 1, 0.0, 2.0), job("a", 2, 1.0, 4.0), job("b", 1, 0.5, 1.5)]
    assert bench.slice_seconds_by_tenant(jobs) == {"a": 8.0, "b": 1.0}


def test_slice_seconds_fall_back_to_the_tasks_and_skip_failed_jobs() -> None:
    untraced = Job(0, 0, 2, 0.0, start=1.0, end=3.0, tenant="a")
    failed = Job(1, 0, 1, 0.0, start=1.0, end=2.0, error="ReservationTimeoutError", tenant="b")
    never = Job(2, 0, 1, 0.0, tenant="b")
    assert bench.slice_seconds_by_tenant([untraced, failed, never]) == {"a": 4.0, "b": 0.0}


def test_slice_seconds_are_cut_to_the_window() -> None:
    jobs = [job("a", 2, 0.0, 10.0), job("b", 1, 8.0, 12.0), job("b", 1, 11.0, 13.0)]
    assert bench.slice_seconds_by_tenant(jobs, (2.0, 9.0)) == {"a": 14.0, "b": 1.0}


def test_the_window_ends_at_the_first_grant_of_a_drivers_last_job() -> None:
    jobs = [
        job("a", 1, 1.0, 3.0, driver=0, index=0, submit=0.5),
        job("a", 1, 3.5, 5.0, driver=0, index=1, submit=3.0),
        job("b", 1, 0.2, 2.0, driver=1, index=0, submit=0.5),
        job("b", 1, 2.5, 4.0, driver=1, index=1, submit=2.0),
        job("b", 1, 6.0, 8.0, driver=1, index=2, submit=4.0),
    ]
    assert bench.contention_window(jobs) == (0.5, 3.5)


def test_a_driver_whose_last_job_failed_ends_the_window_when_it_asked() -> None:
    failed = Job(1, 1, 1, 2.0, error="ReservationTimeoutError", tenant="b")
    jobs = [job("a", 1, 1.0, 3.0, driver=0, index=0), job("a", 1, 4.0, 5.0, driver=0, index=1)]
    assert bench.contention_window([*jobs, failed]) == (0.0, 2.0)


def test_shares_against_weights() -> None:
    got = bench.shares({"a": 10.0, "b": 20.0}, {"a": 1.0, "b": 2.0})
    assert got["a"]["share"] == pytest.approx(1 / 3)
    assert got["b"]["share"] == pytest.approx(2 / 3)
    assert got["a"]["weight_share"] == pytest.approx(1 / 3)
    assert got["a"]["ratio"] == pytest.approx(1.0)
    assert got["b"]["ratio"] == pytest.approx(1.0)
    assert got["b"]["slice_s"] == 20.0 and got["b"]["weight"] == 2.0


def test_an_even_split_misses_weights_of_one_and_two() -> None:
    got = bench.shares({"a": 15.0, "b": 15.0}, {"a": 1.0, "b": 2.0})
    assert got["a"]["ratio"] == pytest.approx(1.5)
    assert got["b"]["ratio"] == pytest.approx(0.75)


def test_shares_of_nothing_used_and_of_tenants_not_seen() -> None:
    got = bench.shares({}, {"a": 1.0, "b": 3.0})
    assert got["a"]["share"] == 0.0 and got["b"]["ratio"] == 0.0
    assert got["b"]["weight_share"] == pytest.approx(0.75)
    # A tenant not among the weights does not count in the total.
    assert bench.shares({"a": 1.0, "x": 9.0}, {"a": 1.0})["a"]["share"] == 1.0


def test_jain_index() -> None:
    assert bench.jain_index([1.0, 1.0]) == pytest.approx(1.0)
    assert bench.jain_index([2.0, 0.0]) == pytest.approx(0.5)
    assert bench.jain_index([3.0, 0.0, 0.0]) == pytest.approx(1 / 3)
    # Weight-normalised shares of an even split between weights 1 and 2.
    assert bench.jain_index([1.5, 0.75]) == pytest.approx(0.9)
    assert bench.jain_index([]) == 1.0
    assert bench.jain_index([0.0, 0.0]) == 1.0


def test_the_tenant_report_reads_the_window_and_the_whole_path() -> None:
    jobs = [
        job("a", 1, 0.0, 2.0, driver=0, index=0),
        job("a", 1, 2.0, 4.0, driver=0, index=1),
        job("b", 2, 0.0, 2.0, driver=1, index=0),
        job("b", 1, 2.0, 3.0, driver=1, index=1),
    ]
    got = bench.tenant_report(jobs, {"a": 1.0, "b": 2.0})
    assert got["window_s"] == 2.0  # both drivers' last jobs granted at 2.0
    assert got["window"]["a"]["slice_s"] == 2.0 and got["window"]["b"]["slice_s"] == 4.0
    assert got["jain"] == pytest.approx(1.0)
    assert got["whole_run"]["a"]["slice_s"] == 4.0 and got["whole_run"]["b"]["slice_s"] == 5.0
    assert got["whole_run_jain"] < 1.0


def test_the_ideal_and_fcfs_follow_the_jobs_per_driver() -> None:
    assert bench.ideal_makespan(2.0) == 12.0
    assert bench.ideal_makespan(2.0, 10) == 40.0
    assert bench.fcfs_schedule(2.0, 10)["makespan_s"] >= 40.0
