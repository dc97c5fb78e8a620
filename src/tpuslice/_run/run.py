"""Run one function on every host of one or more slices; ``refs[i]`` is global rank *i*.
The slice context rides into a warm worker: the user's function is wrapped once and
``os.environ`` set around each call. A one-shot gives its slices back as the work ends."""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray

from tpuslice._host.context import HostContext, with_context
from tpuslice._host.heartbeats import BEAT_ENV, beat_key
from tpuslice._reserve.request import SliceRequest
from tpuslice._reserve.reserve import (
    SliceHandle,
    actor_group_of,
    ranks,
    record_of,
    reserve_slices,
    track,
)
from tpuslice._reserve.reserve import rank_env as reservation_env
from tpuslice._run import observe
from tpuslice._tpu import _ray
from tpuslice._tpu._connection import Tier, connection
from tpuslice._tpu.compat import DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S
from tpuslice._tpu.keys import BEAT_KEY_PREFIX
from tpuslice._tpu.labels import CallEnv
from tpuslice.errors import InvalidArgumentError, ReservationTimeoutError
from tpuslice.record import goodput

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Wrapped:
    """A remote function running the user's in its slice context, made once per function
    so Ray exports it once and warm workers are reused."""

    remote: Any
    returns: int | None
    """The user's ``num_returns``, the pid riding as one more; ``None``: streaming, no pid."""


class _ContextRemotes:
    """The remote function made for each user function, kept while that function lives."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._made: weakref.WeakKeyDictionary[Any, _Wrapped] = weakref.WeakKeyDictionary()

    def of(self, fn: Any) -> _Wrapped:
        """The remote function that runs ``fn`` in its slice context (made on first use)."""
        with self._lock:
            wrapped = self._made.get(fn)
            if wrapped is None:
                function, options = _ray.remote_function_parts(fn)
                declared = options.get("num_returns", 1)
                returns = declared if isinstance(declared, int) and declared >= 1 else None
                if returns is not None:
                    options["num_returns"] = returns + 1
                remote = ray.remote(**options)(with_context(function, returns))
                wrapped = _Wrapped(remote, returns)
                self._made[fn] = wrapped
            return wrapped


def call_env(spg: SliceHandle, context: HostContext) -> CallEnv:
    """What a rank's call sees set (None: unset): its slice context and the reservation's
    additions (a sub-slice's own ``TPU_*`` values)."""
    return {**context.env(), **reservation_env(record_of(spg), context.rank)}


def check_run_args(fn: Any, tpu_slice: Any, slice_index: int | None) -> None:
    """Check ``run_on_slice``'s arguments as Ray 2.60 does, with the same errors."""
    if not hasattr(fn, "options") or not hasattr(fn, "remote"):
        raise TypeError(
            f"fn must be a @ray.remote-decorated function, but got {type(fn).__name__!r} "
            "which has no .options() method."
        )
    if slice_index is None:
        return
    if tpu_slice is None:
        raise InvalidArgumentError(
            "slice_index can only be used when an existing tpu_slice is provided."
        )
    if not record_of(tpu_slice).plan.pg_per_slice:
        raise InvalidArgumentError(
            "slice_index can only be used when tpu_slice was created with pg_per_slice=True."
        )
    if not 0 <= slice_index < tpu_slice.num_slices:
        raise InvalidArgumentError(
            f"Invalid slice_index {slice_index}. Must be between 0 and {tpu_slice.num_slices - 1}."
        )


def launch(
    fn: Any,
    spg: SliceHandle,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    slice_index: int | None = None,
    *,
    rank_env: Callable[[HostContext], Mapping[str, str]] | None = None,
) -> list[ray.ObjectRef]:
    """Start ``fn`` on every bundle of ``spg`` (or of its slice ``slice_index``), one ref
    per rank in rank order: each task in its bundle, holding its TPU, never retried. ``spg``
    tracks the tasks so its shutdown cancels them; ``rank_env`` adds variables per rank."""
    wrapped = connection().part(_ContextRemotes).of(fn)
    refs: list[Any] = []
    pids: list[tuple[int, ray.ObjectRef]] = []
    for rank in ranks(record_of(spg), slice_index):
        env = call_env(spg, rank.context)
        if rank_env is not None:
            env = {**env, **rank_env(rank.context)}
        out = wrapped.remote.options(**rank.task_options()).remote(env, *args, **kwargs)
        if wrapped.returns is None:
            refs.append(out)
            continue
        *values, pid = out
        refs.append(values[0] if wrapped.returns == 1 else values)
        pids.append((rank.context.rank, pid))
    track(
        record_of(spg), [r for ref in refs for r in (ref if isinstance(ref, list) else [ref])], pids
    )
    return refs


def run_on_slice(
    fn: Any,
    *args: Any,
    topology: str | None = None,
    accelerator_version: str | None = None,
    tpu_slice: SliceHandle | None = None,
    slice_index: int | None = None,
    num_slices: int | tuple[int, int] = 1,
    chips_per_vm: int | None = None,
    head_reservation_timeout_s: float | None = DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S,
    pg_ready_timeout_s: float | None = None,
    priority: int = 0,
    tenant: str | None = None,
    preemptible: bool = False,
    **kwargs: Any,
) -> list[ray.ObjectRef]:
    """Run ``fn`` once on every host of one or more slices; ``refs[i]`` is rank *i*.

    With ``tpu_slice`` the caller's reservation is used and never shut down. Without it,
    slices are reserved (a one-shot) and given back once every task finished or one failed.
    The one-shot arguments are ignored with ``tpu_slice``.

    Args:
        fn: A ``@ray.remote`` function.
        *args: Passed to every call of ``fn``.
        topology: Chip grid of one slice (``"4x4"``); required without ``tpu_slice``.
        accelerator_version: TPU generation (``"v6e"``); required without ``tpu_slice``.
        tpu_slice: A held :class:`~tpuslice.SlicePlacementGroup` to run on.
        slice_index: With a ``pg_per_slice`` ``tpu_slice``: run on that slice only.
        num_slices: A one-shot's slices, or ``(min, max)``: as many as are idle.
        chips_per_vm: Chips per host for a one-shot.
        head_reservation_timeout_s: Seconds a one-shot waits for slices (``None``: no limit).
        pg_ready_timeout_s: With ``tpu_slice``: first wait this long for it to be placed.
        priority: A one-shot's place in the cluster-wide queue: higher first, then arrival.
        tenant: Whom a one-shot's slices are charged to (default: ``TPUSLICE_TENANT``).
        preemptible: Whether the queue may preempt a one-shot, with notice.
        **kwargs: Passed to every call of ``fn``.

    Returns:
        One ``ObjectRef`` per host, in rank order (slice-major, then TPU worker id).

    Raises:
        TypeError: ``fn`` is not a remote function.
        InvalidArgumentError: a missing shape, a ``tpu_slice`` shut down or held by a
            :class:`~tpuslice.SliceActorGroup`, or a bad ``slice_index`` or shape.
        NotConnectedError: Ray is not initialised.
        InsufficientSlicesError: a one-shot asks for slices the cluster cannot have.
        ReservationTimeoutError: no idle slices in time, or ``tpu_slice`` not ready.
    """
    check_run_args(fn, tpu_slice, slice_index)
    if tpu_slice is None:
        if topology is None or accelerator_version is None:
            raise InvalidArgumentError(
                "topology and accelerator_version are required when tpu_slice is not provided."
            )
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
        spg = reserve_slices(request)
        beats = f"{BEAT_KEY_PREFIX}{goodput.new_run_id()}/"
        keys: list[str] = []

        def rank_env(context: HostContext) -> dict[str, str]:
            keys.append(beat_key(beats, context.rank, context.slice_name))
            return {BEAT_ENV: keys[-1]}

        try:
            refs = launch(fn, spg, args, kwargs, rank_env=rank_env)
        except BaseException:
            spg.shutdown()
            raise
        connection().part(Releaser).release_when_done(refs, spg, (beats, tuple(keys)))
        return refs
    if tpu_slice.is_shut_down:
        raise InvalidArgumentError(
            "The provided tpu_slice has already been shut down. Create a new "
            "SlicePlacementGroup or pass tpu_slice=None to reserve one automatically."
        )
    if actor_group_of(record_of(tpu_slice)) is not None:
        raise InvalidArgumentError(
            "this slice's TPUs are held by its SliceActorGroup's actors: call their "
            "methods (group.call or the actors), or shut the group down first"
        )
    # Queued tasks wait for their bundles anyway, so by default we skip that round trip.
    if pg_ready_timeout_s is not None and not tpu_slice.wait_ready(pg_ready_timeout_s):
        raise ReservationTimeoutError(
            f"TPU slice placement group was not ready within {pg_ready_timeout_s}s: a host of "
            f"{', '.join(tpu_slice.slice_names)} may have died"
        )
    return launch(fn, tpu_slice, args, kwargs, slice_index)


dispatch = run_on_slice
"""The original name of :func:`run_on_slice` (a plain alias, no deprecation warning)."""


@dataclass
class _OneShot:
    remaining: list[ray.ObjectRef]
    spg: SliceHandle
    beats: tuple[str, tuple[str, ...]] = ("", ())
    """Its ranks' heartbeat keys' prefix, and each rank's key (for its account)."""
    started: float = field(default_factory=time.monotonic)

    def hand_back(self, outcome: str) -> Callable[[], None]:
        """Give the slices back; return what keeps the goodput account, to call once
        every one-shot that ended with this one is back (the read delays none)."""
        names = list(self.spg.slice_names)  # none once shut down
        times = observe.one_shot_times(self.spg, outcome)  # read before the shutdown too
        observe.run_ended("one_shot", outcome, time.monotonic() - self.started, names)
        self.spg.shutdown()
        prefix, keys = self.beats
        if times is None or not prefix:  # nothing to account for, or no keys to read
            return lambda: None
        times.handed_back = goodput.now()
        return functools.partial(observe.one_shot_account, self.spg, times, prefix, keys)


CLOSE_TIMEOUT_S = 30.0
"""At exit, how long to wait for a hand-back in progress."""


class Releaser:
    """One daemon thread that gives one-shots back when every task finished or any failed.
    A holder of the connection: :meth:`close` stops the thread between two Ray calls (a
    call after Ray shut down is fatal) and gives back what is still held."""

    tier = Tier.HOLDER

    def __init__(self) -> None:
        self._queue: queue.Queue[_OneShot | None] = queue.Queue()  # None: only a wake-up
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._working = threading.Lock()  # held by the thread while it calls Ray
        self._closed = False
        self.pending: list[_OneShot] = []

    def release_when_done(
        self,
        refs: list[ray.ObjectRef],
        spg: SliceHandle,
        beats: tuple[str, tuple[str, ...]] = ("", ()),
    ) -> None:
        """Shut ``spg`` down in the background once every ref is done, or any failed;
        ``beats``: its ranks' heartbeat keys' prefix, and each rank's key."""
        self._queue.put(_OneShot(list(refs), spg, beats))
        with self._lock:
            if self._closed:
                return  # exiting: close() gives it back
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="tpuslice-releaser", daemon=True
                )
                self._thread.start()

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Stop the thread, waiting up to ``timeout_s`` for it to be between two Ray calls,
        then give back here every one-shot still held."""
        with self._lock:
            self._closed = True
        if not self._working.acquire(timeout=timeout_s):
            logger.warning("a one-shot hand-back still running at exit after %.0f s", timeout_s)
            return
        try:
            self._take_new(block=False)
            pending, self.pending = self.pending, []
            for job in pending:
                if not ray.is_initialized():
                    return
                job.hand_back("interrupted")()
        finally:
            self._working.release()

    def drop(self) -> None:
        """Stop the thread at its next step, giving nothing back (the cluster is not ours)."""
        with self._lock:
            self._closed = True
        self._queue.put(None)

    def _loop(self) -> None:
        while True:
            self._take_new(block=not self.pending)
            with self._working:
                if self._closed:
                    return
                if not ray.is_initialized():
                    self.pending.clear()
                    continue
                self._poll()

    def _poll(self) -> None:
        refs = [ref for job in self.pending for ref in job.remaining]
        try:
            ready, _ = ray.wait(refs, num_returns=1, timeout=0.2, fetch_local=False)
            if ready:
                self._settle(set(ready))
        except (ray.exceptions.RayError, ConnectionError) as exc:
            # The cluster went away: nothing is left to give back.
            logger.warning(
                "one-shot releaser stopped tracking %d run(s): %s", len(self.pending), exc
            )
            self.pending.clear()

    def _take_new(self, block: bool) -> None:
        taken: list[_OneShot | None] = []
        try:
            taken.append(self._queue.get(block=block))
            while True:
                taken.append(self._queue.get_nowait())
        except queue.Empty:
            self.pending.extend(job for job in taken if job is not None)

    def _settle(self, ready: set[ray.ObjectRef]) -> None:
        still = []
        accounts = []
        for job in self.pending:
            finished = [r for r in job.remaining if r in ready]
            job.remaining = [r for r in job.remaining if r not in ready]
            failed = any(_failed(r) for r in finished)
            if not job.remaining or failed:
                accounts.append(job.hand_back("failure" if failed else "success"))
            else:
                still.append(job)
        self.pending = still
        for keep in accounts:  # every ended one-shot is back first
            keep()


def _failed(ref: ray.ObjectRef) -> bool:
    """Whether a finished task raised (quick: ``ray.wait`` said it is done)."""
    try:
        ray.get(ref, timeout=FETCH_BOUND_S)
    except ray.exceptions.GetTimeoutError:
        logger.warning("could not fetch a finished result within %ss", FETCH_BOUND_S)
        return False
    except ray.exceptions.RayError:
        return True
    return False


FETCH_BOUND_S = 10.0
