"""A rank's place in the gang (:class:`HostContext`), set in ``os.environ`` around each
call (:func:`with_context`) and read back (:func:`current_host`). A host's worker may load
this module, so it stays small: no Ray, no reservation code."""

from __future__ import annotations

import os
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tpuslice._tpu.compat import DEFAULT_MEGASCALE_PORT, get_tpu_coordinator_env_vars
from tpuslice._tpu.labels import CallEnv
from tpuslice.errors import NotConnectedError

ENV_PREFIX = "TPUSLICE_"
MEGASCALE_VARS = tuple(get_tpu_coordinator_env_vars("", 0, 0))


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

    def describe(self) -> str:
        """``rank 1 (v4-16-a host 1)``: the rank and its host, for messages.

        Returns:
            One phrase.
        """
        return f"rank {self.rank} ({self.slice_name} host {self.worker_id})"

    def env(self) -> dict[str, str]:
        """The environment of this rank's calls.

        Returns:
            ``TPUSLICE_*`` variables, plus all four ``MEGASCALE_*`` for two or more slices.
        """
        # vars(), not asdict(): every field is a str or an int, nothing to copy deeply.
        env = {f"{ENV_PREFIX}{k.upper()}": str(v) for k, v in vars(self).items()}
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


def current_host() -> HostContext:
    """The :class:`HostContext` of the running task or actor (read from ``os.environ``).

    Returns:
        This host's place in the gang: rank, world size, slice, worker id, coordinator.

    Raises:
        NotConnectedError: called outside a tpuslice task or actor (there is no context).
    """
    values: dict[str, Any] = {}
    for name, kind in HostContext.__annotations__.items():
        raw = os.environ.get(f"{ENV_PREFIX}{name.upper()}")
        if raw is None:
            raise NotConnectedError(
                "no slice context here: current_host() works inside a task started by "
                "tpuslice.run_on_slice or a SliceActorGroup actor"
            )
        values[name] = int(raw) if kind in ("int", int) else raw
    return HostContext(**values)


TPU_IN_USE = "The TPU is already in use"  # libtpu's words when another process owns it


def apply_env(values: Mapping[str, str | None]) -> None:
    """Set each variable in ``os.environ``, or unset it where its value is ``None``."""
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def with_context(function: Callable[..., Any], returns: int | None = None) -> Callable[..., Any]:
    """``run_in_context(env, *args, **kwargs)``: ``function`` run with ``env`` set (stale
    ``MEGASCALE_*`` dropped; all restored after). With ``returns`` (its ``num_returns``) the
    pid rides along, so the hand-back can stop exactly the processes that ran the work. It
    refers to no tpuslice module: Ray ships it by value, and workers need not import tpuslice."""

    # A copy with only ``os`` as globals is pickled by value, not by reference; it keeps a
    # module name, else pickling searches every loaded module for it.
    apply = types.FunctionType(apply_env.__code__, {"os": os, "__name__": __name__}, "apply_env")

    def run_in_context(__tpuslice_env: CallEnv, *args: Any, **kwargs: Any) -> Any:
        env = dict(__tpuslice_env)
        saved = {key: os.environ.get(key) for key in {*env, *MEGASCALE_VARS}}
        for key in MEGASCALE_VARS:
            os.environ.pop(key, None)
        apply(env)
        try:
            result = function(*args, **kwargs)
        except Exception as exc:
            if TPU_IN_USE in str(exc):
                from tpuslice._host.tpu_lock import in_use_error

                raise in_use_error(exc) from exc
            raise
        finally:
            apply(saved)
        if returns is None:
            return result
        return (result, os.getpid()) if returns == 1 else (*result, os.getpid())

    # Keep the user's name for Ray's task listings; no __wrapped__, so Ray checks the
    # arguments against this signature (context first), not the user's.
    run_in_context.__name__ = getattr(function, "__name__", "run_in_context")
    run_in_context.__qualname__ = getattr(function, "__qualname__", "run_in_context")
    run_in_context.__module__ = getattr(function, "__module__", __name__)
    return run_in_context
