"""Resilient runs: when a host is lost, give the slices back and rerun the gang from the start.

An SPMD gang cannot go on with a missing host, so every attempt reserves whole idle slices,
runs ``fn`` on every host, and either returns all results or ends at the first failed task.
One loop (:func:`run_resilient`), one policy (:class:`RetryPolicy`, a budget per outcome),
one boundary that maps exceptions to outcomes (:func:`classify`, by type, never message
text), refined by evidence (:mod:`tpuslice._run.watchdog`): a lost host whose slice had a
preemption or maintenance notice is a preemption, one lost without notice a host failure.
While the gang runs, a notice on one of its hosts makes the run call ``on_notice`` and
leave before the hosts go, and silent heartbeats make it a hang.
A hang, a host lost without notice, or a worker that crashed marks the hosts the evidence
names suspect (:mod:`tpuslice._reserve.suspects`) before the slices are given back, so the
retry, and everyone's next reservation, prefer other slices.
Each attempt's reservation is shut down (the rest of its gang cancelled) before the next.
Other runners (the CLI's shell commands) reuse the same loop with their own attempt body:
``ResilientRun(body, SliceRequest(...), RetryPolicy(...)).until_done()``.
"""

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
"""How long a fresh reservation may take to report ready before we call its host lost."""
WAIT_SLICE_S = 1.0
"""Longest single ``ray.wait``, so Ctrl-C is seen promptly while the gang runs."""


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

    A ``RayTaskError`` (user code raised) is judged by its ``cause``, which may itself be
    a host loss seen by user code (a nested ``ray.get``); an actor whose ``__init__``
    raised is a user failure.

    Args:
        exc: The exception a task's ref raised.

    Returns:
        :attr:`Outcome.HOST_FAILURE` for a lost host (evidence of a notice makes it a
        preemption, see :class:`~tpuslice._run.watchdog.AttemptWatch`), else
        :attr:`Outcome.FAILURE`.
    """
    if isinstance(exc, RayTaskError):
        cause = getattr(exc, "cause", None)
        if isinstance(cause, BaseException) and cause is not exc:
            return classify(cause)
        return Outcome.FAILURE
    if isinstance(exc, RayActorError) and exc.actor_init_failed:
        return Outcome.FAILURE
    if isinstance(exc, HostHungError):
        return Outcome.HANG
    if isinstance(exc, HOST_LOSS) and not isinstance(exc, NOT_HOST_LOSS):
        return Outcome.HOST_FAILURE
    return Outcome.FAILURE


def pinned_on_host(exc: BaseException) -> SuspectReason | None:
    """Whether a task's own exception pins the failure on the host it ran on, by type
    only: its node died (or, for a task sent there, was dead), or its worker process
    crashed there. A wrapped one (user code that saw a nested task fail) does not: that
    task may have run anywhere.

    Args:
        exc: The exception a task's ref raised.

    Returns:
        Why its host is suspect, or ``None``.
    """
    if isinstance(exc, WorkerCrashedError):
        return SuspectReason.WORKER_CRASH
    if isinstance(exc, NodeDiedError | TaskUnschedulableError):
        # A gang's task in its rank's bundle is unschedulable once that bundle's node is
        # dead (Ray fails it at once rather than wait).
        return SuspectReason.HOST_FAILURE
    return None


def summarize(exc: BaseException) -> str:
    """``ValueError: first line``: the innermost cause's type and message's first line
    (a ``RayTaskError``'s own text is a traceback, so it is unwrapped).

    Args:
        exc: Any exception.

    Returns:
        One line for logs, events and error messages.
    """
    seen: set[int] = set()
    while isinstance(exc, RayTaskError) and id(exc) not in seen:
        seen.add(id(exc))
        cause = getattr(exc, "cause", None)
        if not isinstance(cause, BaseException):
            break
        exc = cause
    line = first_line(exc, limit=10_000)
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__


# --- the policy ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """What to do after a failed attempt, and why (for logs, events and errors)."""

    retry: bool
    delay_s: float
    reason: str


@dataclass(frozen=True)
class RetryPolicy:
    """A budget per outcome, counted separately. Pure.

    ``max_retries_host_failure`` defaults to ``max_retries_preemption`` (host loss was one
    budget before it could be told from preemption); ``max_retries_hang`` defaults to the
    host-failure budget. ``backoff_s`` is the pause before the first retry and its cap;
    it doubles per retry.
    """

    max_retries_failure: int = 0
    max_retries_preemption: int = 3
    backoff_s: tuple[float, float] = (0.2, 5.0)
    max_retries_host_failure: int | None = None
    max_retries_hang: int | None = None

    def __post_init__(self) -> None:
        for name in (
            "max_retries_failure",
            "max_retries_preemption",
            "max_retries_host_failure",
            "max_retries_hang",
        ):
            value = getattr(self, name)
            if value is None and name in ("max_retries_host_failure", "max_retries_hang"):
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidArgumentError(f"{name} must be an integer >= 0, got {value!r}")
        first, cap = self.backoff_s
        if not 0 <= first <= cap:
            raise InvalidArgumentError(
                f"backoff_s must be (first, cap) with 0 <= first <= cap, got {self.backoff_s!r}"
            )

    def budget(self, outcome: Outcome) -> int:
        """Retries allowed for failed attempts of this outcome.

        Args:
            outcome: How an attempt failed.

        Returns:
            That outcome's budget (see the class docstring for the defaults).
        """
        host_failure = (
            self.max_retries_preemption
            if self.max_retries_host_failure is None
            else self.max_retries_host_failure
        )
        if outcome is Outcome.PREEMPTION:
            return self.max_retries_preemption
        if outcome is Outcome.HOST_FAILURE:
            return host_failure
        if outcome is Outcome.HANG:
            return host_failure if self.max_retries_hang is None else self.max_retries_hang
        return self.max_retries_failure

    def decide(self, outcome: Outcome, failures: Mapping[Outcome, int]) -> Decision:
        """What to do after a failed attempt: retry while that outcome's count is within
        its budget, after a backoff that doubles per retry up to the cap.

        Args:
            outcome: How the attempt failed.
            failures: Failed attempts so far by outcome, this one included.

        Returns:
            Whether to retry, after how long, and why.
        """
        used, budget = failures.get(outcome, 0), self.budget(outcome)
        if used > budget:
            plural = "retry" if budget == 1 else "retries"
            return Decision(False, 0.0, f"{outcome.value} budget of {budget} {plural} used up")
        retries = sum(failures.values())
        first, cap = self.backoff_s
        delay = min(first * 2 ** (retries - 1), cap)
        return Decision(True, delay, f"{outcome.value} retry {used} of {budget}")


EventCallback = Callable[[AttemptEvent], None]


# --- the loop -----------------------------------------------------------------------------


class GangBrokenError(Exception):
    """Raised by an attempt body when the gang failed: the outcome, a one-line cause, the
    evidence for the outcome, and the hosts it pins the failure on (marked suspect by the
    loop). Chain the task's exception (``raise ... from exc``); the final error keeps it."""

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
        """For the task of ``rank`` that raised ``exc``: classified, named by host, and
        blamed on that host if the exception pins it there (:func:`pinned_on_host`).

        Args:
            spg: The attempt's reservation.
            rank: The failed task's rank.
            exc: What its ref raised.

        Returns:
            The error to raise (chain ``exc`` to it).
        """
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
"""One attempt on a held reservation, watched: the results in rank order, or
:class:`GangBrokenError` at the first failed task (a body calls ``watch.check()`` while it
waits, and passes a lost host through :func:`judged`). :func:`run_function` is the usual
one."""


def watch_gang(
    config: WatchConfig, spg: SliceHandle, notice_event: Callable[[Notice], object]
) -> AttemptWatch:
    """The watch of a gang on ``spg``'s hosts, reading Ray's KV store.

    Args:
        config: What to watch for.
        spg: The attempt's reservation.
        notice_event: Emits the run's ``notice`` event.

    Returns:
        The watch.
    """
    ranks = [context.describe() for context in host_contexts(record_of(spg))]
    hosts = rank_hosts(record_of(spg))
    nodes = [host.node_id for host in hosts]
    return AttemptWatch(config, nodes, ranks, notice_event, hosts=hosts)


def judged(broken: GangBrokenError, watch: AttemptWatch) -> GangBrokenError:
    """A lost host's outcome, decided by the evidence: a preemption if a host of the
    attempt had a notice (nobody is blamed: the notice explains it), else a host failure,
    blamed on the host the task's error pinned it on, or else on the hosts of the attempt
    that Ray sees dead. Other outcomes pass unchanged.

    Args:
        broken: What the failed task made of it (:meth:`GangBrokenError.from_task`).
        watch: The attempt's watch.

    Returns:
        The error to raise, with its evidence and the hosts blamed.
    """
    if broken.outcome is not Outcome.HOST_FAILURE:
        return broken
    preempted, evidence = watch.judge_host_loss()
    if preempted:
        return GangBrokenError(Outcome.PREEMPTION, broken.cause, evidence)
    blamed = broken.blamed or watch.lost_hosts(broken.cause)
    return GangBrokenError(Outcome.HOST_FAILURE, broken.cause, evidence, blamed)


def watched(watch: AttemptWatch) -> None:
    """Check the gang's watch; a notice or a hang becomes the loop's signal.

    Args:
        watch: The attempt's watch.

    Raises:
        GangBrokenError: a preemption (notice) or a hang.
    """
    try:
        watch.check()
    except Broken as stop:
        outcome = Outcome.PREEMPTION if stop.kind == "notice" else Outcome.HANG
        raise GangBrokenError(outcome, stop.cause, stop.evidence, stop.blamed) from None


def arrival_of(spg: SliceHandle) -> int | None:
    """A reservation's place in the queue's arrival order (``None`` if it did not wait
    there, or for a stand-in of one).

    Args:
        spg: The reservation.

    Returns:
        The arrival number, or ``None``.
    """
    return record_of(spg).arrival if isinstance(spg, SliceHandle) else None


@dataclass
class ResilientRun:
    """One resilient run: an attempt body retried under a policy, with its history."""

    body: AttemptBody
    request: SliceRequest
    policy: RetryPolicy
    on_event: EventCallback | None = None
    clock: Clock = field(default_factory=Clock)
    history: list[AttemptRecord] = field(default_factory=list)
    last_error: BaseException | None = None
    """The exception that ended the latest failed attempt (chained to the final error)."""
    reserve: Callable[[SliceRequest], SliceHandle] = reserve_slices
    """How each attempt reserves its slices (a seam for tests)."""
    watching: WatchConfig = field(default_factory=WatchConfig)
    """What each attempt's gang is watched for (notices always; heartbeats if set)."""
    make_watch: Callable[[WatchConfig, SliceHandle, Callable[[Notice], object]], AttemptWatch] = (
        watch_gang
    )
    """How each attempt's watch is made (a seam for tests)."""
    mark: Callable[[Sequence[Blame]], object] = mark_suspects
    """Marks the hosts a failed attempt is blamed on suspect (a seam for tests)."""
    vetting: Vetting | None = None
    """Health checks before a retry lands on a doubtful slice (``health_check=True``)."""
    kind: str = "resilient"
    """What the run is, in its goodput account (``resilient`` or ``command``)."""
    run_id: str = field(default_factory=goodput.new_run_id)
    wall: Callable[[], float] = goodput.now
    """Wall-clock seconds, as the gang's beats are (a seam for tests)."""
    times: list[AttemptTimes] = field(default_factory=list)
    """Each attempt's moments, for the run's goodput account."""
    account: Account | None = None
    """The run's goodput account, once it ended."""
    on_account: Callable[[Account], object] | None = None
    """Called with the account when the run ends."""
    arrival: Callable[[SliceHandle], int | None] = arrival_of
    """A reservation's place in the queue's arrival order (a seam for tests)."""
    first_arrival: int | None = None
    """The first attempt's place in the queue, if it waited there: the attempt after a
    preemption queues in it again."""

    def until_done(self) -> list[Any]:
        """The one retry loop: attempt, and on failure ask the policy whether to go on.

        Returns:
            The successful attempt's results, in rank order.

        Raises:
            RetriesExhaustedError: a budget ran out (``history`` has every attempt).
            ReservationTimeoutError: an attempt could not reserve its slices.
        """
        failures: Counter[Outcome] = Counter()
        ended = "interrupted"
        try:
            while True:
                attempt = len(self.history) + 1
                try:
                    result = self.attempt(attempt)
                except ReservationTimeoutError as exc:
                    ended = "gave_up"
                    self.give_up(attempt, f"could not reserve: {summarize(exc)}", None)
                    raise
                if not isinstance(result, AttemptRecord):
                    ended = "success"
                    return result
                self.history.append(result)
                outcome = Outcome(result.outcome)
                failures[outcome] += 1
                decision = self.policy.decide(outcome, failures)
                self.report_failure(result, outcome, decision)
                if not decision.retry:
                    ended = "gave_up"
                    message = self.give_up(attempt, decision.reason, outcome)
                    raise RetriesExhaustedError(message, self.history) from self.last_error
                self.clock.sleep(decision.delay_s)
        except RetriesExhaustedError as exc:
            ended = "gave_up"
            exc.account = self.close_account(ended)
            raise
        finally:
            if self.account is None:
                self.close_account(ended)

    def close_account(self, outcome: str) -> Account | None:
        """Make and keep the run's goodput account (never raising into the run).

        Args:
            outcome: How the run ended (``success``, ``gave_up``, ``interrupted``).

        Returns:
            The account, or ``None`` when no attempt began.
        """
        try:
            return self._account(outcome)
        except Exception as exc:  # noqa: BLE001 - the account must not break the run's end
            logger.warning("run %s: goodput account not kept: %s", self.run_id, exc)
            return None

    def _account(self, outcome: str) -> Account | None:
        if not self.times:
            return None
        now = self.wall()
        last = self.times[-1]
        if last.held is not None:  # interrupted: the attempt's open moments end now
            last.ended = now if last.ended is None else last.ended
            last.hand_back = now if last.hand_back is None else last.hand_back
            last.handed_back = now if last.handed_back is None else last.handed_back
        elif last.ended is None:
            last.ended = now
        self.account = goodput.account_of(
            self.run_id,
            self.kind,
            self.times,
            what=describe_request(self.request)[0],
            outcome=outcome,
        )
        self.account = goodput.keep(self.account)
        if self.on_account is not None:
            try:
                self.on_account(self.account)
            except Exception:  # the user's callback: logged, never the run's end
                logger.exception("run %s: on_account raised", self.run_id)
        return self.account

    def attempt(self, number: int) -> list[Any] | AttemptRecord:
        """Reserve (checking the slices first if the run vets them), run on every host,
        wait.

        Args:
            number: The attempt's number (1 for the first).

        Returns:
            The results in rank order, or the record of a failed attempt once its slices
            are given back (leaving the ``with``).

        Raises:
            ReservationTimeoutError: the slices could not be reserved.
            SliceUnhealthyError: with health checks, the only slices to be had failed
                theirs again.
        """
        started = self.clock.now()
        request = self.request
        preempted = bool(self.history) and self.history[-1].outcome is Outcome.PREEMPTION
        if preempted and self.first_arrival is not None:  # back to its place in the queue
            request = dataclasses.replace(request, arrival_ns=self.first_arrival)
        times = AttemptTimes(asked=self.wall())
        self.times.append(times)
        while True:
            # Entered first, left last: what is pushed on it runs after the hand-back,
            # once the attempt's tasks are stopped.
            with contextlib.ExitStack() as after_hand_back:
                try:
                    reservation = self.reserve(request)
                except ReservationTimeoutError:
                    times.ended = self.wall()
                    raise
                with reservation as spg:
                    times.held = self.wall()
                    times.queued_s += queued_s(spg)
                    if self.first_arrival is None:
                        self.first_arrival = self.arrival(spg)
                    names = times.slices = tuple(spg.slice_names)
                    try:
                        checked = self.vetting.vet(spg) if self.vetting is not None else ""
                    except UnfitSlices as unfit:
                        failed_check = unfit
                    else:
                        return self.run_on(
                            spg, number, names, checked, started, after_hand_back, times
                        )
            self.unfit(number, names, failed_check)

    def unfit(self, number: int, names: tuple[str, ...], unfit: UnfitSlices) -> None:
        """A reservation failed its health check (now given back): say so, and reserve
        again, unless the run would only land on slices that failed before.

        Args:
            number: The attempt's number.
            names: The slices checked.
            unfit: What failed.

        Raises:
            SliceUnhealthyError: every slice that failed had failed before in this run.
        """
        if not unfit.again:
            next_action = "reserve again, away from the failed hosts"
            self.emit(AttemptEvent("check_failed", number, names, None, unfit.cause, next_action))
            return
        reason = (
            f"health check failed again: {unfit.cause}; no other slice could serve the "
            "retry. They stay out of service until their cool-down ends, or "
            f"`tpuslice health --clear {' '.join(r.slice_name for r in unfit.failed)}` "
            "once fixed"
        )
        message = self.give_up(number, reason, None)
        raise SliceUnhealthyError(message, self.history) from self.last_error

    def run_on(
        self,
        spg: SliceHandle,
        number: int,
        names: tuple[str, ...],
        checked: str,
        started: float,
        after_hand_back: contextlib.ExitStack,
        times: AttemptTimes,
    ) -> list[Any] | AttemptRecord:
        """Run one attempt on its held reservation.

        Args:
            spg: The reservation.
            number: The attempt's number.
            names: Its slices.
            checked: What its health check found, if one ran (for the ``started`` event).
            started: When the attempt started (the run's clock).
            after_hand_back: Runs what it is given once the reservation is handed back:
                the attempt's heartbeat keys are deleted there, since a task still
                running would publish its key again after an earlier deletion.
            times: The attempt's moments, for the goodput account (filled in).

        Returns:
            The results, or the failed attempt's record.
        """
        self.emit(AttemptEvent("started", number, names, cause=checked))
        watch = self.watch_for(spg, number, names, started)
        # Run after the hand-back, last pushed first: when it ended, what the gang
        # published (read then, so the slices are not held for it), and the keys deleted.
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
            self.emit(AttemptEvent("succeeded", number, names, duration_s=elapsed))
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

    def watch_for(
        self, spg: SliceHandle, number: int, names: tuple[str, ...], started: float
    ) -> AttemptWatch:
        """The watch of one attempt's gang: its hosts, and the ``notice`` event.

        Args:
            spg: The attempt's reservation.
            number: The attempt's number.
            names: Its slices.
            started: When it started (the run's clock).

        Returns:
            The watch.
        """

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
            self.emit(event)
            return event

        return self.make_watch(self.watching, spg, notice_event)

    def report_failure(self, record: AttemptRecord, outcome: Outcome, decision: Decision) -> None:
        """Emit the ``failed`` event of an attempt, with what happens next.

        Args:
            record: The failed attempt.
            outcome: Its class.
            decision: The policy's answer.
        """
        action = (
            f"retry in {decision.delay_s:.1f} s on whole idle slices ({decision.reason})"
            if decision.retry
            else f"give up ({decision.reason})"
        )
        self.emit(
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

    def give_up(self, attempt: int, reason: str, outcome: Outcome | None) -> str:
        """Emit the final event.

        Args:
            attempt: The last attempt's number.
            reason: Why the run stops.
            outcome: The last attempt's class, if it ran.

        Returns:
            The error message, naming every attempt.
        """
        self.emit(AttemptEvent("giving_up", attempt, (), outcome, reason, "raise"))
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

    def emit(self, event: AttemptEvent) -> None:
        """Log the event at INFO and pass it on to ``on_event``.

        Args:
            event: What happened.
        """
        logger.info("%s", event.describe())
        observe.attempt(event)
        if self.on_event is not None:
            self.on_event(event)


def run_function(
    fn: Any,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    spg: SliceHandle,
    watch: AttemptWatch,
) -> list[Any]:
    """The attempt body of :func:`run_resilient`: start ``fn`` on every host and collect
    the results as tasks finish, checking the watch while waiting.

    Args:
        fn: A ``@ray.remote`` function.
        args: Passed to every call.
        kwargs: Passed to every call.
        spg: The attempt's reservation.
        watch: The attempt's watch (notices, heartbeats).

    Returns:
        The results, in rank order.

    Raises:
        GangBrokenError: at the first task that fails (or a host dead at the start), a
            notice on a host of the gang, or a hang.
    """
    # One call per attempt: plain tasks on warm workers (no owner processes to start);
    # the attempt's hand-back stops any of them that opened a TPU.
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


def queued_s(spg: SliceHandle) -> float:
    """How long a reservation waited for its slices (0 for a stand-in of one).

    Args:
        spg: The reservation.

    Returns:
        Seconds.
    """
    return record_of(spg).queued_s if isinstance(spg, SliceHandle) else 0.0


new_clock: Callable[[], Clock] = Clock
"""Makes each resilient run's clock. Tests replace it here, in the private layer, so that
the clock is not a parameter of the public ``run_resilient``."""


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
    rerunning the whole gang from the start on fresh slices when a host is lost, warned
    of preemption or maintenance, hangs, or the code raises, each within its budget.

    Args:
        fn: A ``@ray.remote`` function.
        *args: Passed to every call of ``fn``.
        topology: Chip grid of one slice, such as ``"4x4"``.
        accelerator_version: TPU generation, such as ``"v6e"``.
        num_slices: Whole slices per attempt, or a ``(min, max)`` range: each
            attempt takes as many as are idle (at least ``min``), so after a lost slice
            with no replacement idle the run goes on with fewer, and grows back at the
            next attempt that finds more.
        chips_per_vm: Chips per host, for shapes offered in more than one form.
        max_retries_failure: Reruns after the code raised.
        max_retries_preemption: Reruns after a preemption: a notice on a host of the
            gang (the run leaves before the hosts go), or a host lost after one.
        head_reservation_timeout_s: Seconds each attempt waits for idle slices
            (``None``: no limit).
        backoff_s: ``(first, cap)`` pause before a retry; it doubles per retry.
        on_event: Called with each :class:`AttemptEvent` as it happens.
        priority: Place in the cluster-wide queue when slices are short, for every
            attempt: higher is served first, arrival order within a priority.
        max_retries_host_failure: Reruns after a host was lost with no notice (VM died,
            worker crashed or OOM-killed); ``None``: as ``max_retries_preemption``.
        max_retries_hang: Reruns after a hang; ``None``: as the host-failure budget.
        on_notice: Called with the ``notice`` event when a host of the gang is warned of
            preemption or maintenance, while the hosts still live (to checkpoint); the
            run waits for it until the notice's deadline less 2 s, then leaves.
        heartbeat_timeout_s: With ``fn`` calling :func:`tpuslice.heartbeat` each step:
            a rank silent this long after a beat is a hang (the gang is cancelled and
            rerun). ``None``: not watched.
        startup_timeout_s: A rank that has not beaten this long after the start is stuck
            starting (a hang). ``None``: not watched.
        health_check: Before a retry runs on a slice that is suspect (taken only because
            nothing else could serve in time) or that the last attempt hung or lost a host
            on, check every host of its reservation (:func:`tpuslice.check_slice`'s
            probes). A slice that passes is trusted again; one that fails is kept out of
            service, and the run reserves again elsewhere, or gives up if only failed
            slices are left.
        on_account: Called with the run's goodput account (:class:`tpuslice.Account`:
            where its wall time went) when it ends, however it ends; a run that gives up
            also carries it on the error (``exc.account``). ``tpuslice goodput RUN_ID``
            shows it later. (An argument of ``fn``'s own named ``on_account`` cannot be
            passed through here.)
        tenant: Whom every attempt's slices are charged to, for the cluster's quotas and
            fair share (default: ``TPUSLICE_TENANT``, else the user's name).
        preemptible: Whether the queue may preempt an attempt, with notice, for a
            request of higher priority or a tenant taking back its quota. The run then
            gets the notice as from GCE (``on_notice``), leaves, and counts the attempt as
            a preemption.
        **kwargs: Passed to every call of ``fn``.

    Returns:
        The successful attempt's results, in rank order.

    Raises:
        TypeError: ``fn`` is not a remote function.
        InvalidArgumentError: an invalid shape, count, budget or backoff.
        RetriesExhaustedError: a budget ran out (``history`` lists every attempt).
        ReservationTimeoutError: an attempt could not reserve its slices in time.
        SliceUnhealthyError: with ``health_check``, only slices that failed their check
            were left (a :class:`RetriesExhaustedError`; the message names the hosts).
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
    body = functools.partial(run_function, fn, args, kwargs)
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
