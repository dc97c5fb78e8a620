"""SimulatedCluster: a real local Ray cluster whose nodes look exactly like TPU VMs.

A head node with CPUs only, plus one Ray node per simulated TPU VM carrying the labels,
resources and environment Ray gives a real one (see :mod:`tpuslice.labels`). Faults are
real too: :meth:`SimulatedCluster.kill_host` SIGKILLs a node's processes, so its tasks
fail with Ray's own node-died errors.

Two settings differ from Ray's defaults, both for speed on a laptop, both documented:
every host gets ``cpus_per_host`` logical CPUs (a real TPU VM has 100+; with 1, Ray's
idle-worker soft limit kills warm workers), and node-death detection is tightened from
~15 s to ~1.5 s (``health_check_period_ms=500``, ``health_check_failure_threshold=3``).

Nothing leaves the machine on our account. Adding a node runs Ray's TPU detection in this
process; it finds the host's identity in the environment, as on a GKE TPU host, instead of
asking the GCE metadata server (which it would do with no timeout). Ray's usage stats
(a report to usage-stats.ray.io) are off and their one "disabled" ping goes to a loopback
port, unless ``RAY_USAGE_STATS_ENABLED`` / ``RAY_USAGE_STATS_REPORT_URL`` are set. One probe
remains that no setting turns off: Ray's dashboard asks the cloud
metadata addresses once at start which cloud it is on (1 s timeout each).
"""

from __future__ import annotations

import itertools
import logging
import os
import string
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import ray
from ray.cluster_utils import Cluster

from tpuslice import _ray
from tpuslice.errors import InvalidArgumentError, TPUSliceError
from tpuslice.labels import (
    HOST_ENV_VARS,
    SLICE_NAME_LABEL,
    WORKER_ID_LABEL,
    host_env,
    host_labels,
    host_resources,
)
from tpuslice.testing.procs import descendants, kill_and_wait, pid_alive, sigkill
from tpuslice.topology import SliceShape, slice_shape

logger = logging.getLogger(__name__)

MiB = 1024 * 1024
FAST_FAILURE_DETECTION = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 3,
}


HEAD_ENV_DEFAULTS = {
    "RAY_USAGE_STATS_ENABLED": "0",
    # With usage stats off, Ray's dashboard still sends one "disabled" report; Ray offers
    # this variable for tests: point it at a loopback port where nothing listens.
    "RAY_USAGE_STATS_REPORT_URL": "http://127.0.0.1:1/",
}
"""Environment of the head's processes, unless the user set these variables."""
_ENV_LOCK = threading.Lock()


@contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    """``values`` in ``os.environ`` for the block, restored after (one block at a time)."""
    with _ENV_LOCK:
        saved = {key: os.environ.get(key) for key in values}
        os.environ.update(values)
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


class SimulatorError(TPUSliceError, RuntimeError):
    """The simulated cluster could not start or was used wrongly."""


@dataclass(frozen=True)
class SliceSpec:
    """``count`` slices of one generation and topology (``v6e:4x4:2`` on the CLI)."""

    accelerator: str
    topology: str
    count: int = 1
    chips_per_vm: int | None = None

    @classmethod
    def parse(cls, text: str) -> SliceSpec:
        """``"v6e:4x4"``, ``"v6e:4x4:2"`` or ``"v6e:2x4:1:4"`` (chips per VM last)."""
        parts = text.strip().split(":")
        if not 2 <= len(parts) <= 4 or not all(parts):
            raise InvalidArgumentError(
                f"slice spec {text!r} is malformed; expected GENERATION:TOPOLOGY[:COUNT"
                "[:CHIPS_PER_VM]], such as 'v6e:4x4:2'"
            )
        try:
            numbers = [int(p) for p in parts[2:]]
        except ValueError as exc:
            raise InvalidArgumentError(
                f"slice spec {text!r}: count and chips per VM must be integers"
            ) from exc
        return cls(parts[0], parts[1], *numbers)

    def shape(self) -> SliceShape:
        if self.count < 1:
            raise InvalidArgumentError(f"slice count must be >= 1, got {self.count}")
        return slice_shape(self.topology, self.accelerator, self.chips_per_vm)


SliceLike = SliceSpec | tuple[Any, ...] | str


def as_spec(item: SliceLike) -> SliceSpec:
    if isinstance(item, SliceSpec):
        return item
    if isinstance(item, str):
        return SliceSpec.parse(item)
    return SliceSpec(*item)


@dataclass
class SimulatedHost:
    """One simulated TPU VM. ``node`` is ``None`` while the host is dead."""

    slice_name: str
    worker_id: int
    node: Any = None

    @property
    def alive(self) -> bool:
        return self.node is not None


@dataclass
class SimulatedSlice:
    name: str
    shape: SliceShape
    tpu_resource_per_chip: int = 1
    hosts: list[SimulatedHost] = field(default_factory=list)


class SimulatedCluster:
    """Context manager running a local Ray cluster of simulated TPU slices.

    >>> with SimulatedCluster([("v6e", "4x4", 2)], connect=True) as sim:
    ...     run_on_slice(fn, topology="4x4", accelerator_version="v6e")
    """

    def __init__(
        self,
        slices: Iterable[SliceLike] = (("v6e", "4x4", 2),),
        *,
        cpus_per_host: int = 8,
        head_cpus: int = 2,
        tpu_resource_per_chip: int = 1,
        object_store_mb: int = 80,
        connect: bool = False,
        fast_failure_detection: bool = True,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.specs = [as_spec(s) for s in slices]
        for spec in self.specs:
            spec.shape()  # validate before starting anything
        self.cpus_per_host = cpus_per_host
        self.head_cpus = head_cpus
        self.tpu_resource_per_chip = tpu_resource_per_chip
        self.object_store_bytes = object_store_mb * MiB
        self._connect_on_start = connect
        self._fast_failure_detection = fast_failure_detection
        self._progress = progress or (lambda message: logger.info("%s", message))
        self._cluster: Cluster | None = None
        self._connected = False
        self._known_pids: set[int] = set()
        self.slices: dict[str, SimulatedSlice] = {}
        self.startup_seconds: float | None = None

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> SimulatedCluster:
        """Start the head and every host; return when all are alive and registered."""
        if self._cluster is not None:
            raise SimulatorError("this SimulatedCluster is already running")
        _check_driver_env()
        started = time.monotonic()
        try:
            self._start_head()
            for spec in self.specs:
                for _ in range(spec.count):
                    self._add_slice_nodes(spec.shape(), None)
            self._wait_for_alive_nodes()
        except BaseException:
            self.shutdown()
            raise
        self.startup_seconds = time.monotonic() - started
        self._progress(f"simulated cluster ready in {self.startup_seconds:.1f} s")
        if self._connect_on_start:
            self.connect()
        return self

    def __enter__(self) -> SimulatedCluster:
        return self.start() if self._cluster is None else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Shut down; an error in the block propagates unchanged, even if shutting down
        fails too (that failure is logged, and every process is still killed)."""
        try:
            self.shutdown()
        except Exception:
            if exc is None:
                raise
            logger.exception("shutting the simulated cluster down failed (after: %r)", exc)

    @property
    def address(self) -> str:
        if self._cluster is None:
            raise SimulatorError("the simulated cluster is not running; call start() first")
        return str(self._cluster.address)

    def connect(self, namespace: str | None = None) -> None:
        """``ray.init`` this process to the simulated cluster."""
        ray.init(
            address=self.address,
            namespace=namespace,
            log_to_driver=False,
            logging_level=logging.WARNING,
        )
        self._connected = True

    def shutdown(self) -> None:
        """Disconnect this process if it is connected to this cluster (through
        :meth:`connect` or its own ``ray.init``), then stop every process we started.
        Idempotent. If Ray's own teardown fails, the processes are killed by pid and the
        error is raised."""
        cluster, self._cluster = self._cluster, None
        if ray.is_initialized() and (self._connected or _driver_on(cluster)):
            ray.shutdown()
        self._connected = False
        self.slices.clear()
        if cluster is None:
            return
        self._known_pids |= self.pids(cluster)
        try:
            cluster.shutdown()
        finally:
            stuck = kill_and_wait(self.leftover_pids())
            if stuck:
                logger.error("simulator processes survived SIGKILL: %s", sorted(stuck))

    def pids(self, cluster: Cluster | None = None) -> set[int]:
        """Pids of every Ray process of this cluster (nodes and their workers)."""
        cluster = cluster or self._cluster
        if cluster is None:
            return set()
        roots = [pid for node in cluster.list_all_nodes() for pid in _ray.node_process_pids(node)]
        return descendants(roots)

    def leftover_pids(self) -> set[int]:
        """Pids this cluster ever had that are still alive (empty after a clean shutdown)."""
        return {pid for pid in self._known_pids | self.pids() if pid_alive(pid)}

    # --- faults and growth -------------------------------------------------------------

    def add_slice(
        self,
        accelerator: str,
        topology: str,
        chips_per_vm: int | None = None,
        tpu_resource_per_chip: int | None = None,
    ) -> str:
        """A slice arriving later, as from an autoscaler. Returns its name.

        ``tpu_resource_per_chip`` overrides the cluster's for this slice's hosts (as
        ``RAY_TPU_RESOURCE_PER_CHIP`` would on those VMs).
        """
        shape = slice_shape(topology, accelerator, chips_per_vm)
        name = self._add_slice_nodes(shape, None, tpu_resource_per_chip)
        self._wait_for_alive_nodes()
        return name

    def kill_host(self, slice_name: str, worker_id: int) -> None:
        """SIGKILL one host and every process on it, like a VM dying: its tasks and actors
        fail with Ray's node-died / actor-died errors."""
        host = self._host(slice_name, worker_id)
        if not host.alive:
            raise SimulatorError(f"host {worker_id} of {slice_name} is already dead")
        assert self._cluster is not None
        doomed = descendants(_ray.node_process_pids(host.node))
        self._known_pids |= doomed
        for pid in doomed:  # workers first: a VM's processes all die at once
            sigkill(pid)
        self._cluster.remove_node(host.node, allow_graceful=False)
        host.node = None

    def preempt_slice(self, slice_name: str) -> None:
        """Every host of the slice dies at once, as in a TPU preemption."""
        for host in self._slice(slice_name).hosts:
            if host.alive:
                self.kill_host(slice_name, host.worker_id)

    def restore_slice(self, slice_name: str) -> None:
        """Bring every dead host of the slice back (new Ray nodes, same labels)."""
        sim_slice = self._slice(slice_name)
        for host in sim_slice.hosts:
            if not host.alive:
                host.node = self._start_host(sim_slice, host.worker_id)
        self._wait_for_alive_nodes()

    def remove_slice(self, slice_name: str) -> None:
        """Kill the slice and forget it (for tests that added one)."""
        self.preempt_slice(slice_name)
        del self.slices[slice_name]

    def wait_until_dead(self, slice_name: str, worker_id: int, timeout: float = 30.0) -> None:
        """Block until Ray's view marks a killed host dead (bounded poll)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not any(n["Alive"] and _is_host(n, slice_name, worker_id) for n in ray.nodes()):
                return
            time.sleep(0.05)
        raise SimulatorError(f"host {worker_id} of {slice_name} still alive after {timeout}s")

    # --- internals ---------------------------------------------------------------------

    def _start_head(self) -> None:
        self._progress("starting head node")
        head_args: dict[str, Any] = {
            "num_cpus": self.head_cpus,
            "include_dashboard": False,
            "object_store_memory": self.object_store_bytes,
        }
        if self._fast_failure_detection:
            head_args["_system_config"] = dict(FAST_FAILURE_DETECTION)
        # The head's processes (its dashboard reports usage) inherit this environment.
        head_env = {key: os.environ.get(key, value) for key, value in HEAD_ENV_DEFAULTS.items()}
        with _environment(head_env):
            self._cluster = Cluster(initialize_head=True, head_node_args=head_args)

    def _add_slice_nodes(
        self, shape: SliceShape, name: str | None, per_chip: int | None = None
    ) -> str:
        name = name or self._next_name(shape)
        sim_slice = SimulatedSlice(name, shape, per_chip or self.tpu_resource_per_chip)
        self.slices[name] = sim_slice
        for worker_id in range(shape.num_hosts):
            node = self._start_host(sim_slice, worker_id)
            sim_slice.hosts.append(SimulatedHost(name, worker_id, node))
        return name

    def _start_host(self, sim_slice: SimulatedSlice, worker_id: int) -> Any:
        assert self._cluster is not None
        shape, name = sim_slice.shape, sim_slice.name
        self._progress(f"starting {name} host {worker_id + 1}/{shape.num_hosts}")
        env = host_env(shape, name, worker_id)
        try:
            # Ray resolves a node's TPU resources in this process, from the environment
            # (as on GKE) or else the GCE metadata server; give it the environment.
            with _environment(env):
                return self._cluster.add_node(
                    wait=False,
                    num_cpus=self.cpus_per_host,
                    object_store_memory=self.object_store_bytes,
                    resources=host_resources(
                        shape, name, worker_id, sim_slice.tpu_resource_per_chip
                    ),
                    labels=host_labels(shape, name, worker_id),
                    env_vars=env,
                )
        except (OSError, RuntimeError, TimeoutError) as exc:
            raise SimulatorError(
                f"could not start {name} host {worker_id}: {exc}\n{self._log_tail()}"
            ) from exc

    def _next_name(self, shape: SliceShape) -> str:
        for suffix in _suffixes():
            name = f"{shape.pod_type}-{suffix}"
            if name not in self.slices:
                return name
        raise AssertionError("unreachable: suffixes are unbounded")

    def _wait_for_alive_nodes(self, timeout: float = 120.0) -> None:
        assert self._cluster is not None
        try:
            self._cluster.wait_for_nodes(timeout=timeout)
        except (TimeoutError, RuntimeError) as exc:
            raise SimulatorError(
                f"simulated hosts did not all register within {timeout}s: {exc}\n{self._log_tail()}"
            ) from exc

    def _log_tail(self, lines: int = 20) -> str:
        if self._cluster is None or self._cluster.head_node is None:
            return ""
        logs = _ray.node_logs_dir(self._cluster.head_node)
        if not logs:
            return ""
        tails = []
        for path in sorted(Path(logs).glob("raylet*.err"))[-2:]:
            text = path.read_text(errors="replace").splitlines()[-lines:]
            tails.append(f"--- {path} ---\n" + "\n".join(text))
        return "\n".join(tails)

    def _slice(self, slice_name: str) -> SimulatedSlice:
        if slice_name not in self.slices:
            raise SimulatorError(
                f"no simulated slice {slice_name!r}; have: {', '.join(self.slices) or 'none'}"
            )
        return self.slices[slice_name]

    def _host(self, slice_name: str, worker_id: int) -> SimulatedHost:
        hosts = self._slice(slice_name).hosts
        if not 0 <= worker_id < len(hosts):
            raise SimulatorError(
                f"slice {slice_name} has workers 0..{len(hosts) - 1}, not {worker_id}"
            )
        return hosts[worker_id]


def _driver_on(cluster: Cluster | None) -> bool:
    """Whether this (connected) process's driver is on ``cluster``."""
    if cluster is None:
        return False
    return str(ray.get_runtime_context().gcs_address) == str(cluster.address)


def _suffixes() -> Iterable[str]:
    """a, b, ..., z, aa, ab, ..., zz, aaa, ... (readable, unique, unbounded)."""
    for length in itertools.count(1):
        for letters in itertools.product(string.ascii_lowercase, repeat=length):
            yield "".join(letters)


def _is_host(node: dict[str, Any], slice_name: str, worker_id: int) -> bool:
    labels = node.get("Labels") or {}
    return bool(
        labels.get(SLICE_NAME_LABEL) == slice_name and labels.get(WORKER_ID_LABEL) == str(worker_id)
    )


def _check_driver_env(env: Sequence[str] = HOST_ENV_VARS) -> None:
    """Simulated nodes inherit the driver's env: a TPU_* there would leak into every host."""
    leaked = [name for name in env if name in os.environ]
    if leaked:
        raise SimulatorError(
            f"{', '.join(leaked)} set in this process; simulated hosts would inherit it. "
            "Unset it before starting a SimulatedCluster."
        )
