"""JAX helpers for code running inside a tpuslice task. JAX is imported lazily, here only.

- :func:`init_jax_profiler`: start JAX's profiler server in this worker and register its
  port where the Ray dashboard looks (``jax_profiler_port:<node_id>:<pid>``).
- :func:`distributed_args` / :func:`initialize`: ``jax.distributed.initialize`` arguments
  from the slice context that :func:`tpuslice.run_on_slice` sets, so users compute none.
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
    """Start JAX's profiler server on ``port`` (else ``JAX_PROFILER_PORT``, else 9999) and
    register it for the Ray dashboard; the key is removed when this process exits.

    Without JAX it logs a warning and returns; a port in use is logged as an error and
    not raised, so profiling never breaks the user's program.

    Args:
        port: Port of the profiler server; ``None`` reads ``JAX_PROFILER_PORT`` (default
            9999).

    Raises:
        InvalidArgumentError: ``port`` is None and ``JAX_PROFILER_PORT`` is not a port
            number (checked only when JAX is installed).
    """
    try:
        import jax
    except ImportError:
        logger.warning("JAX is not installed; the JAX profiler was not started")
        return
    chosen = _profiler_port(port)
    busy = port_in_use(chosen)
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


def port_in_use(port: int) -> str | None:
    """Why ``port`` cannot be bound, or ``None`` if it can. jaxlib only logs a busy port
    (and then listens nowhere), so we check first, binding as gRPC does (all addresses).

    Args:
        port: The TCP port to try.

    Returns:
        The bind error's text, or ``None`` if the port is free.
    """
    family, host = (socket.AF_INET6, "::") if socket.has_ipv6 else (socket.AF_INET, "")
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((host, port))
    except OSError as exc:
        return str(exc)
    return None


def register_profiler_port(port: int) -> str | None:
    """Put ``jax_profiler_port:<node>:<pid>`` -> port in Ray's KV (dashboard namespace)
    and remove it at exit. Returns the key, or ``None`` if Ray is not connected.

    Args:
        port: The profiler server's port.

    Returns:
        The KV key; ``None``, not an error, when Ray is not initialised (a warning is
        logged).
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
        NotConnectedError: there is no slice context (not inside a task started by
            :func:`tpuslice.run_on_slice` or a slice actor).
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

    Call it once inside a function started by :func:`tpuslice.run_on_slice`; ``kwargs``
    go to JAX (for example ``local_device_ids``).

    First the host's TPU is taken for this process (:func:`open_tpu`), so that a TPU
    another process holds fails here, naming that process.

    Args:
        port: Port of the coordinator on rank 0's host.
        **kwargs: Passed on to ``jax.distributed.initialize``.

    Raises:
        NotConnectedError: there is no slice context (see :func:`distributed_args`).
        TPUInUseError: another process owns this host's TPU.
    """
    import jax

    args = distributed_args(port=port)
    open_tpu()
    jax.distributed.initialize(**args, **kwargs)


def open_tpu() -> None:
    """Take this host's TPU for this process, as JAX's TPU backend does on first use.

    On a simulated host (``TPUSLICE_SIM_HOST_ROOT``) this stands in for that backend start
    and takes the host's libtpu lock (:func:`tpuslice._sim.libtpu.open_tpu`). On a real
    TPU VM, JAX takes the lock itself on first use; this checks first that no other
    process holds it, so the failure names the owner instead of only its pid.

    Raises:
        TPUInUseError: another process owns this host's TPU (host, pid, command and Ray
            job are named).
    """
    from tpuslice._host.tpu_lock import (
        SIM_ROOT_ENV,
        host_root,
        in_use_error,
        lock_holder,
        lock_wanted,
    )

    if os.environ.get(SIM_ROOT_ENV):
        from tpuslice._sim.libtpu import IN_USE, LibtpuError
        from tpuslice._sim.libtpu import open_tpu as start_simulated_backend

        try:
            start_simulated_backend()
        except LibtpuError as exc:
            if IN_USE.split("{pid}")[0] in str(exc):
                raise in_use_error(exc) from exc
            raise
        return
    holder = lock_holder(host_root())
    if lock_wanted(os.environ) and holder not in (None, os.getpid()):
        raise in_use_error(RuntimeError(f"libtpu's lock is held by pid {holder}"))
