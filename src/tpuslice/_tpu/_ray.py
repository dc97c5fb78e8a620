"""The only module that touches Ray's private names (``ray._private``, ``ray._raylet``).
Ray has no public API for any of these but where a function names one."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import Any

import ray
from ray._private import ray_constants, utils, worker
from ray._private import state as gcs_state
from ray.experimental import internal_kv


def available_resources_per_node() -> dict[str, dict[str, float]]:
    """Available resources of every alive node, in one GCS read (Ray's public API has only
    cluster totals); a resource fully in use is *absent*, not zero."""
    result: dict[str, dict[str, float]] = gcs_state.available_resources_per_node()
    return result


def cluster_can_grow() -> bool:
    """Whether an autoscaler has published a cluster config (or the env says so)."""
    override = os.environ.get("TPUSLICE_CLUSTER_CAN_GROW")
    if override is not None:
        return override.strip().lower() in ("1", "true", "yes")
    return gcs_state.state.get_cluster_config() is not None


def recorded_cluster_address() -> str | None:
    """The address ``address="auto"`` joins (the last cluster started on this machine)."""
    address: str | None = utils.read_ray_address(None)
    return address or None


def node_process_pids(node: Any) -> list[int]:
    """Pids of the Ray processes a ``ray.cluster_utils`` node started."""
    pids: list[int] = []
    for infos in getattr(node, "all_processes", {}).values():
        pids.extend(info.process.pid for info in infos if info.process is not None)
    return pids


@contextmanager
def minimal_node_agents() -> Iterator[None]:
    """Nodes started here during the block run Ray's *minimal* dashboard agent (less CPU)."""
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
    """A Ray node this thread starts during the block spawns its processes through ``run``.
    Ray ties them to the spawning *thread* and reads TPU facts from the environment, so
    ``run`` hands that step to one long-lived thread with the environment set, and several
    nodes start at once. Off the main thread no ``SIGTERM`` handler is set (Python forbids it).
    """
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
    return (ray.exceptions.RayError, ConnectionError, OSError, RuntimeError)


def kv_put(key: str, value: bytes, namespace: str | None) -> bool:
    """Write Ray's internal KV store; whether the key existed. Not connected: ConnectionError."""
    if not internal_kv._internal_kv_initialized():
        raise ConnectionError(f"cannot write {key!r}: Ray is not connected")
    existed = internal_kv._internal_kv_put(key, value, namespace=namespace)
    return bool(existed)


def kv_list(prefix: str, namespace: str | None) -> list[str]:
    """Keys of Ray's internal KV store starting with ``prefix``; ``[]`` when not connected."""
    if not internal_kv._internal_kv_initialized():
        return []
    keys = internal_kv._internal_kv_list(prefix, namespace=namespace)
    return [k.decode() if isinstance(k, bytes) else str(k) for k in keys]


def kv_get(key: str, namespace: str | None) -> bytes | None:
    """Read Ray's internal KV store; ``None`` when absent or not connected."""
    if not internal_kv._internal_kv_initialized():
        return None
    value: bytes | None = internal_kv._internal_kv_get(key, namespace=namespace)
    return value


def kv_delete(key: str, namespace: str | None, *, prefix: bool = False) -> None:
    """Delete a key of Ray's internal KV store (or every key it starts, with ``prefix``)."""
    if internal_kv._internal_kv_initialized():
        internal_kv._internal_kv_del(key, del_by_prefix=prefix, namespace=namespace)


def kv_get_many(keys: list[str], namespace: str | None) -> dict[str, bytes]:
    """Several keys of Ray's internal KV store in one GCS call, absent ones left out."""
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
    return str(ray_constants.KV_NAMESPACE_DASHBOARD)


def current_node_id() -> str:
    """Hex id of the node this process runs on (driver or worker)."""
    return str(ray.get_runtime_context().get_node_id())


def remote_function_parts(fn: Any) -> tuple[Any, dict[str, Any]]:
    """The Python function behind a ``@ray.remote`` function, and its options."""
    function = getattr(fn, "_function", None)
    if function is None:
        raise TypeError(
            f"expected a @ray.remote function, got {type(fn).__name__!r} (no Python function)"
        )
    return function, dict(getattr(fn, "_default_options", {}) or {})


def dead_jobs(job_ids: Collection[str]) -> set[str]:
    """Of these Ray job ids (hex), those whose drivers have exited (public:
    ``ray.util.state.list_jobs``, which needs the dashboard)."""
    wanted = set(job_ids)
    return {j["JobID"] for j in gcs_state.state.job_table() if j["JobID"] in wanted and j["IsDead"]}


def connection_identity() -> bytes | None:
    """This process's worker id, new at every ``ray.init``; None when not connected."""
    driver = worker.global_worker
    if not driver.connected:
        return None
    return bytes(driver.core_worker.get_worker_id().binary())


def current_job_id() -> str:
    """Hex id of this process's Ray job."""
    return str(ray.get_runtime_context().get_job_id())


def alive_actors_on(node_ids: Collection[str]) -> list[tuple[str, str, int]]:
    """``(class name, node id, pid)`` of the live actors on these nodes (public:
    ``ray.util.state.list_actors``, which needs Ray's dashboard)."""
    wanted = set(node_ids)
    return [
        (info["ActorClassName"], info["Address"]["NodeID"], int(info["Pid"]))
        for info in gcs_state.actors(actor_state_name="ALIVE").values()
        if info["Address"]["NodeID"] in wanted
    ]


def gcs_token_refusal(address: str) -> str | None:
    """Ray's reason if the GCS at ``address`` refuses our token, else None. A silent GCS is
    waited for long: bound the call."""
    raylet: Any = ray._raylet  # its type stubs leave out the GCS client

    try:
        raylet.GcsClient(address=address)
    except ray.exceptions.AuthenticationError as exc:
        return str(getattr(exc, "message", "") or "the token was refused")
    return None


def reload_auth_settings() -> None:
    """Make Ray here re-read ``RAY_AUTH_MODE`` and its token (only while not connected)."""
    raylet: Any = ray._raylet  # its type stubs leave out both classes

    # The mode before the token: a token dropped while the mode still said "token"
    # would be reloaded by a thread of Ray's that still runs.
    raylet.Config.initialize("")
    raylet.AuthenticationTokenLoader.instance().reset_cache()


def enable_token_auth_if_token_found() -> None:
    """As ``ray.init`` does for an address it finds: token mode if unset and a token is found."""
    from ray._private.authentication.authentication_token_setup import (
        maybe_enable_token_auth_if_token_available,
    )

    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
