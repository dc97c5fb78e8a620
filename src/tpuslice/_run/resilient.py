"""Resilient runs: an SPMD gang cannot go on with a missing host, so give the slices back
and rerun it from the start. One loop (:class:`ResilientRun`), one policy (a budget per
outcome), one boundary from exception type to outcome (:func:`classify`), refined by the
watchdog's evidence. Hosts a failure is pinned on are marked suspect before the slices go
back, so retries prefer other slices."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import (
    LocalRayletDiedError,
    NodeDiedError,
    ObjectFreedError,
    ObjectLostError,
    RayActorError,
    RayError,
    RayTaskError,
    ReferenceCountingAssertionError,
    TaskCancelledError,
    TaskUnschedulableError,
    WorkerCrashedError,
)

from tpuslice._host.notices import Notice
from tpuslice._host.suspects import Blame, SuspectReason
from tpuslice._reserve.observe import describe_request
from tpuslice._reserve.request import SliceRequest
from tpuslice._reserve.reserve import (
    SliceHandle,
    host_contexts,
    rank_hosts,
    record_of,
    reserve_slices,
)
from tpuslice._reserve.suspects import mark_suspects
from tpuslice._run import observe
from tpuslice._run.health import UnfitSlices, Vetting
from tpuslice._run.observe import AttemptEvent, Outcome
from tpuslice._run.run import check_run_args, launch
from tpuslice._run.watchdog import AttemptWatch, Broken, WatchConfig
from tpuslice._tpu.clock import Clock
from tpuslice._tpu.compat import DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S
from tpuslice.errors import (
    AttemptRecord,
    HostHungError,
    HostLostError,
    InvalidArgumentError,
    ReservationTimeoutError,
    RetriesExhaustedError,
    SliceUnhealthyError,
    first_line,
)
from tpuslice.record import goodput
from tpuslice.record.goodput import Account, AttemptTimes

logger = logging.getLogger(__name__)

READY_BOUND_S = 30.0
"""How long a fresh reservation may take to report ready before its host counts as lost."""
WAIT_SLICE_S = 1.0
"""Longest single ``ray.wait``, so Ctrl-C is seen promptly."""


HOST_LOSS: tuple[type[BaseException], ...] = (
    NodeDiedError,
    LocalRayletDiedError,
    WorkerCrashedError,
    RayActorError,  # ActorDiedError, ActorUnavailableError
    ObjectLostError,  # OwnerDiedError, ObjectFetchTimedOutError, ...
    TaskCancelledError,  # we cancel the rest of a gang once it broke
    HostLostError,
)
"""Exception types that mean "a host of the gang is gone"."""
NOT_HOST_LOSS: tuple[type[BaseException], ...] = (ObjectFreedError, ReferenceCountingAssertionError)
"""Subclasses of :data:`HOST_LOSS` types that a program (or a Ray bug) causes, not a host."""


def classify(exc: BaseException) -> Outcome:
    """The outcome of a task's exception, by type only (never its message).

    A ``RayTaskError`` is judged by its innermost ``cause`` (user code may have seen a host
    loss in a nested ``ray.get``); an actor whose ``__init__`` raised is a user failure.

    Args:
        exc: The exception a task's ref raised.

    Returns:
        ``HOST_FAILURE`` for a lost host, ``HANG`` for a hang, else ``FAILURE``.
    """
    exc = _innermost(exc)
    if isinstance(exc, RayTaskError):  # no cause to judge by
        return Outcome.FAILURE
    if isinstance(exc, RayActorError) and exc.actor_init_failed:
        return Outcome.FAILURE
    if isinstance(exc, HostHungError):
        return Outcome.HANG
    if isinstance(exc, HOST_LOSS) and not isinstance(exc, NOT_HOST_LOSS):
        return Outcome.HOST_FAILURE
    return Outcome.FAILURE


def _innermost(exc: BaseException) -> BaseException:
    """The innermost cause of nested ``RayTaskError`` (the last one if it has none)."""
    seen: set[int] = set()
    while isinstance(exc, RayTaskError) and id(exc) not in seen:
        seen.add(id(exc))
        cause = getattr(exc, "cause", None)
        if not isinstance(cause, BaseException):
            break
        exc = cause
    return exc


def pinned_on_host(exc: BaseException) -> SuspectReason | None:
    """Why a task's own exception (by type) makes its host suspect, or ``None``. A wrapped
    one does not: the nested task that failed may have run anywhere."""
    if isinstance(exc, WorkerCrashedError):
        return SuspectReason.WORKER_CRASH
    if isinstance(exc, NodeDiedError | TaskUnschedulableError):
        # A gang's task in its rank's bundle is unschedulable once that bundle's node is
        # dead (Ray fails it at once rather than wait).
        return SuspectReason.HOST_FAILURE
    return None


def summarize(exc: BaseException) -> str:
    """``ValueError: first line`` of the innermost cause (a ``RayTaskError``'s own text
    is a traceback), for logs, events and error messages."""
    exc = _innermost(exc)
    line = first_line(exc, limit=10_000)
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__


@dataclass(frozen=True)
class Decision:
    """What to do after a failed attempt, and why (for logs, events and errors)."""

    retry: bool
    delay_s: float
    reason: str


@dataclass(frozen=True)
class RetryPolicy:
    """A retry budget per outcome, counted separately. Pure. The host-failure budget
    defaults to the preemption one, the hang budget to the host-failure one. ``backoff_s``
    is ``(first, cap)``; the pause doubles per retry."""

    max_retries_failure: int = 0
    max_retries_preemption: int = 3
    backoff_s: tuple[float, float] = (0.2, 5.0)
    max_retries_host_failure: int | None = None
    max_retries_hang: int | None = None

    def __post_init__(self) -> None:
        optional = ("max_retries_host_failure", "max_retries_hang")
        for name in ("max_retries_failure", "max_retries_preemption", *optional):
            value = getattr(self, name)
            if value is None and name in optional:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidArgumentError(f"{name} must be an integer >= 0, got {value!r}")
        first, cap = self.backoff_s
        if not 0 <= first <= cap:
            raise InvalidArgumentError(
                f"backoff_s must be (first, cap) with 0 <= first <= cap, got {self.backoff_s!r}"
            )

    def budget(self, outcome: Outcome) -> int:
        """Retries allowed for failed attempts of this outcome."""
        if outcome is Outcome.FAILURE:
            return self.max_retries_failure
        budget = self.max_retries_preemption  # hangs fall back to host failures, those to it
        if outcome is not Outcome.PREEMPTION and self.max_retries_host_failure is not None:
            budget = self.max_retries_host_failure
        if outcome is Outcome.HANG and self.max_retries_hang is not None:
            budget = self.max_retries_hang
        return budget

    def decide(self, outcome: Outcome, failures: Mapping[Outcome, int]) -> Decision:
        """Retry, after the backoff, while that outcome's count of ``failures`` (this one
        included) is within its budget."""
        used, budget = failures.get(outcome, 0), self.budget(outcome)
        if used > budget:
            plural = "retry" if budget == 1 else "retries"
            return Decision(False, 0.0, f"{outcome.value} budget of {budget} {plural} used up")
        retries = sum(failures.values())
        first, cap = self.backoff_s
        delay = min(first * 2 ** (retries - 1), cap)
        return Decision(True, delay, f"{outcome.value} retry {used} of {budget}")


EventCallback = Callable[[AttemptEvent], None]


class GangBrokenError(Exception):
    """Raised by an attempt body when the gang failed, with the outcome, cause, evidence
    and the hosts to mark suspect. Chain the task's exception: the final error keeps it."""

    def __init__(
        self, outcome: Outcome, cause: str, evidence: str = "", blamed: tuple[Blame, ...] = ()
    ) -> None:
        super().__init__(cause)
        self.outcome = outcome
        self.cause = cause
        self.evidence = evidence
        self.blamed = blamed

    @classmethod
    def from_task(cls, spg: SliceHandle, rank: int, exc: BaseException) -> GangBrokenError:
        """The error for rank ``rank``'s task raising ``exc`` (chain ``exc`` to it):
        classified, and blamed on its host if :func:`pinned_on_host` says so."""
        where = host_contexts(record_of(spg))[rank].describe()
        cause = f"{where}: {summarize(exc)}"
        reason = pinned_on_host(exc)
        if reason is None:
            return cls(classify(exc), cause)
        host = rank_hosts(record_of(spg))[rank]
        worker = -1 if host.worker_id is None else host.worker_id
        blame = Blame(host.node_id, host.slice_name, worker, reason, cause)
        return cls(Outcome.HOST_FAILURE, cause, blamed=(blame,))


AttemptBody = Callable[[SliceHandle, AttemptWatch], list[Any]]
"""One watched attempt: the results in rank order, or :class:`GangBrokenError` at the first
failed task (a body calls :func:`watched` while it waits and passes a lost host through
:func:`judged`)."""


def _watch_gang(
    config: WatchConfig, spg: SliceHandle, notice_event: Callable[[Notice], object]
) -> AttemptWatch:
    ranks = [context.describe() for context in host_contexts(record_of(spg))]
    hosts = rank_hosts(record_of(spg))
    nodes = [host.node_id for host in hosts]
    return AttemptWatch(config, nodes, ranks, notice_event, hosts=hosts)


def judged(broken: GangBrokenError, watch: AttemptWatch) -> GangBrokenError:
    """A lost host's outcome, by the evidence: a preemption if a host of the attempt had a
    notice (nobody blamed), else a host failure blamed on the pinned host or the hosts Ray
    sees dead. Other outcomes pass unchanged."""
    if broken.outcome is not Outcome.HOST_FAILURE:
        return broken
    preempted, evidence = watch.judge_host_loss()
    if preempted:
        return GangBrokenError(Outcome.PREEMPTION, broken.cause, evidence)
    blamed = broken.blamed or watch.lost_hosts(broken.cause)
    return GangBrokenError(Outcome.HOST_FAILURE, broken.cause, evidence, blamed)


def watched(watch: AttemptWatch) -> None:
    """Check the gang's watch, turning a notice or a hang into a :class:`GangBrokenError`."""
    try:
        watch.check()
    except Broken as stop:
        outcome = Outcome.PREEMPTION if stop.kind == "notice" else Outcome.HANG
        raise GangBrokenError(outcome, stop.cause, stop.evidence, stop.blamed) from None


def _arrival_of(spg: SliceHandle) -> int | None:
    """Its place in the queue's arrival order; ``None`` if it did not queue (or a stand-in)."""
    return record_of(spg).arrival if isinstance(spg, SliceHandle) else None


@dataclass
class ResilientRun:
    """One resilient run: an attempt body retried under a policy. Fields after ``clock``
    are state, or seams for tests."""

    body: AttemptBody
    request: SliceRequest
    policy: RetryPolicy
    on_event: EventCallback | None = None
    clock: Clock = field(default_factory=Clock)
    history: list[AttemptRecord] = field(default_factory=list)
    last_error: BaseException | None = None
    """The exception that ended the latest failed attempt (chained to the final error)."""
    reserve: Callable[[SliceRequest], SliceHandle] = reserve_slices
    watching: WatchConfig = field(default_factory=WatchConfig)
    make_watch: Callable[[WatchConfig, SliceHandle, Callable[[Notice], object]], AttemptWatch] = (
        _watch_gang
    )
    mark: Callable[[Sequence[Blame]], object] = mark_suspects
    vetting: Vetting | None = None
    """Health checks before a retry lands on a doubtful slice (``health_check=True``)."""
    kind: str = "resilient"
    """What the run is, in its goodput account (``resilient`` or ``command``)."""
    run_id: str = field(default_factory=goodput.new_run_id)
    wall: Callable[[], float] = goodput.now
    """Wall-clock seconds, as the gang's beats are."""
    times: list[AttemptTimes] = field(default_factory=list)
    account: Account | None = None
    on_account: Callable[[Account], object] | None = None
    arrival: Callable[[SliceHandle], int | None] = _arrival_of
    first_arrival: int | None = None
    """The first attempt's place in the queue: a retry after a preemption queues there again."""

    def until_done(self) -> list[Any]:
        """The one retry loop: attempt, and on failure ask the policy whether to go on."""
        failures: Counter[Outcome] = Counter()
        ended = "interrupted"
        try:
            while True:
                attempt = len(self.history) + 1
                try:
                    result = self._attempt(attempt)
                except ReservationTimeoutError as exc:
                    ended = "gave_up"
                    self._give_up(attempt, f"could not reserve: {summarize(exc)}", None)
                    raise
                if not isinstance(result, AttemptRecord):
                    ended = "success"
                    return result
                self.history.append(result)
                outcome = Outcome(result.outcome)
                failures[outcome] += 1
                decision = self.policy.decide(outcome, failures)
                self._report_failure(result, outcome, decision)
                if not decision.retry:
                    ended = "gave_up"
                    message = self._give_up(attempt, decision.reason, outcome)
                    raise RetriesExhaustedError(message, self.history) from self.last_error
                self.clock.sleep(decision.delay_s)
        except RetriesExhaustedError as exc:
            ended = "gave_up"
            exc.account = self._close_account(ended)
            raise
        finally:
            if self.account is None:
                self._close_account(ended)

    def _close_account(self, outcome: str) -> Account | None:
        """Make and keep the run's goodput account (``None`` if no attempt began); never
        raises into the run."""
        if not self.times:
            return None
        try:
            now = self.wall()
            last = self.times[-1]
            last.ended = now if last.ended is None else last.ended
            if last.held is not None:  # interrupted: the attempt's open moments end now
                last.hand_back = now if last.hand_back is None else last.hand_back
                last.handed_back = now if last.handed_back is None else last.handed_back
            what = describe_request(self.request)[0]
            self.account = goodput.account_of(
                self.run_id, self.kind, self.times, what=what, outcome=outcome
            )
            self.account = goodput.keep(self.account)
        except Exception as exc:  # noqa: BLE001 - the account must not break the run's end
            logger.warning("run %s: goodput account not kept: %s", self.run_id, exc)
            return None
        if self.on_account is not None:
            try:
                self.on_account(self.account)
            except Exception:  # the user's callback: logged, never the run's end
                logger.exception("run %s: on_account raised", self.run_id)
        return self.account

    def _attempt(self, number: int) -> list[Any] | AttemptRecord:
        """Reserve (vetting the slices if asked), run: the results, or the failed
        attempt's record once its slices are given back."""
        started = self.clock.now()
        request = self.request
        preempted = bool(self.history) and self.history[-1].outcome is Outcome.PREEMPTION
        if preempted and self.first_arrival is not None:  # back to its place in the queue
            request = dataclasses.replace(request, arrival_ns=self.first_arrival)
        times = AttemptTimes(asked=self.wall())
        self.times.append(times)
        while True:
            # Entered first, left last: what is pushed on it runs after the hand-back.
            with contextlib.ExitStack() as after_hand_back:
                try:
                    reservation = self.reserve(request)
                except ReservationTimeoutError:
                    times.ended = self.wall()
                    raise
                with reservation as spg:
                    times.held = self.wall()
                    times.queued_s += record_of(spg).queued_s if isinstance(spg, SliceHandle) else 0
                    if self.first_arrival is None:
                        self.first_arrival = self.arrival(spg)
                    names = times.slices = tuple(spg.slice_names)
                    try:
                        checked = self.vetting.vet(spg) if self.vetting is not None else ""
                    except UnfitSlices as unfit:
                        failed_check = unfit
                    else:
                        return self._run_on(
                            spg, number, names, checked, started, after_hand_back, times
                        )
            self._unfit(number, names, failed_check)

    def _unfit(self, number: int, names: tuple[str, ...], unfit: UnfitSlices) -> None:
        """Report a failed health check; raise ``SliceUnhealthyError`` if those slices had
        failed before in this run (nothing else could serve)."""
        if not unfit.again:
            next_action = "reserve again, away from the failed hosts"
            self._emit(AttemptEvent("check_failed", number, names, None, unfit.cause, next_action))
            return
        reason = (
            f"health check failed again: {unfit.cause}; no other slice could serve the "
            "retry. They stay out of service until their cool-down ends, or "
            f"`tpuslice health --clear {' '.join(r.slice_name for r in unfit.failed)}` "
            "once fixed"
        )
        message = self._give_up(number, reason, None)
        raise SliceUnhealthyError(message, self.history) from self.last_error

    def _run_on(
        self,
        spg: SliceHandle,
        number: int,
        names: tuple[str, ...],
        checked: str,
        started: float,
        after_hand_back: contextlib.ExitStack,
        times: AttemptTimes,
    ) -> list[Any] | AttemptRecord:
        """Run one attempt on its held reservation. The heartbeat keys are deleted in
        ``after_hand_back``: a task still running would publish its key again."""
        self._emit(AttemptEvent("started", number, names, cause=checked))
        watch = self._watch_for(spg, number, names, started)
        # After the hand-back, last pushed first (so the slices are not held for the read).
        after_hand_back.callback(watch.close)
        after_hand_back.callback(lambda: setattr(times, "progress", watch.progress()))
        after_hand_back.callback(lambda: setattr(times, "handed_back", self.wall()))
        try:
            results = self.body(spg, watch)
        except GangBrokenError as broken:
            times.ended = self.wall()
            times.outcome = broken.outcome.value
            failed, self.last_error = broken, broken.__cause__
            if broken.blamed:  # before the hand-back: nobody is granted them meanwhile
                self.mark(broken.blamed)
        except BaseException:  # an interrupt: the hand-back follows at once
            times.ended = times.hand_back = self.wall()
            raise
        else:
            times.ended = self.wall()
            times.outcome = "success"
            elapsed = self.clock.now() - started
            self._emit(AttemptEvent("succeeded", number, names, duration_s=elapsed))
            times.hand_back = self.wall()
            return results
        elapsed = self.clock.now() - started
        if self.vetting is not None:
            on_hosts = failed.outcome in (Outcome.HANG, Outcome.HOST_FAILURE)
            self.vetting.attempt_failed(names, on_hosts)
        times.hand_back = self.wall()
        return AttemptRecord(
            number, names, spg.num_hosts, failed.outcome, failed.cause, elapsed, failed.evidence
        )

    def _watch_for(
        self, spg: SliceHandle, number: int, names: tuple[str, ...], started: float
    ) -> AttemptWatch:
        """The watch of one attempt's gang, emitting its ``notice`` event."""

        def notice_event(notice: Notice) -> AttemptEvent:
            hook = "on_notice, then " if self.watching.on_notice is not None else ""
            event = AttemptEvent(
                "notice",
                number,
                names,
                Outcome.PREEMPTION,
                notice.describe(),
                f"{hook}leave the slices and retry on others",
                self.clock.now() - started,
                evidence=f"{notice.event} on {notice.slice_name} host {notice.worker_id}",
                notice=notice,
            )
            self._emit(event)
            return event

        return self.make_watch(self.watching, spg, notice_event)

    def _report_failure(self, record: AttemptRecord, outcome: Outcome, decision: Decision) -> None:
        """Emit the ``failed`` event of an attempt, with what happens next."""
        action = (
            f"retry in {decision.delay_s:.1f} s on whole idle slices ({decision.reason})"
            if decision.retry
            else f"give up ({decision.reason})"
        )
        self._emit(
            AttemptEvent(
                "failed",
                record.attempt,
                record.slice_names,
                outcome,
                record.cause,
                action,
                record.duration_s,
                evidence=record.evidence,
            )
        )

    def _give_up(self, attempt: int, reason: str, outcome: Outcome | None) -> str:
        """Emit the final event; return the error message, naming every attempt."""
        self._emit(AttemptEvent("giving_up", attempt, (), outcome, reason, "raise"))
        attempts = "; ".join(
            f"#{r.attempt} on {', '.join(r.slice_names)}: {Outcome(r.outcome).value} after "
            f"{r.duration_s:.1f} s ({r.cause})"
            for r in self.history
        )
        return (
            f"gave up after {len(self.history)} failed attempt(s): {reason}"
            + (f". Attempts: {attempts}" if attempts else "")
            + ". Raise max_retries_failure / max_retries_preemption to retry more"
        )

    def _emit(self, event: AttemptEvent) -> None:
        """Log the event, record it, and pass it on to ``on_event``."""
        logger.info("%s", event.describe())
        observe.attempt(event)
        if self.on_event is not None:
            self.on_event(event)


def _run_function(
    fn: Any, args: Sequence[Any], kwargs: Mapping[str, Any], spg: SliceHandle, watch: AttemptWatch
) -> list[Any]:
    """:func:`run_resilient`'s attempt body: ``fn`` on every host, results collected as
    tasks finish, the watch checked while waiting."""
    # Plain tasks on warm workers; the attempt's hand-back stops any that opened a TPU.
    if not spg.wait_ready(READY_BOUND_S):  # a host died between reserving and starting
        lost = HostLostError(f"a host of {', '.join(spg.slice_names)} died before the start")
        raise judged(GangBrokenError(Outcome.HOST_FAILURE, summarize(lost)), watch)
    refs = launch(fn, spg, args, kwargs, rank_env=lambda context: watch.rank_env(context.rank))
    rank_of = {ref: rank for rank, ref in enumerate(refs)}
    results: dict[int, Any] = {}
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=WAIT_SLICE_S)
        for ref in ready:
            try:
                results[rank_of[ref]] = ray.get(ref)
            except RayError as exc:
                raise judged(GangBrokenError.from_task(spg, rank_of[ref], exc), watch) from exc
        if pending:
            watched(watch)
    return [results[rank] for rank in range(len(refs))]


new_clock: Callable[[], Clock] = Clock
"""Makes each resilient run's clock; tests replace it here, not through ``run_resilient``."""


def run_resilient(
    fn: Any,
    *args: Any,
    topology: str,
    accelerator_version: str,
    num_slices: int | tuple[int, int] = 1,
    chips_per_vm: int | None = None,
    max_retries_failure: int = 0,
    max_retries_preemption: int = 3,
    head_reservation_timeout_s: float | None = DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S,
    backoff_s: tuple[float, float] = (0.2, 5.0),
    on_event: EventCallback | None = None,
    priority: int = 0,
    max_retries_host_failure: int | None = None,
    max_retries_hang: int | None = None,
    on_notice: EventCallback | None = None,
    heartbeat_timeout_s: float | None = None,
    startup_timeout_s: float | None = None,
    health_check: bool = False,
    on_account: Callable[[Account], object] | None = None,
    tenant: str | None = None,
    preemptible: bool = True,
    **kwargs: Any,
) -> list[Any]:
    """Run ``fn`` on every host of whole slices and return its results in rank order,
    rerunning the whole gang on fresh slices when a host is lost, warned, hangs, or the
    code raises, each within its budget.

    Args:
        fn: A ``@ray.remote`` function.
        *args: Passed to every call of ``fn``.
        topology: Chip grid of one slice, such as ``"4x4"``.
        accelerator_version: TPU generation, such as ``"v6e"``.
        num_slices: Slices per attempt, or ``(min, max)``: as many as are idle.
        chips_per_vm: Chips per host, for shapes offered in more than one form.
        max_retries_failure: Reruns after the code raised.
        max_retries_preemption: Reruns after a notice on a host, or a host lost after one.
        head_reservation_timeout_s: Seconds each attempt waits for slices (``None``: no limit).
        backoff_s: ``(first, cap)`` pause before a retry; it doubles per retry.
        on_event: Called with each :class:`AttemptEvent`.
        priority: Place in the cluster-wide queue: higher first, then arrival order.
        max_retries_host_failure: Reruns after a host lost with no notice (default: preemption's).
        max_retries_hang: Reruns after a hang (default: the host-failure budget).
        on_notice: Called on a notice, while the hosts live, to checkpoint (until 2 s before).
        heartbeat_timeout_s: A rank silent this long after a :func:`tpuslice.heartbeat` hangs.
        startup_timeout_s: A rank with no beat this long after the start hangs.
        health_check: Check a doubtful slice before a retry runs on it; failed ones stay out.
        on_account: Called with the run's goodput account when it ends (also ``exc.account``).
        tenant: Whom the slices are charged to (default: ``TPUSLICE_TENANT``, else the user).
        preemptible: Whether the queue may preempt an attempt, with notice.
        **kwargs: Passed to every call of ``fn``.

    Returns:
        The successful attempt's results, in rank order.

    Raises:
        TypeError: ``fn`` is not a remote function.
        InvalidArgumentError: an invalid shape, count, budget or backoff.
        RetriesExhaustedError: a budget ran out (``history`` lists every attempt).
        ReservationTimeoutError: an attempt could not reserve its slices in time.
        SliceUnhealthyError: with ``health_check``, only failed slices were left.
    """
    check_run_args(fn, None, None)
    policy = RetryPolicy(
        max_retries_failure,
        max_retries_preemption,
        backoff_s,
        max_retries_host_failure,
        max_retries_hang,
    )
    watching = WatchConfig(heartbeat_timeout_s, startup_timeout_s, on_notice)
    request = SliceRequest.for_run(
        topology,
        accelerator_version,
        num_slices,
        chips_per_vm,
        head_reservation_timeout_s,
        priority,
        tenant,
        preemptible,
    )
    body = functools.partial(_run_function, fn, args, kwargs)
    run = ResilientRun(
        body,
        request,
        policy,
        on_event,
        new_clock(),
        watching=watching,
        vetting=Vetting() if health_check else None,
        on_account=on_account,
    )
    return run.until_done()
