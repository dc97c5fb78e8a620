"""What runs on a TPU host for a held slice: the owner actor and the call it makes.

A :class:`HostOwner` is the one process on a host that runs every call of a held slice
(see :mod:`tpuslice._reserve.owners`); this module is all such a process imports to run calls,
so it stays small.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ray

from tpuslice._host.context import with_context
from tpuslice._tpu.labels import CallEnv


class HostOwner:
    """The owner of one bundle's TPU (a Ray actor): it runs calls in its slice context."""

    def call(
        self,
        function: Callable[..., Any],
        env: CallEnv,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
    ) -> Any:
        """Run ``function(*args, **kwargs)`` with the slice context ``env`` set.

        Args:
            function: The user's Python function.
            env: The rank's context variables.
            args: Positional arguments.
            kwargs: Keyword arguments.

        Returns:
            What ``function`` returns.
        """
        return call_in_context(function, env, args, kwargs)

    def clean(self) -> bool:
        """Whether this process may run another slice's calls on this host: it holds
        neither libtpu's lock nor a TPU device (its calls never opened the TPU, which
        libtpu would keep until the process exits).

        Returns:
            ``True`` if it holds neither.
        """
        import os

        from tpuslice._host.tpu_lock import holds_tpu, host_root

        return not holds_tpu(os.getpid(), host_root())

    def ping(self) -> int:
        """This owner's pid (the call also proves the owner started).

        Returns:
            The pid.
        """
        import os

        return os.getpid()


def call_in_context(
    function: Callable[..., Any],
    env: CallEnv,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> Any:
    """``function(*args, **kwargs)`` with the slice context in ``os.environ`` for the call.

    Args:
        function: The user's Python function.
        env: The rank's ``TPUSLICE_*`` (and ``MEGASCALE_*``) variables.
        args: Positional arguments.
        kwargs: Keyword arguments.

    Returns:
        What ``function`` returns.

    Raises:
        TPUInUseError: the call met a TPU another process owns (libtpu refused it).
        Exception: whatever ``function`` raises.
    """
    return with_context(function)(env, *args, **kwargs)


def pid_of_actor(actor: Any) -> int:
    """Body of ``__ray_call__`` asking a SliceActorGroup actor for its pid.

    Args:
        actor: The actor's instance (unused).

    Returns:
        The actor's pid.
    """
    import os

    return os.getpid()


def call_in_actor(
    actor: Any,
    function: Callable[..., Any],
    env: CallEnv,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> Any:
    """Body of ``__ray_call__`` on a SliceActorGroup actor: one call in its slice context.

    Args:
        actor: The actor's instance (unused: ``function`` is the user's).
        function: The user's Python function.
        env: The rank's context variables.
        args: Positional arguments.
        kwargs: Keyword arguments.

    Returns:
        What ``function`` returns.
    """
    return call_in_context(function, env, args, kwargs)


RemoteOwner = ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)(HostOwner)
