"""One actor per host of a reserved slice, in rank order, for stateful work over many steps;
each starts with the same slice context as :func:`tpuslice.run_on_slice` tasks."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any

import ray

from tpuslice._host.context import MEGASCALE_VARS, HostContext
from tpuslice._host.heartbeats import BEAT_ENV, beat_key
from tpuslice._reserve.observe import describe_request
from tpuslice._reserve.request import SliceRequest
from tpuslice._reserve.reserve import (
    ShutsDownOnExit,
    SliceHandle,
    confirm_free,
    drop_actor_group,
    hold_for_actor_group,
    ranks,
    record_of,
    reserve,
)
from tpuslice._run.run import call_env
from tpuslice._run.watchdog import CHECK_S, WatchConfig, describe_hang
from tpuslice._tpu import _ray
from tpuslice._tpu.compat import DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S
from tpuslice._tpu.keys import BEAT_KEY_PREFIX as BEAT_PREFIX
from tpuslice._tpu.keys import NAMESPACE
from tpuslice._tpu.labels import CallEnv
from tpuslice.errors import (
    HostHungError,
    HostLostError,
    InvalidArgumentError,
    SliceShutdownError,
    first_line,
)
from tpuslice.record import goodput
from tpuslice.record.goodput import AttemptTimes

logger = logging.getLogger(__name__)


class OwnedSlice(SliceHandle):
    """A reservation made for one actor group: its shutdown gives it back, and its time is
    the group's goodput account's."""


class SliceActorGroup(ShutsDownOnExit):
    """Actors of ``actor_cls`` (a class, or a ``@ray.remote`` one) on every bundle of a held
    ``tpu_slice``, in rank order; ``args`` and ``kwargs`` go to every constructor. With
    ``heartbeat_timeout_s``, :meth:`get` raises ``HostHungError`` for an actor silent that
    long after a :func:`tpuslice.heartbeat`; ``startup_timeout_s``: with no beat since the
    start. A group made by :meth:`create` owns its slices: :meth:`shutdown` gives them back.
    """

    def __init__(
        self,
        actor_cls: Any,
        tpu_slice: SliceHandle,
        *args: Any,
        heartbeat_timeout_s: float | None = None,
        startup_timeout_s: float | None = None,
        **kwargs: Any,
    ) -> None:
        """Start the actors; raises ``SliceShutdownError`` if ``tpu_slice`` was shut down,
        ``InvalidArgumentError`` for a bad timeout or another group on ``tpu_slice``."""
        if tpu_slice.is_shut_down:
            raise SliceShutdownError("tpu_slice has been shut down; reserve a new one")
        self.watching = WatchConfig(heartbeat_timeout_s, startup_timeout_s)
        self._beats = f"{BEAT_PREFIX}{uuid.uuid4().hex[:12]}/"
        self._started = time.time()
        remote_cls = actor_cls if hasattr(actor_cls, "remote") else ray.remote(actor_cls)
        self.slice = tpu_slice
        owns_slice = self._owns_slice = isinstance(tpu_slice, OwnedSlice)
        self.times: AttemptTimes | None = None
        """The group's moments for its goodput account, if it owns its slices."""
        held = record_of(tpu_slice)
        placed = ranks(held)
        self.contexts: list[HostContext] = [rank.context for rank in placed]
        self.actors: list[Any] = []
        try:
            hold_for_actor_group(held, self)
            # One process per host owns a TPU: an idle worker of earlier calls that opened
            # it must let go before the actors start.
            confirm_free(held, after_tasks=True)
            if owns_slice:
                self.times = AttemptTimes(
                    held.asked_at, held.queued_s, held.held_at, only_call=False
                )
            for rank in placed:
                self.actors.append(
                    remote_cls.options(
                        num_cpus=0,
                        resources={"TPU": rank.tpu},
                        max_restarts=0,
                        runtime_env={"env_vars": self._env(rank.context)},
                        scheduling_strategy=rank.strategy(),
                    ).remote(*args, **kwargs)
                )
        except BaseException:
            self.shutdown()
            raise

    @classmethod
    def create(
        cls,
        actor_cls: Any,
        *args: Any,
        topology: str,
        accelerator_version: str,
        num_slices: int | tuple[int, int] = 1,
        chips_per_vm: int | None = None,
        head_reservation_timeout_s: float | None = DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S,
        priority: int = 0,
        heartbeat_timeout_s: float | None = None,
        startup_timeout_s: float | None = None,
        tenant: str | None = None,
        preemptible: bool = False,
        **kwargs: Any,
    ) -> SliceActorGroup:
        """Reserve slices and start the group on them; :meth:`shutdown` gives them back.

        Args:
            actor_cls: A class, or a ``@ray.remote`` actor class.
            *args: Passed to every actor's constructor.
            topology: Chip grid of one slice, such as ``"4x4"``.
            accelerator_version: TPU generation, such as ``"v6e"``.
            num_slices: Whole slices, or ``(min, max)``: as many as are idle.
            chips_per_vm: Chips per host, for shapes offered in more than one form.
            head_reservation_timeout_s: Seconds to wait for slices (``None``: no limit).
            priority: Place in the cluster-wide queue: higher first, then arrival order.
            heartbeat_timeout_s: An actor silent this long after a beat hangs (``None``: off).
            startup_timeout_s: An actor with no beat this long after the start hangs.
            tenant: Whom the slices are charged to (default: ``TPUSLICE_TENANT``).
            preemptible: Whether the queue may preempt the group, with notice.
            **kwargs: Passed to every actor's constructor.

        Returns:
            The group, owning its slices.

        Raises:
            InvalidArgumentError: an invalid shape or count.
            NotConnectedError: Ray is not initialised.
            InsufficientSlicesError: the cluster cannot have the slices.
            ReservationTimeoutError: no idle slices in time.
        """
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
        WatchConfig(heartbeat_timeout_s, startup_timeout_s)  # checked before reserving
        spg = OwnedSlice(reserve(request))
        try:
            return cls(
                actor_cls,
                spg,
                *args,
                heartbeat_timeout_s=heartbeat_timeout_s,
                startup_timeout_s=startup_timeout_s,
                **kwargs,
            )
        except BaseException:
            spg.shutdown()
            raise

    def __len__(self) -> int:
        return len(self.actors)

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[ray.ObjectRef]:
        """Call ``method`` on every actor.

        Args:
            method: Name of the actors' method.
            *args: Passed to every call.
            **kwargs: Passed to every call.

        Returns:
            One ref per actor, in rank order.

        Raises:
            SliceShutdownError: the group was shut down.
            InvalidArgumentError: the actors have no such method.
        """
        if not self.actors:
            raise SliceShutdownError("this SliceActorGroup has been shut down")
        if not hasattr(self.actors[0], method):
            raise InvalidArgumentError(f"the actors have no method {method!r}")
        return [getattr(actor, method).remote(*args, **kwargs) for actor in self.actors]

    def get(self, refs: Sequence[ray.ObjectRef], timeout: float | None = None) -> list[Any]:
        """``ray.get`` the refs in rank order.

        Args:
            refs: Refs from :meth:`call`, in rank order.
            timeout: Seconds to wait for each (``None``: no limit).

        Returns:
            The values, in rank order.

        Raises:
            HostLostError: an actor died (its slice, worker id and rank are named).
            HostHungError: with heartbeats watched, actors went silent (named).
            ray.exceptions.RayTaskError: a method raised (as ``ray.get`` raises it).
            ray.exceptions.GetTimeoutError: ``timeout`` passed.
        """
        if self.watching.beats:
            self._wait_watching(refs, timeout)
        results = []
        for rank, ref in enumerate(refs):
            try:
                results.append(ray.get(ref, timeout=timeout))
            except ray.exceptions.RayActorError as exc:
                context = self.contexts[rank]
                self._ended("host_failure")
                raise HostLostError(
                    f"host {context.worker_id} of slice {context.slice_name} (rank {rank}) "
                    f"lost its actor ({type(exc).__name__}): {first_line(exc)}"
                ) from exc
        if self.times is not None and self.times.first_return is None:
            self.times.first_return = goodput.now()
        return results

    def _env(self, context: HostContext) -> dict[str, str]:
        env = _actor_env(call_env(self.slice, context))
        if self._keyed:
            env[BEAT_ENV] = self._key(context)
        return env

    @property
    def _keyed(self) -> bool:
        """Whether the actors get heartbeat keys: to watch them, or for the account."""
        return self.watching.beats or self.times is not None

    def _key(self, context: HostContext) -> str:
        return beat_key(self._beats, context.rank, context.slice_name)

    def _wait_watching(self, refs: Sequence[ray.ObjectRef], timeout: float | None) -> None:
        """Wait for the refs, checking the actors' heartbeats every ``CHECK_S``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pending = list(refs)
        keys = [self._key(context) for context in self.contexts]
        where = [context.describe() for context in self.contexts]
        while pending:
            wait = CHECK_S if deadline is None else min(CHECK_S, deadline - time.monotonic())
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=max(0.0, wait))
            if not pending:
                return
            beats = _ray.kv_get_many(keys, NAMESPACE)
            hang = describe_hang(self.watching, keys, beats, where, self._started, time.time())
            if hang is not None:
                self._ended("hang")
                raise HostHungError(
                    f"{hang.cause}: {hang.reason}. Shut the group down (its actors are killed) and "
                    "start a new one"
                )
            if deadline is not None and time.monotonic() >= deadline:
                return  # the ray.get below raises GetTimeoutError, as without watching

    def _ended(self, outcome: str) -> None:
        """Note in the goodput account that the group failed (kept at the shutdown)."""
        if self.times is not None:
            self.times.outcome = outcome
            self.times.ended = self.times.ended or goodput.now()

    def shutdown(self) -> None:
        """Kill every actor and give the slice back if owned, else confirm its TPUs free.
        Idempotent."""
        keyed = self._keyed
        actors, self.actors = self.actors, []
        times, self.times = self.times, None
        names = self.slice.slice_names  # none once shut down
        if times is not None and actors:
            times.hand_back = goodput.now()
            times.ended = times.ended or times.hand_back  # a failure seen by get() ended it
        drop_actor_group(record_of(self.slice), self)
        for actor in actors:
            ray.kill(actor, no_restart=True)
        if self._owns_slice:
            self.slice.shutdown()
        elif actors and not self.slice.is_shut_down:
            confirm_free(record_of(self.slice))
        if actors and keyed:
            if times is not None:
                times.handed_back = goodput.now()
                times.slices = tuple(names)
                self._keep_account(times)
            # Last: ray.kill returns before the actor's process exits, and its heartbeat
            # thread publishes until then; the hand-back waits for the processes to go.
            _ray.kv_delete(self._beats, NAMESPACE, prefix=True)

    def _keep_account(self, times: AttemptTimes) -> None:
        """Keep the group's goodput account (never raising into the shutdown)."""
        try:
            times.progress = goodput.read_progress([self._key(c) for c in self.contexts])
            times.outcome = times.outcome or "success"
            what = describe_request(record_of(self.slice).request)[0]
            goodput.keep(
                goodput.account_of(goodput.new_run_id(), "actor_group", [times], what=what)
            )
        except Exception as exc:  # noqa: BLE001 - the account must not break the shutdown
            logger.warning("actor group's goodput account not kept: %s", exc)


def _actor_env(call: CallEnv) -> dict[str, str]:
    """A rank's call environment as a ``runtime_env``, MEGASCALE_* set empty so none leaks
    from the driver. A runtime_env cannot unset a variable: one the call unsets stays as the
    host has it (TPU VMs do not set the sub-slice's ``TPU_PROCESS_ADDRESSES``)."""
    env = {name: "" for name in MEGASCALE_VARS}
    env.update({k: v for k, v in call.items() if v is not None})
    return env
