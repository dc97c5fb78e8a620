"""classify, summarize, RetryPolicy and AttemptEvent without a Ray cluster: Ray's exception
objects are built directly, as Ray builds them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from ray import exceptions as rex

import tpuslice
from tpuslice._reserve import claim
from tpuslice._reserve.request import SliceRequest
from tpuslice._run.observe import AttemptEvent, Outcome
from tpuslice._run.resilient import (
    Decision,
    GangBrokenError,
    ResilientRun,
    RetryPolicy,
    classify,
    summarize,
)
from tpuslice._tpu.clock import Clock
from tpuslice.errors import (
    HostLostError,
    InvalidArgumentError,
    ReservationTimeoutError,
    RetriesExhaustedError,
    SliceShutdownError,
)
from tpuslice.record.goodput import GangProgress
from tpuslice.testing.memory import InMemoryCluster

PREEMPTION, FAILURE = Outcome.PREEMPTION, Outcome.FAILURE
HOST_FAILURE, HANG = Outcome.HOST_FAILURE, Outcome.HANG


def task_error(cause: BaseException) -> rex.RayTaskError:
    """A RayTaskError as a worker makes it (ip/pid/proctitle given, so no Ray needed)."""
    return rex.RayTaskError(
        "train", "Traceback (most recent call last):\n  ...", cause, "ray::train", 1, "10.0.0.1"
    )


HOST_LOSS = {
    "NodeDiedError": rex.NodeDiedError("node 1a2b died"),
    "LocalRayletDiedError": rex.LocalRayletDiedError(),
    "WorkerCrashedError": rex.WorkerCrashedError(),
    "RayActorError": rex.RayActorError(),
    "ActorDiedError": rex.ActorDiedError(),
    "ActorUnavailableError": rex.ActorUnavailableError("connection lost", None),
    "ObjectLostError": rex.ObjectLostError("ab" * 14, None, ""),
    "OwnerDiedError": rex.OwnerDiedError("ab" * 14, None, ""),
    "ObjectFetchTimedOutError": rex.ObjectFetchTimedOutError("ab" * 14, None, ""),
    "TaskCancelledError": rex.TaskCancelledError(),
    "HostLostError": HostLostError("host 1 of slice v4-16-a died"),
}

USER_FAILURE = {
    "user ValueError": task_error(ValueError("boom")),
    "user ValueError as Ray raises it": task_error(ValueError("boom")).as_instanceof_cause(),
    "user KeyError": task_error(KeyError("k")).as_instanceof_cause(),
    "actor __init__ raised": rex.ActorDiedError(task_error(RuntimeError("bad config"))),
    "freed object": rex.ObjectFreedError("ab" * 14, None, ""),
    "ref counting bug": rex.ReferenceCountingAssertionError("ab" * 14, None, ""),
    "placement group removed": rex.TaskPlacementGroupRemoved(),
    "unschedulable": rex.TaskUnschedulableError("no node"),
    "system error": rex.RaySystemError("gcs"),
    "plain RayError": rex.RayError(),
    "our own error": SliceShutdownError("shut down"),
    "unknown": RuntimeError("who knows"),
    "interrupt": KeyboardInterrupt(),
}


@pytest.mark.parametrize("name", sorted(HOST_LOSS))
def test_host_loss_is_a_host_failure_until_evidence_says_preemption(name: str) -> None:
    assert classify(HOST_LOSS[name]) is HOST_FAILURE


@pytest.mark.parametrize("name", sorted(USER_FAILURE))
def test_user_and_unknown_errors_are_failures(name: str) -> None:
    assert classify(USER_FAILURE[name]) is FAILURE


@pytest.mark.parametrize("name", sorted(HOST_LOSS))
def test_host_loss_seen_by_user_code_is_still_host_loss(name: str) -> None:
    """User code that ray.get()s a lost object re-raises a system error: Ray wraps it in a
    RayTaskError, whose cause decides; twice wrapped (nested tasks) as well."""
    wrapped = task_error(HOST_LOSS[name])
    assert classify(wrapped) is HOST_FAILURE
    assert classify(task_error(wrapped)) is HOST_FAILURE


def test_a_hung_host_is_a_hang() -> None:
    hung = tpuslice.HostHungError("silent: rank 1 (v4-16-a host 1)")
    assert isinstance(hung, tpuslice.HostLostError)  # code that restarts on loss still does
    assert classify(hung) is HANG
    assert classify(task_error(hung)) is HANG


def test_nested_user_error_stays_a_failure() -> None:
    assert classify(task_error(task_error(ValueError("deep")))) is FAILURE


def test_classify_ignores_message_text() -> None:
    """Text that a text-searching classifier would call a preemption is not one."""
    assert classify(task_error(RuntimeError("NodeDiedError: node preempted"))) is FAILURE
    assert classify(rex.NodeDiedError("user error")) is HOST_FAILURE


def test_summarize_unwraps_task_errors_to_type_and_first_line() -> None:
    error = task_error(ValueError("boom on rank 1\nmore detail")).as_instanceof_cause()
    assert summarize(error) == "ValueError: boom on rank 1"
    assert summarize(task_error(task_error(KeyError("k")))) == "KeyError: 'k'"
    assert summarize(rex.NodeDiedError("\n  node 1a2b died\nsecond")) == (
        "NodeDiedError: node 1a2b died"
    )
    assert summarize(rex.TaskCancelledError()) == "TaskCancelledError"


# --- the retry policy ---------------------------------------------------------------------


def test_each_outcome_uses_its_own_budget() -> None:
    policy = RetryPolicy(max_retries_failure=2, max_retries_preemption=1)
    assert policy.decide(FAILURE, {FAILURE: 1}).retry
    assert policy.decide(FAILURE, {FAILURE: 2}).retry
    assert not policy.decide(FAILURE, {FAILURE: 3}).retry
    assert policy.decide(PREEMPTION, {PREEMPTION: 1, FAILURE: 2}).retry
    assert not policy.decide(PREEMPTION, {PREEMPTION: 2, FAILURE: 1}).retry


def test_host_failure_and_hang_budgets_default_to_the_preemption_budget() -> None:
    """Host loss was one budget before it could be told from preemption: left unset,
    host failures (and hangs) get the preemption budget; set, their own."""
    default = RetryPolicy(max_retries_preemption=2)
    assert [default.budget(o) for o in (PREEMPTION, HOST_FAILURE, HANG)] == [2, 2, 2]
    own = RetryPolicy(max_retries_preemption=2, max_retries_host_failure=0, max_retries_hang=5)
    assert [own.budget(o) for o in (PREEMPTION, HOST_FAILURE, HANG)] == [2, 0, 5]
    assert not own.decide(HOST_FAILURE, {HOST_FAILURE: 1}).retry
    assert own.decide(HANG, {HANG: 5, PREEMPTION: 2}).retry
    hang_follows = RetryPolicy(max_retries_preemption=2, max_retries_host_failure=1)
    assert hang_follows.budget(HANG) == 1


def test_default_policy_retries_host_loss_three_times_and_user_errors_never() -> None:
    policy = RetryPolicy()
    assert [policy.decide(PREEMPTION, {PREEMPTION: n}).retry for n in (1, 2, 3, 4)] == [
        True,
        True,
        True,
        False,
    ]
    decision = policy.decide(FAILURE, {FAILURE: 1})
    assert decision == Decision(False, 0.0, "failure budget of 0 retries used up")


def test_reasons_say_which_budget() -> None:
    policy = RetryPolicy(max_retries_failure=0, max_retries_preemption=1)
    assert policy.decide(PREEMPTION, {PREEMPTION: 1}).reason == "preemption retry 1 of 1"
    assert policy.decide(PREEMPTION, {PREEMPTION: 2}).reason == (
        "preemption budget of 1 retry used up"
    )


def test_backoff_doubles_from_first_to_cap_over_all_retries() -> None:
    policy = RetryPolicy(max_retries_failure=10, max_retries_preemption=10, backoff_s=(0.2, 1.0))
    delays = [policy.decide(FAILURE, {FAILURE: n}).delay_s for n in range(1, 6)]
    assert delays == pytest.approx([0.2, 0.4, 0.8, 1.0, 1.0])
    mixed = policy.decide(PREEMPTION, {PREEMPTION: 1, FAILURE: 2})
    assert mixed.delay_s == pytest.approx(0.8)  # third retry overall
    assert RetryPolicy(backoff_s=(0.0, 0.0)).decide(PREEMPTION, {PREEMPTION: 1}).delay_s == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_retries_failure": -1},
        {"max_retries_preemption": -2},
        {"max_retries_failure": 1.5},
        {"max_retries_preemption": True},
        {"backoff_s": (2.0, 1.0)},
        {"backoff_s": (-0.1, 1.0)},
        {"max_retries_host_failure": -1},
        {"max_retries_hang": 0.5},
    ],
)
def test_bad_budgets_are_rejected_as_value_errors(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidArgumentError, match="must be") as info:
        RetryPolicy(**kwargs)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)


# --- events -------------------------------------------------------------------------------


def test_events_are_frozen_and_describe_themselves() -> None:
    failed = AttemptEvent(
        "failed",
        2,
        ("v4-16-b",),
        PREEMPTION,
        "rank 1 (v4-16-b host 1): NodeDiedError: gone",
        "retry in 0.4 s on whole idle slices (preemption retry 2 of 3)",
        3.14,
    )
    assert failed.describe() == (
        "attempt 2 on v4-16-b: failed after 3.1 s: preemption "
        "(rank 1 (v4-16-b host 1): NodeDiedError: gone); "
        "next: retry in 0.4 s on whole idle slices (preemption retry 2 of 3)"
    )
    assert AttemptEvent("started", 1, ("a", "b")).describe() == "attempt 1 on a, b: started"
    giving_up = AttemptEvent("giving_up", 3, (), FAILURE, "failure budget of 2 retries used up")
    assert giving_up.describe() == "attempt 3: giving up: failure budget of 2 retries used up"
    with pytest.raises(AttributeError):
        failed.attempt = 3  # type: ignore[misc]


def test_public_names() -> None:
    assert tpuslice.classify is classify
    assert tpuslice.Outcome is Outcome
    assert tpuslice.AttemptEvent is AttemptEvent
    assert callable(tpuslice.run_resilient)
    assert Outcome.PREEMPTION == "preemption"


# --- bad input fails before anything is reserved (no Ray needed) --------------------------


def test_run_resilient_checks_its_input_before_reserving() -> None:
    import ray

    @ray.remote
    def work() -> int:
        return 1

    events: list[AttemptEvent] = []
    with pytest.raises(TypeError, match=r"@ray\.remote"):
        tpuslice.run_resilient(lambda: 1, topology="2x2x2", accelerator_version="v4")
    with pytest.raises(InvalidArgumentError, match="max_retries_failure must be"):
        tpuslice.run_resilient(
            work, topology="2x2x2", accelerator_version="v4", max_retries_failure=-1
        )
    with pytest.raises(tpuslice.InvalidTopologyError):
        tpuslice.run_resilient(
            work, topology="3x3", accelerator_version="v6e", on_event=events.append
        )
    assert events == []


# --- the loop, with a fake reservation (no Ray) -------------------------------------------


class FakeSlices:
    """Stands in for a SlicePlacementGroup: records when it is held and given back."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.slice_names, self.num_hosts, self.log = [name], 2, log

    def __enter__(self) -> FakeSlices:
        self.log.append(f"hold {self.slice_names[0]}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.log.append(f"release {self.slice_names[0]}")


REQUEST = SliceRequest(topology="2x2x2", accelerator_version="v4")


class FakeReserver:
    """Stands in for ``reserve_slices``: scripted slices, a log."""

    def __init__(self, log: list[str], fail_on: int | None = None) -> None:
        self.log, self.fail_on, self.count = log, fail_on, 0
        self.arrivals: list[int | None] = []

    def reserve(self, request: SliceRequest) -> FakeSlices:
        assert dataclasses.replace(request, arrival_ns=None) == REQUEST
        self.arrivals.append(request.arrival_ns)
        self.count += 1
        if self.count == self.fail_on:
            raise ReservationTimeoutError("no v4-16 within 5 s")
        return FakeSlices(f"s{self.count}", self.log)


class NoWatch:
    """An attempt's watch that never sees anything."""

    def close(self) -> None:
        pass

    def progress(self) -> GangProgress:
        return GangProgress()


def no_watch(config: object, spg: object, notice_event: object) -> NoWatch:
    return NoWatch()


def scripted_body(
    outcomes: list[Exception | None], log: list[str]
) -> Callable[[FakeSlices, object], list[str]]:
    """An attempt body that fails with each exception in turn (None: succeeds)."""
    script = iter(outcomes)

    def body(spg: FakeSlices, watch: object) -> list[str]:
        log.append(f"run {spg.slice_names[0]}")
        error = next(script)
        if error is None:
            return ["r0", "r1"]
        raise GangBrokenError(classify(error), summarize(error)) from error

    return body


def test_loop_retries_per_budget_and_releases_before_each_retry() -> None:
    log: list[str] = []
    events: list[AttemptEvent] = []
    errors = [rex.NodeDiedError("gone"), task_error(ValueError("bad")), None]
    run = ResilientRun(
        scripted_body(errors, log),
        REQUEST,
        RetryPolicy(max_retries_failure=1, max_retries_preemption=1),
        events.append,
        Clock(sleep=lambda s: log.append(f"sleep {s}")),
        reserve=FakeReserver(log).reserve,  # type: ignore[arg-type]
        make_watch=no_watch,  # type: ignore[arg-type]
    )
    assert run.until_done() == ["r0", "r1"]
    assert log == [
        "hold s1", "run s1", "release s1", "sleep 0.2",
        "hold s2", "run s2", "release s2", "sleep 0.4",
        "hold s3", "run s3", "release s3",
    ]  # fmt: skip
    assert [(e.kind, e.outcome) for e in events] == [
        ("started", None),
        ("failed", HOST_FAILURE),
        ("started", None),
        ("failed", FAILURE),
        ("started", None),
        ("succeeded", None),
    ]
    assert [r.cause for r in run.history] == ["NodeDiedError: gone", "ValueError: bad"]


def test_the_attempt_after_a_preemption_queues_in_the_runs_first_place() -> None:
    """After a preemption the next attempt waits in the queue at the place the first
    attempt had; after a failure it queues afresh, behind those who asked since."""
    log: list[str] = []
    reserver = FakeReserver(log)
    script = iter([Outcome.PREEMPTION, Outcome.FAILURE, None])

    def body(spg: FakeSlices, watch: object) -> list[str]:
        outcome = next(script)
        if outcome is None:
            return ["r0"]
        raise GangBrokenError(outcome, outcome.value)

    run = ResilientRun(
        body,
        REQUEST,
        RetryPolicy(max_retries_failure=1, max_retries_preemption=1),
        None,
        Clock(sleep=lambda s: None),
        reserve=reserver.reserve,  # type: ignore[arg-type]
        make_watch=no_watch,  # type: ignore[arg-type]
        arrival=lambda spg: 1000 + int(spg.slice_names[0][1:]),  # type: ignore[attr-defined]
    )
    assert run.until_done() == ["r0"]
    assert reserver.arrivals == [None, 1001, None]


def test_loop_gives_up_with_history_and_the_last_task_error_chained() -> None:
    log: list[str] = []
    last = task_error(KeyError("k"))
    run = ResilientRun(
        scripted_body([rex.WorkerCrashedError(), last], log),
        REQUEST,
        RetryPolicy(max_retries_failure=0, max_retries_preemption=5),
        clock=Clock(sleep=lambda s: None),
        reserve=FakeReserver(log).reserve,  # type: ignore[arg-type]
        make_watch=no_watch,  # type: ignore[arg-type]
    )
    with pytest.raises(RetriesExhaustedError, match="failure budget of 0 retries") as info:
        run.until_done()
    assert [(r.attempt, r.outcome, r.slice_names) for r in info.value.history] == [
        (1, HOST_FAILURE, ("s1",)),
        (2, FAILURE, ("s2",)),
    ]
    assert info.value.__cause__ is last
    assert log[-1] == "release s2"


def test_a_reservation_that_times_out_ends_the_run_with_its_own_error() -> None:
    log: list[str] = []
    events: list[AttemptEvent] = []
    run = ResilientRun(
        scripted_body([rex.NodeDiedError("gone")], log),
        REQUEST,
        RetryPolicy(),
        events.append,
        Clock(sleep=lambda s: None),
        reserve=FakeReserver(log, fail_on=2).reserve,  # type: ignore[arg-type]
        make_watch=no_watch,  # type: ignore[arg-type]
    )
    with pytest.raises(ReservationTimeoutError, match="no v4-16"):
        run.until_done()
    assert events[-1].kind == "giving_up"
    assert events[-1].cause == "could not reserve: ReservationTimeoutError: no v4-16 within 5 s"
    assert len(run.history) == 1


class HeldSlices:
    """A reservation of an in-memory cluster as the loop holds it: its slices, every
    group of the reservation removed when the attempt leaves."""

    def __init__(self, cluster: InMemoryCluster, request: SliceRequest) -> None:
        clock = Clock(cluster.clock.now, cluster.clock.sleep, cluster.clock.stamp)
        reservation = claim.Reserver(request, clock=clock, ops=cluster).run()
        assert reservation.plan is not None
        self.cluster = cluster
        self.slice_names = [c.slice_name for c in reservation.claims]
        self.num_hosts = reservation.plan.num_slices * reservation.plan.shape.num_hosts

    def __enter__(self) -> HeldSlices:
        return self

    def __exit__(self, *exc: object) -> None:
        for group in self.cluster.live_groups("reserver"):
            self.cluster.remove_group(group)


def test_a_run_over_a_range_shrinks_when_a_slice_is_lost_and_grows_back() -> None:
    """num_slices=(1, 3) with two of four slices busy: attempt 1 holds the two idle ones.
    A host of one dies and no slice is idle to replace it: attempt 2 goes on with the one
    left. The busy slices are freed and a host of that one dies too: attempt 3 grows to
    the two idle ones."""
    cluster = InMemoryCluster([("v4", "2x2x2", 4)])
    busy = [cluster.take(name, 1, {"TPU": 4}) for name in ("v4-16-2", "v4-16-3")]
    held: list[list[str]] = []

    def body(spg: HeldSlices, watch: object) -> list[str]:
        held.append(list(spg.slice_names))
        if len(held) == 3:
            return ["done"]
        if len(held) == 2:
            for group in busy:
                cluster.remove_group(group)
        cluster.kill_host(spg.slice_names[-1], 1)
        raise GangBrokenError(HOST_FAILURE, f"rank 1 ({spg.slice_names[-1]} host 1): lost")

    request = SliceRequest(topology="2x2x2", accelerator_version="v4", num_slices=(1, 3))
    run = ResilientRun(
        body,  # type: ignore[arg-type]
        request,
        RetryPolicy(),
        clock=Clock(cluster.clock.now, cluster.clock.sleep, cluster.clock.stamp),
        reserve=lambda r: HeldSlices(cluster, r),  # type: ignore[arg-type,return-value]
        make_watch=no_watch,  # type: ignore[arg-type]
    )
    assert run.until_done() == ["done"]
    assert held == [["v4-16-0", "v4-16-1"], ["v4-16-0"], ["v4-16-2", "v4-16-3"]]
    assert [(r.slice_names, r.num_hosts) for r in run.history] == [
        (("v4-16-0", "v4-16-1"), 4),
        (("v4-16-0",), 2),
    ]
    assert cluster.live_groups("reserver") == []
