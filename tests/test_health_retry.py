"""run_resilient(..., health_check=True): the checks before a retry lands on a doubtful
slice, with fake reservations and a fake check (no Ray)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from ray import exceptions as rex

from test_resilient_pure import REQUEST, FakeSlices, no_watch, scripted_body
from tpuslice._run.health import HostVerdict, SliceHealth, Vetting
from tpuslice._run.observe import AttemptEvent
from tpuslice._run.resilient import ResilientRun, RetryPolicy
from tpuslice._tpu.clock import Clock
from tpuslice.errors import RetriesExhaustedError, SliceUnhealthyError


def verdict(name: str, failing: int | None = None) -> SliceHealth:
    hosts = tuple(
        HostVerdict(w, f"{name}-n{w}", w != failing, 0.1, "started in 0.1 s", "ok", "", "")
        if w != failing
        else HostVerdict(
            w,
            f"{name}-n{w}",
            False,
            0.1,
            "did not start in 30 s",
            "ok",
            "",
            "TPU did not start in 30 s",
        )
        for w in (0, 1)
    )
    return SliceHealth(name, hosts, 2.5)


class World:
    """Scripted reservations, a scripted check, and what was recorded."""

    def __init__(self, names: list[str], broken: set[str], suspect: set[str] = frozenset()):
        self.names: Iterator[str] = iter(names)
        self.broken, self.suspect = broken, set(suspect)
        self.log: list[str] = []
        self.recorded: list[tuple[str, bool]] = []

    def reserve(self, request: object) -> FakeSlices:
        return FakeSlices(next(self.names), self.log)

    def check(self, spg: FakeSlices) -> list[SliceHealth]:
        name = spg.slice_names[0]
        self.log.append(f"check {name}")
        return [verdict(name, 1 if name in self.broken else None)]

    def vetting(self) -> Vetting:
        return Vetting(
            check=self.check,  # type: ignore[arg-type]
            suspects_of=lambda spg: {n for n in spg.slice_names if n in self.suspect},
            record=lambda result, who: self.recorded.append((result.slice_name, result.ok)),
        )


def run(world: World, outcomes: list[Exception | None], events: list[AttemptEvent]) -> object:
    return ResilientRun(
        scripted_body(outcomes, world.log),
        REQUEST,
        RetryPolicy(max_retries_failure=1, max_retries_preemption=2),
        events.append,
        Clock(sleep=lambda s: None),
        reserve=world.reserve,  # type: ignore[arg-type]
        make_watch=no_watch,  # type: ignore[arg-type]
        vetting=world.vetting(),
    ).until_done()


def test_a_retry_on_the_slice_that_just_lost_a_host_runs_after_a_check_that_passes() -> None:
    world, events = World(["a", "a"], broken=set()), []
    assert run(world, [rex.NodeDiedError("gone"), None], events) == ["r0", "r1"]
    assert world.log == [
        "hold a", "run a", "release a",
        "hold a", "check a", "run a", "release a",
    ]  # fmt: skip
    assert world.recorded == [("a", True)]
    started = [e for e in events if e.kind == "started"]
    assert started[0].cause == ""  # the first attempt had nothing in doubt
    assert started[1].cause == "health check passed in 2.5 s on a (failed last)"


def test_a_failed_check_sends_the_retry_elsewhere_without_using_its_budget() -> None:
    world, events = World(["a", "a", "b"], broken={"a"}), []
    assert run(world, [rex.NodeDiedError("gone"), None], events) == ["r0", "r1"]
    assert world.log == [
        "hold a", "run a", "release a",
        "hold a", "check a", "release a",
        "hold b", "run b", "release b",
    ]  # fmt: skip
    assert world.recorded == [("a", False)]
    failed = [e for e in events if e.kind == "check_failed"]
    assert [(e.attempt, e.slice_names) for e in failed] == [(2, ("a",))]
    assert failed[0].cause == "a host 1: TPU did not start in 30 s"
    assert failed[0].next_action == "reserve again, away from the failed hosts"


def test_only_a_slice_that_failed_its_check_left_gives_up_naming_the_host() -> None:
    world, events = World(["a", "a", "a"], broken={"a"}), []
    with pytest.raises(SliceUnhealthyError) as info:
        run(world, [rex.NodeDiedError("gone"), None], events)
    assert isinstance(info.value, RetriesExhaustedError)
    message = str(info.value)
    assert "health check failed again: a host 1: TPU did not start in 30 s" in message
    assert "`tpuslice health --clear a`" in message
    assert world.log.count("check a") == 1 and "run a" not in world.log[3:]  # not rechecked
    assert events[-1].kind == "giving_up"


def test_a_suspect_slice_taken_as_a_last_resort_is_checked_before_the_first_attempt() -> None:
    world, events = World(["a"], broken=set(), suspect={"a"}), []
    assert run(world, [None], events) == ["r0", "r1"]
    assert world.log == ["hold a", "check a", "run a", "release a"]
    assert events[0].cause == "health check passed in 2.5 s on a (suspect)"


def test_a_users_error_puts_no_slice_in_doubt() -> None:
    world, events = World(["a", "a"], broken={"a"}), []
    error = rex.RayTaskError("f", "tb", ValueError("bad"), "ray::f", 1, "10.0.0.1")
    assert run(world, [error, None], events) == ["r0", "r1"]
    assert "check a" not in world.log
