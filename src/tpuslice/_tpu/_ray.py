"""The only module that touches Ray's private names (``ray._private``, ``ray._raylet``).

Each function says which public API we would use if Ray had one. Keep this file small:
everything else in tpuslice talks to Ray through its public API.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import Any

import ray


def available_resources_per_node() -> dict[str, dict[str, float]]:
    """Available resources of every alive node, in one GCS read.

    Public alternative: none; ``ray.available_resources()`` only gives cluster totals.
    Note: a resource fully in use is *absent* from a node's map, not zero.
    """
    from ray._private.state import available_resources_per_node as read

    result: dict[str, dict[str, float]] = read()
    return result


def cluster_can_grow() -> bool:
    """Whether an autoscaler has published a cluster config (KubeRay, cluster launcher).

    Public alternative: none. ``TPUSLICE_CLUSTER_CAN_GROW=0/1`` overrides the check.
    """
    override = os.environ.get("TPUSLICE_CLUSTER_CAN_GROW")
    if override is not None:
        return override.strip().lower() in ("1", "true", "yes")
    from ray._private.state import state

    return state.get_cluster_config() is not None


def recorded_cluster_address() -> str | None:
    """The address of the last cluster started on this machine, which ``address="auto"``
    joins (Ray records it in ``<temp dir>/ray_current_cluster``); ``None`` if none.

    Public alternative: none.
    """
    from ray._private.utils import read_ray_address

    address: str | None = read_ray_address(None)
    return address or None


def node_process_pids(node: Any) -> list[int]:
    """Pids of the Ray processes a ``ray.cluster_utils`` node started (raylet, GCS, ...).

    Public alternative: none; ``Cluster`` keeps them on the private ``Node.all_processes``.
    """
    pids: list[int] = []
    for infos in getattr(node, "all_processes", {}).values():
        pids.extend(info.process.pid for info in infos if info.process is not None)
    return pids


@contextmanager
def minimal_node_agents() -> Iterator[None]:
    """Ray nodes started in this process during the block run Ray's *minimal* dashboard
    agent (as under ``pip install ray``, without ``[default]``): no metrics export, and
    much less CPU while idle. Ray starts the full agent whenever the dashboard's
    dependencies import; this makes its check say they do not.

    Public alternative: none (``ray start`` has no switch for the agent's mode).
    """
    utils = ray._private.utils
    real = getattr(utils, "get_dashboard_dependency_error", None)
    if real is None:  # another Ray: its agents as they come
        yield
        return
    utils.get_dashboard_dependency_error = lambda: "a minimal agent was asked for"
    try:
        yield
    finally:
        utils.get_dashboard_dependency_error = real


_NODE_START = threading.local()
_NODE_START_PATCH = threading.Lock()


@contextmanager
def node_processes_started_by(run: Callable[[Callable[[], None]], None]) -> Iterator[None]:
    """A Ray node this thread starts during the block (``Cluster.add_node``) resolves
    its resources and labels and spawns its processes through ``run`` (which calls the
    function it is given, wherever and however it chooses), and waits for its raylet to
    register here.

    Ray reads a node's TPU facts from this process's environment while it resolves them,
    spawns the node's processes tied to the spawning *thread* (on Linux each dies with
    the thread that started it), then waits about 2 s for the raylet to register. Threads
    can wait for several nodes at once when ``run`` hands the short resolve-and-spawn
    step to one long-lived thread, with the environment set there.

    A node started off the main thread sets no ``SIGTERM`` handler (Python allows one only
    from the main thread). The handler Ray set for the head stays: on ``SIGTERM`` it
    exits, and every node's at-exit hook stops that node; each node's reaper process
    still stops it if this process dies outright.

    Public alternative: none (``Cluster.add_node`` resolves, spawns and waits in one
    call, on the calling thread, with the environment of the calling process).
    """
    from ray._private import utils
    from ray._private.node import Node as node_class

    with _NODE_START_PATCH:
        if not getattr(node_class, "_tpuslice_wrapped", False):
            real_start = node_class.start_ray_processes
            real_sigterm = utils.set_sigterm_handler

            def start_ray_processes(self: Any) -> None:
                runner = getattr(_NODE_START, "run", None)
                if runner is None:
                    real_start(self)
                else:
                    runner(lambda: real_start(self))

            def set_sigterm_handler(handler: Any) -> None:
                if threading.current_thread() is threading.main_thread():
                    real_sigterm(handler)

            node_class.start_ray_processes = start_ray_processes
            utils.set_sigterm_handler = set_sigterm_handler
            node_class._tpuslice_wrapped = True
    _NODE_START.run = run
    try:
        yield
    finally:
        _NODE_START.run = None


def node_logs_dir(node: Any) -> str | None:
    """The logs directory of a ``ray.cluster_utils`` node (for startup-failure messages)."""
    getter = getattr(node, "get_logs_dir_path", None)
    return str(getter()) if getter else None


def kv_errors() -> tuple[type[BaseException], ...]:
    """What a KV call raises when the GCS cannot be reached or Ray is shutting down."""
    import ray

    return (ray.exceptions.RayError, ConnectionError, OSError, RuntimeError)


def kv_put(key: str, value: bytes, namespace: str | None) -> bool:
    """Write Ray's internal key-value store. Public alternative: none.

    Returns whether the key existed before. Raises ``ConnectionError`` (one of
    :func:`kv_errors`) when Ray is not connected."""
    from ray.experimental import internal_kv

    if not internal_kv._internal_kv_initialized():
        raise ConnectionError(f"cannot write {key!r}: Ray is not connected")
    existed = internal_kv._internal_kv_put(key, value, namespace=namespace)
    return bool(existed)


def kv_list(prefix: str, namespace: str | None) -> list[str]:
    """Keys of Ray's internal KV store that start with ``prefix``; ``[]`` when Ray is not
    connected. Public alternative: none."""
    from ray.experimental import internal_kv

    if not internal_kv._internal_kv_initialized():
        return []
    keys = internal_kv._internal_kv_list(prefix, namespace=namespace)
    return [k.decode() if isinstance(k, bytes) else str(k) for k in keys]


def kv_get(key: str, namespace: str | None) -> bytes | None:
    """Read Ray's internal key-value store; ``None`` when the key is absent or Ray is not
    connected. Public alternative: none."""
    from ray.experimental import internal_kv

    if not internal_kv._internal_kv_initialized():
        return None
    value: bytes | None = internal_kv._internal_kv_get(key, namespace=namespace)
    return value


def kv_delete(key: str, namespace: str | None, *, prefix: bool = False) -> None:
    """Delete a key of Ray's internal KV store (every key starting with ``key`` if
    ``prefix``); nothing when Ray is not connected. Public alternative: none."""
    from ray.experimental import internal_kv

    if internal_kv._internal_kv_initialized():
        internal_kv._internal_kv_del(key, del_by_prefix=prefix, namespace=namespace)


def kv_get_many(keys: list[str], namespace: str | None) -> dict[str, bytes]:
    """Read several keys of Ray's internal KV store in one GCS call; absent keys are
    left out; empty when Ray is not connected. Public alternative: none."""
    from ray._private import worker
    from ray.experimental import internal_kv

    if not keys or not internal_kv._internal_kv_initialized():
        return {}
    client = worker.global_worker.gcs_client
    ns = namespace.encode() if namespace is not None else None
    found = client.internal_kv_multi_get([k.encode() for k in keys], ns, timeout=10)
    return {
        (k.decode() if isinstance(k, bytes) else str(k)): v
        for k, v in found.items()
        if v is not None
    }


def dashboard_kv_namespace() -> str:
    """Namespace the Ray dashboard reads (JAX profiler ports live there)."""
    from ray._private import ray_constants

    return str(ray_constants.KV_NAMESPACE_DASHBOARD)


def current_node_id() -> str:
    """Hex id of the node this process runs on (driver or worker)."""
    return str(ray.get_runtime_context().get_node_id())


def remote_function_parts(fn: Any) -> tuple[Any, dict[str, Any]]:
    """The Python function behind a ``@ray.remote`` function, and its decorator options.

    Public alternative: none; ``RemoteFunction`` keeps both on private attributes.
    """
    function = getattr(fn, "_function", None)
    if function is None:
        raise TypeError(
            f"expected a @ray.remote function, got {type(fn).__name__!r} (no Python function)"
        )
    return function, dict(getattr(fn, "_default_options", {}) or {})


def dead_jobs(job_ids: Collection[str]) -> set[str]:
    """Of the given Ray job ids (hex), those whose drivers have exited, in one GCS read.

    Public alternative: ``ray.util.state.list_jobs`` goes through the dashboard, which a
    cluster may not run; the GCS job table is what it reads.
    """
    from ray._private.state import state

    wanted = set(job_ids)
    return {j["JobID"] for j in state.job_table() if j["JobID"] in wanted and j["IsDead"]}


def connection_identity() -> bytes | None:
    """Which connection to Ray this process has now: its worker's id, new at every
    ``ray.init`` (so a shutdown and an init to the same address give another); ``None``
    when not connected. Never connects, where ``ray.get_runtime_context()`` would.

    Public alternative: none; ``ray.is_initialized()`` says whether, not which.
    """
    from ray._private import worker

    driver = worker.global_worker
    if not driver.connected:
        return None
    return bytes(driver.core_worker.get_worker_id().binary())


def current_job_id() -> str:
    """Hex id of this process's Ray job."""
    return str(ray.get_runtime_context().get_job_id())


def alive_actors_on(node_ids: Collection[str]) -> list[tuple[str, str, int]]:
    """The live actors on these nodes, from the GCS's actor table (no dashboard needed).
    Public alternative: ``ray.util.state.list_actors``, which needs Ray's dashboard.

    Args:
        node_ids: Node ids (hex).

    Returns:
        ``(class name, node id, pid)`` of each.
    """
    from ray._private import state

    wanted = set(node_ids)
    return [
        (info["ActorClassName"], info["Address"]["NodeID"], int(info["Pid"]))
        for info in state.actors(actor_state_name="ALIVE").values()
        if info["Address"]["NodeID"] in wanted
    ]


def gcs_token_refusal(address: str) -> str | None:
    """Ray's reason when the GCS at ``address`` refuses this process's token (none, or a
    wrong one); ``None`` when it accepts it or requires none. One GCS call, answered at
    once by a GCS that runs; one that does not answer is waited for as long as Ray's
    client waits (about 40 s), so call it with a bound of your own.

    Public alternative: none; ``ray.init`` retries a refused token for about 20 s, then
    raises a bare ``ConnectionError`` that does not say why.
    """
    raylet: Any = ray._raylet  # its type stubs leave out the GCS client

    try:
        raylet.GcsClient(address=address)
    except ray.exceptions.AuthenticationError as exc:
        return str(getattr(exc, "message", "") or "the token was refused")
    return None


def reload_auth_settings() -> None:
    """Make Ray in this process read ``RAY_AUTH_MODE`` and its token again from the
    environment (it reads them once and keeps them). Only while not connected.

    Public alternative: none.
    """
    raylet: Any = ray._raylet  # its type stubs leave out both classes

    # The mode before the token: a token dropped while the mode still said "token"
    # would be reloaded by a thread of Ray's that still runs.
    raylet.Config.initialize("")
    raylet.AuthenticationTokenLoader.instance().reset_cache()


def enable_token_auth_if_token_found() -> None:
    """What ``ray.init`` does for an address it finds on its own (``None``, ``"auto"``):
    with ``RAY_AUTH_MODE`` unset and a token found, this process uses token mode.

    Public alternative: none.
    """
    from ray._private.authentication.authentication_token_setup import (
        maybe_enable_token_auth_if_token_available,
    )

    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
