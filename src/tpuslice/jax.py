"""JAX helpers for code running inside a tpuslice task. JAX is imported lazily, here only.

:func:`initialize` starts ``jax.distributed`` from the slice context :func:`tpuslice.run_on_slice`
sets; :func:`init_jax_profiler` starts JAX's profiler where the Ray dashboard finds it.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
from typing import Any

from tpuslice._tpu import _ray
from tpuslice._tpu._process import EXIT_HOOKS
from tpuslice._tpu.compat import DEFAULT_COORDINATOR_PORT
from tpuslice.errors import InvalidArgumentError

__all__ = [
    "DEFAULT_COORDINATOR_PORT",
    "distributed_args",
    "init_jax_profiler",
    "initialize",
    "open_tpu",
]

logger = logging.getLogger(__name__)

DEFAULT_PROFILER_PORT = 9999


def profiler_key(node_id: str, pid: int) -> str:
    """The Ray KV key under which the dashboard finds a worker's JAX profiler port.

    Args:
        node_id: The worker's Ray node id (hex).
        pid: The worker's process id.

    Returns:
        ``jax_profiler_port:<node_id>:<pid>``.
    """
    return f"jax_profiler_port:{node_id}:{pid}"


def _profiler_port(port: int | None) -> int:
    if port is not None:
        return port
    raw = os.environ.get("JAX_PROFILER_PORT", str(DEFAULT_PROFILER_PORT))
    if not raw.isdigit():
        raise InvalidArgumentError(f"JAX_PROFILER_PORT must be a port number, got {raw!r}")
    return int(raw)


def init_jax_profiler(port: int | None = None) -> None:
    """Start JAX's profiler server and register its port for the Ray dashboard until exit.

    Without JAX, or with the port in use, it logs and returns: profiling never breaks the
    user's program.

    Args:
        port: Port of the profiler server; ``None`` reads ``JAX_PROFILER_PORT`` (default 9999).

    Raises:
        InvalidArgumentError: ``JAX_PROFILER_PORT`` is not a port number.
    """
    try:
        import jax
    except ImportError:
        logger.warning("JAX is not installed; the JAX profiler was not started")
        return
    chosen = _profiler_port(port)
    busy = _port_in_use(chosen)
    if busy:
        logger.error("could not start the JAX profiler on port %d: %s", chosen, busy)
        return
    try:
        jax.profiler.start_server(chosen)
    except (RuntimeError, ValueError, OSError) as exc:  # jaxlib reports a busy port so
        logger.error("could not start the JAX profiler on port %d: %s", chosen, exc)
        return
    logger.info("JAX profiler server listening on port %d", chosen)
    register_profiler_port(chosen)


def _port_in_use(port: int) -> str | None:
    """Why ``port`` cannot be bound, or ``None``. jaxlib only logs a busy port (and then
    listens nowhere), so we check first, binding as gRPC does (all addresses)."""
    family, host = (socket.AF_INET6, "::") if socket.has_ipv6 else (socket.AF_INET, "")
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((host, port))
    except OSError as exc:
        return str(exc)
    return None


def register_profiler_port(port: int) -> str | None:
    """Put :func:`profiler_key` -> ``port`` in Ray's KV (dashboard namespace) until exit.

    Args:
        port: The profiler server's port.

    Returns:
        The KV key; ``None`` (with a warning) when Ray is not initialised.
    """
    import ray

    if not ray.is_initialized():
        logger.warning("Ray is not initialised; the profiler port was not registered")
        return None
    key = profiler_key(_ray.current_node_id(), os.getpid())
    namespace = _ray.dashboard_kv_namespace()
    _ray.kv_put(key, str(port).encode(), namespace)
    EXIT_HOOKS.add(functools.partial(_ray.kv_delete, key, namespace))
    return key


def distributed_args(port: int = DEFAULT_COORDINATOR_PORT) -> dict[str, Any]:
    """``coordinator_address``, ``num_processes`` and ``process_id`` for
    ``jax.distributed.initialize``, from the slice context of the running task.

    Args:
        port: Port of the coordinator on rank 0's host.

    Returns:
        The three keyword arguments.

    Raises:
        NotConnectedError: not inside a task started by tpuslice.
    """
    from tpuslice._host.context import current_host

    host = current_host()
    return {
        "coordinator_address": f"{host.coordinator_address}:{port}",
        "num_processes": host.world_size,
        "process_id": host.rank,
    }


def initialize(port: int = DEFAULT_COORDINATOR_PORT, **kwargs: Any) -> None:
    """``jax.distributed.initialize`` with this task's coordinator, process count and id.

    Call it once inside a function started by :func:`tpuslice.run_on_slice`. It first fails
    if another process holds the host's TPU, naming it; JAX takes the TPU on first use.

    Args:
        port: Port of the coordinator on rank 0's host.
        **kwargs: Passed on to ``jax.distributed.initialize`` (``local_device_ids``, ...).

    Raises:
        NotConnectedError: not inside a task started by tpuslice.
        TPUInUseError: another process owns this host's TPU.
    """
    import jax

    args = distributed_args(port=port)
    _refuse_if_held()
    jax.distributed.initialize(**args, **kwargs)


def _refuse_if_held() -> None:
    """Raise :class:`TPUInUseError` if another process holds libtpu's lock on this host,
    where JAX would only say the holder's pid, later."""
    from tpuslice._host.tpu_lock import host_root, in_use_error, lock_holder, lock_wanted

    holder = lock_holder(host_root())
    if lock_wanted(os.environ) and holder not in (None, os.getpid()):
        raise in_use_error(RuntimeError(f"libtpu's lock is held by pid {holder}"))


def open_tpu() -> None:
    """Start JAX's TPU backend in this process (``jax.devices()``), which takes the host's TPU.

    Call it after :func:`initialize` in a multi-host job: JAX refuses a distributed start
    once its backend runs.

    Raises:
        TPUInUseError: another process owns this host's TPU (host, pid, command, Ray job).
    """
    import jax

    from tpuslice._host.context import TPU_IN_USE
    from tpuslice._host.tpu_lock import in_use_error

    _refuse_if_held()
    try:
        jax.devices()
    except RuntimeError as exc:
        if TPU_IN_USE in str(exc):
            raise in_use_error(exc) from exc
        raise
