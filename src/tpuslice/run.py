"""Run one function on every host of one or more slices, in rank order.

``refs[i]`` is the task of global rank *i* (slice-major, then TPU worker id). Inside each
task, before user code runs, the environment holds the slice context
(:class:`HostContext`) and, for two or more slices, all four ``MEGASCALE_*`` variables.
The context rides into an already-running worker (no fresh process per call): we wrap
the user's function once and set ``os.environ`` around each call.
A one-shot call (no ``tpu_slice``) gives its slice back as soon as the work ends.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from tpuslice import _ray
from tpuslice.compat import (
    DEFAULT_MEGASCALE_PORT,
    DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S,
    get_tpu_coordinator_env_vars,
)
from tpuslice.errors import (
    InvalidArgumentError,
    NotConnectedError,
    ReservationTimeoutError,
)
from tpuslice.request import SliceRequest
from tpuslice.reserve import SlicePlacementGroup

logger = logging.getLogger(__name__)

ENV_PREFIX = "TPUSLICE_"
MEGASCALE_VARS = (
    "MEGASCALE_COORDINATOR_ADDRESS",
    "MEGASCALE_PORT",
    "MEGASCALE_NUM_SLICES",
    "MEGASCALE_SLICE_ID",
)


@dataclass(frozen=True)
class HostContext:
    """Where this task runs in the gang. Read it with :func:`current_host`."""

    rank: int
    world_size: int
    slice_index: int
    num_slices: int
    slice_name: str
    worker_id: int
    hosts_per_slice: int
    coordinator_address: str
    """Address of slice 0 worker 0 (the MEGASCALE / JAX coordinator host)."""

    def env(self) -> dict[str, str]:
        """``TPUSLICE_*`` variables, plus ``MEGASCALE_*`` for multi-slice runs."""
        env = {f"{ENV_PREFIX}{k.upper()}": str(v) for k, v in asdict(self).items()}
        if self.num_slices > 1:
            env.update(
                get_tpu_coordinator_env_vars(
                    self.coordinator_address,
                    self.num_slices,
                    self.slice_index,
                    DEFAULT_MEGASCALE_PORT,
                )
            )
        return env


def current_host(environ: Mapping[str, str] | None = None) -> HostContext:
    """The :class:`HostContext` of the running task (set by :func:`run_on_slice`)."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for name, kind in HostContext.__annotations__.items():
        raw = environ.get(f"{ENV_PREFIX}{name.upper()}")
        if raw is None:
            raise NotConnectedError(
                "no slice context here: current_host() works inside a task started by "
                "tpuslice.run_on_slice or a SliceActorGroup actor"
            )
        values[name] = int(raw) if kind in ("int", int) else raw
    return HostContext(**values)


def _with_context(function: Callable[..., Any]) -> Callable[..., Any]:
    """The user's function, called with the slice context in ``os.environ`` (stale
    ``MEGASCALE_*`` the context does not set are dropped; all is restored after).

    The wrapper refers to no tpuslice function, only ``os`` and a tuple, so Ray ships it
    by value and a host's worker runs it without importing tpuslice: on the first call of
    a job that import took 50-110 ms per worker process (benchmarks/RESULTS.md).
    """

    def run_in_context(__tpuslice_env: dict[str, str], *args: Any, **kwargs: Any) -> Any:
        saved = {key: os.environ.get(key) for key in {*__tpuslice_env, *MEGASCALE_VARS}}
        for key in MEGASCALE_VARS:
            os.environ.pop(key, None)
        os.environ.update(__tpuslice_env)
        try:
            return function(*args, **kwargs)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    # Keep the user's name for Ray's task listings; no __wrapped__, so Ray checks the
    # arguments against this signature (context first), not the user's.
    run_in_context.__name__ = getattr(function, "__name__", "run_in_context")
    run_in_context.__qualname__ = getattr(function, "__qualname__", "run_in_context")
    run_in_context.__module__ = getattr(function, "__module__", __name__)
    return run_in_context


_WRAPPED: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_WRAPPED_LOCK = threading.Lock()


def _context_remote(fn: Any) -> Any:
    """A remote function running ``fn`` in its slice context; made once per ``fn`` so Ray
    exports it once and reuses warm workers."""
    with _WRAPPED_LOCK:
        wrapped = _WRAPPED.get(fn)
        if wrapped is None:
            function, options = _ray.remote_function_parts(fn)
            wrapped = (
                ray.remote(**options)(_with_context(function))
                if options
                else (ray.remote(_with_context(function)))
            )
            _WRAPPED[fn] = wrapped
        return wrapped


def host_contexts(spg: SlicePlacementGroup) -> list[HostContext]:
    """One context per bundle, in rank order. Pure given the reservation."""
    plan = spg.plan
    slices = spg.slices
    coordinator = slices[0].hosts[0].address if slices else ""
    contexts: list[HostContext] = []
    for slice_index, info in enumerate(slices):
        for k in range(plan.bundles_per_slice):
            contexts.append(
                HostContext(
                    rank=len(contexts),
                    world_size=plan.num_bundles,
                    slice_index=slice_index,
                    num_slices=plan.num_slices,
                    slice_name=info.name,
                    worker_id=k // plan.bundles_per_host,
                    hosts_per_slice=plan.shape.num_hosts,
                    coordinator_address=coordinator,
                )
            )
    return contexts


def check_run_args(fn: Any, tpu_slice: Any, slice_index: int | None) -> None:
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
    if not tpu_slice.plan.pg_per_slice:
        raise InvalidArgumentError(
            "slice_index can only be used when tpu_slice was created with pg_per_slice=True."
        )
    if not 0 <= slice_index < tpu_slice.num_slices:
        raise InvalidArgumentError(
            f"Invalid slice_index {slice_index}. Must be between 0 and {tpu_slice.num_slices - 1}."
        )


def placements(
    spg: SlicePlacementGroup, slice_index: int | None = None
) -> list[tuple[HostContext, dict[str, Any]]]:
    """``(context, task options)`` per rank: the bundle's TPU, no CPU, pinned to its
    bundle, never retried (a retried host task would run outside its gang)."""
    tpu = spg.bundle_resources.get("TPU", spg.devices_per_host)
    result = []
    for context, (pg, bundle) in zip(host_contexts(spg), spg.worker_groups(), strict=True):
        if slice_index is not None and context.slice_index != slice_index:
            continue
        options = {
            "num_cpus": 0,
            "resources": {"TPU": tpu},
            "max_retries": 0,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=bundle
            ),
        }
        result.append((context, options))
    return result


def launch(
    fn: Any,
    spg: SlicePlacementGroup,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    slice_index: int | None = None,
) -> list[ray.ObjectRef]:
    """Start ``fn`` on every bundle of ``spg`` (or one slice of it), in rank order."""
    remote = _context_remote(fn)
    refs = [
        remote.options(**options).remote(context.env(), *args, **kwargs)
        for context, options in placements(spg, slice_index)
    ]
    spg.track(refs)
    return refs


def run_on_slice(
    fn: Any,
    *args: Any,
    topology: str | None = None,
    accelerator_version: str | None = None,
    tpu_slice: SlicePlacementGroup | None = None,
    slice_index: int | None = None,
    num_slices: int = 1,
    chips_per_vm: int | None = None,
    head_reservation_timeout_s: float | None = DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S,
    pg_ready_timeout_s: float | None = None,
    **kwargs: Any,
) -> list[ray.ObjectRef]:
    """Run ``fn`` (a ``@ray.remote`` function) once on every host; ``refs[i]`` is rank i.

    With ``tpu_slice`` the caller's reservation is used and never shut down. Without it,
    a slice is reserved and given back as soon as every task has finished (or any failed).
    """
    check_run_args(fn, tpu_slice, slice_index)
    if tpu_slice is None:
        if topology is None or accelerator_version is None:
            raise InvalidArgumentError(
                "topology and accelerator_version are required when tpu_slice is not provided."
            )
        request = SliceRequest(
            topology=topology,
            accelerator_version=accelerator_version,
            num_slices=num_slices,
            chips_per_vm=chips_per_vm,
            head_reservation_timeout_s=head_reservation_timeout_s,
        )
        spg = SlicePlacementGroup.from_request(request)
        try:
            refs = launch(fn, spg, args, kwargs)
        except BaseException:
            spg.shutdown()
            raise
        RELEASER.release_when_done(refs, spg)
        return refs
    if tpu_slice.is_shut_down:
        raise InvalidArgumentError(
            "The provided tpu_slice has already been shut down. Create a new "
            "SlicePlacementGroup or pass tpu_slice=None to reserve one automatically."
        )
    # With no timeout, Ray blocks until the group is placed; queued tasks wait for their
    # bundles just the same, so we skip that round trip (it is most of our per-call cost).
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
    spg: SlicePlacementGroup


class Releaser:
    """One daemon thread that shuts one-shot slices down when their tasks end.

    Ends means: every task finished, or any task failed (the gang is broken; removing
    the groups stops the rest, whose refs then fail promptly since we never retry them).
    """

    def __init__(self) -> None:
        self._queue: queue.Queue[_OneShot] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.pending: list[_OneShot] = []

    def release_when_done(self, refs: list[ray.ObjectRef], spg: SlicePlacementGroup) -> None:
        self._queue.put(_OneShot(list(refs), spg))
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="tpuslice-releaser", daemon=True
                )
                self._thread.start()

    def _loop(self) -> None:
        while True:
            self._take_new(block=not self.pending)
            if not ray.is_initialized():
                self.pending.clear()
                continue
            refs = [ref for job in self.pending for ref in job.remaining]
            try:
                ready, _ = ray.wait(refs, num_returns=1, timeout=0.2, fetch_local=False)
                if ready:
                    self._settle(set(ready))
            except (ray.exceptions.RayError, ConnectionError) as exc:
                # The cluster went away under us: nothing is left to give back.
                logger.warning(
                    "one-shot releaser stopped tracking %d run(s): %s", len(self.pending), exc
                )
                self.pending.clear()

    def _take_new(self, block: bool) -> None:
        try:
            self.pending.append(self._queue.get(block=block))
            while True:
                self.pending.append(self._queue.get_nowait())
        except queue.Empty:
            return

    def _settle(self, ready: set[ray.ObjectRef]) -> None:
        still = []
        for job in self.pending:
            finished = [r for r in job.remaining if r in ready]
            job.remaining = [r for r in job.remaining if r not in ready]
            if not job.remaining or any(_failed(r) for r in finished):
                job.spg.shutdown()
            else:
                still.append(job)
        self.pending = still


def _failed(ref: ray.ObjectRef) -> bool:
    """Whether a finished task raised. ``ray.wait`` said it is done, so this returns
    quickly (an error, or a value the caller is about to fetch anyway)."""
    try:
        ray.get(ref, timeout=FETCH_BOUND_S)
    except ray.exceptions.GetTimeoutError:
        logger.warning("could not fetch a finished result within %ss", FETCH_BOUND_S)
        return False
    except ray.exceptions.RayError:
        return True
    return False


FETCH_BOUND_S = 10.0


RELEASER = Releaser()
