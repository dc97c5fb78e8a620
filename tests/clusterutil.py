"""Helpers shared by the cluster tests (bounded polling, holding hosts busy, a JAX step)."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

import tpuslice
import tpuslice.jax as tjax
from tpuslice._tpu import _ray
from tpuslice._tpu.keys import NAMESPACE, QUOTAS_KEY
from tpuslice._tpu.labels import SLICE_NAME_LABEL, WORKER_ID_LABEL
from tpuslice._view.quotas import Quotas, TenantQuota

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float = 30.0, what: str = "") -> T:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(0.02)


def markers_written(directory: Path, count: int) -> list[str]:
    """The texts of the marker files tasks wrote (a dot-name while half-written), once
    there are ``count`` of them; else ``[]`` (for :func:`wait_for`)."""
    found = [p.read_text() for p in directory.iterdir() if not p.name.startswith(".")]
    return found if len(found) >= count else []


@contextmanager
def run_in_background(*args: Any, go: Path, **kwargs: Any) -> Iterator[Future[list[Any]]]:
    """``run_resilient`` in a thread, so the test can inject faults while it runs. On the
    way out the go file exists, so no task of the run is left waiting."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(tpuslice.run_resilient, *args, **kwargs)
        try:
            yield future
        finally:
            go.touch()


@contextmanager
def hold_host(slice_name: str, worker_id: int, tpu: float = 1) -> Iterator[PlacementGroup]:
    """Keep ``tpu`` TPUs of one host in use (a placement group), as another user would;
    yields once the cluster's resource view shows them taken (a group is placed before
    its host's next resource report reaches that view)."""
    pg = placement_group(
        [{"TPU": tpu}],
        bundle_label_selector=[{SLICE_NAME_LABEL: slice_name, WORKER_ID_LABEL: str(worker_id)}],
    )
    try:
        ray.get(pg.ready(), timeout=30)
        wait_for(
            lambda: _tpu_taken(slice_name, worker_id, tpu),
            timeout=30,
            what=f"{slice_name} host {worker_id}'s held TPUs in the resource view",
        )
        yield pg
    finally:
        remove_placement_group(pg)


def _tpu_taken(slice_name: str, worker_id: int, tpu: float) -> bool:
    host = tpuslice.read_snapshot().slices[slice_name].hosts[worker_id]
    return host.tpu_total - host.tpu_available >= tpu


@ray.remote(num_cpus=0)
def where_am_i() -> dict[str, Any]:
    """What a task sees of its host: TPU env, node labels, pid."""
    context = ray.get_runtime_context()
    return {
        "TPU_NAME": os.environ.get("TPU_NAME"),
        "TPU_WORKER_ID": os.environ.get("TPU_WORKER_ID"),
        "TPU_ACCELERATOR_TYPE": os.environ.get("TPU_ACCELERATOR_TYPE"),
        "TPU_TOPOLOGY": os.environ.get("TPU_TOPOLOGY"),
        "labels": context.get_node_labels(),
        "node_id": context.get_node_id(),
        "pid": os.getpid(),
        "env": {k: v for k, v in os.environ.items() if k.startswith(("TPUSLICE_", "MEGASCALE_"))},
    }


def exported_metrics() -> dict[str, str | None]:
    """What each live node's Ray metrics agent exports (Prometheus text), by node id;
    ``None`` for an agent that does not answer (a host just killed, or Ray's minimal
    agent), as Prometheus marks a target down."""
    import urllib.request

    texts: dict[str, str | None] = {}
    for node in ray.nodes():
        if not node["Alive"]:
            continue
        url = f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                texts[node["NodeID"]] = response.read().decode()
        except OSError:
            texts[node["NodeID"]] = None
    return texts


def free_port() -> int:
    """A loopback port free now (for a JAX coordinator on the simulated hosts)."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports free now (all bound at once, so no two are the
    same, as two calls of :func:`free_port` could be)."""
    with ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]


def spmd_allgather_function() -> Any:
    """One SPMD step: join jax.distributed from the slice context (JAX on CPU), all-gather
    each rank + 1, return (rank, process count, sum). Made in a function so Ray pickles it
    by value (workers cannot import tests)."""

    def spmd_allgather(port: int) -> tuple[int, int, float]:
        import jax

        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        tjax.initialize(port=port)
        try:
            import jax.numpy as jnp
            from jax.experimental import multihost_utils

            host = tpuslice.current_host()
            total = multihost_utils.process_allgather(jnp.array([float(host.rank + 1)])).sum()
            return host.rank, jax.process_count(), float(total)
        finally:
            jax.distributed.shutdown()

    return spmd_allgather


def exit_cleanly(script: str, *args: str, timeout: float = 180) -> str:
    """Run a driver script (``python -c``) to its end; it must exit 0 without Ray's fatal
    'core worker has already been shutdown' (a thread of ours calling Ray after Ray's exit
    hook shut it down).

    Returns:
        Its standard output.
    """
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=timeout
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "already been shutdown" not in out.stderr
    return out.stdout


TASK_BOUND_S = 120.0
"""How long a test task waits for its go file before it gives up."""


@ray.remote
def beat_until_go(marker_dir: str, go: str, open_tpu: bool = False) -> str:
    """A marker naming the slice (after opening the TPU, if asked), then a heartbeat every
    50 ms until the go file exists."""
    host = tpuslice.current_host()
    if open_tpu:
        from tpuslice.testing.libtpu import open_tpu as take_tpu

        take_tpu()
    hidden = Path(marker_dir, f".{host.slice_name}.{host.rank}.{time.monotonic_ns()}")
    hidden.write_text(host.slice_name)
    hidden.rename(Path(marker_dir, hidden.name[1:]))  # appears complete, never half-written
    deadline = time.monotonic() + TASK_BOUND_S
    while not Path(go).exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the test never said go")
        tpuslice.heartbeat()
        time.sleep(0.05)
    return host.slice_name


def take_back_a_quota() -> None:
    """With quotas set (left set for the panels to show, until the test ends), team-b
    holds both v4 slices, preemptible, and team-a asks for its quota of one: the queue
    gives team-b its notice, team-b leaves, team-a is granted."""
    quotas = Quotas({"team-a": TenantQuota({"v4-16": 1}), "team-b": TenantQuota(grace_s=20)})
    _ray.kv_put(QUOTAS_KEY, quotas.to_json(), NAMESPACE)
    v4 = {"topology": "2x2x2", "accelerator_version": "v4", "head_reservation_timeout_s": 60}
    borrower = tpuslice.SlicePlacementGroup(**v4, num_slices=2, tenant="team-b", preemptible=True)
    owner: list[tpuslice.SlicePlacementGroup] = []
    asking = threading.Thread(
        target=lambda: owner.append(tpuslice.SlicePlacementGroup(**v4, tenant="team-a"))
    )
    try:
        asking.start()
        wait_for(borrower.notices, 30, "the queue's notice on team-b's slices")
        borrower.shutdown()
        asking.join(60)
        assert owner, "team-a was not granted its quota"
    finally:
        asking.join(60)
        for spg in [borrower, *owner]:
            spg.shutdown()
