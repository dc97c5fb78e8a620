"""SimulatedCluster: a real local Ray cluster whose nodes look like TPU VMs.

A CPU-only head plus one Ray node per simulated TPU VM, with a real one's labels, resources
and environment. Faults are real: killed hosts' tasks fail with Ray's own errors, and each
host's metadata server gives GCE's notices. ``docs/testing.md`` lists the Ray settings changed.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import queue
import random
import shutil
import signal
import string
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import ray
from ray.cluster_utils import Cluster

from tpuslice._host.context import apply_env
from tpuslice._host.metadata import METADATA_HOST_ENV
from tpuslice._host.tpu_lock import TPUOwner, find_owners
from tpuslice._sim.faults import TPU_HANGS, UNREACHABLE, clear_faults, set_fault
from tpuslice._sim.libtpu import HOST_ROOT_ENV
from tpuslice._sim.metadata_server import MAINTENANCE_EVENT, PREEMPTED, MetadataServer, host_values
from tpuslice._sim.procs import descendants, kill_and_wait, pid_alive, process_title, send_signal
from tpuslice._tpu import _auth, _ray
from tpuslice._tpu._connection import close_connection, connection
from tpuslice._tpu.labels import (
    HOST_ENV_VARS,
    SLICE_NAME_LABEL,
    WORKER_ID_LABEL,
    host_env,
    host_labels,
    host_resources,
)
from tpuslice._tpu.subslice import chip_coordinates
from tpuslice._tpu.topology import SliceShape, slice_shape
from tpuslice.errors import InvalidArgumentError, QueueUnreachableError, TPUSliceError

logger = logging.getLogger(__name__)

MiB = 1024 * 1024
FAST_FAILURE_DETECTION = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 3,
}

IDLE_WORKERS = {"num_workers_soft_limit": 8}
"""Idle workers a host keeps warm. Ray keeps one per logical CPU (100+ on a TPU VM); a
simulated host with few CPUs would end each idle worker right after its task."""

FAST_METRICS = {"metrics_report_interval_ms": 2000}
"""Metrics pushed every 2 s instead of Ray's 10 s, so tests see them sooner."""

HANG_SIGNAL = signal.SIGUSR2
"""What :meth:`SimulatedCluster.hang_host` sends (``sim_site/sitecustomize.py`` handles it)."""
TERMINATE_ON_MAINTENANCE = "TERMINATE_ON_HOST_MAINTENANCE"
MIGRATE_ON_MAINTENANCE = "MIGRATE_ON_HOST_MAINTENANCE"

HEAD_ENV_DEFAULTS = {
    "RAY_USAGE_STATS_ENABLED": "0",
    # With usage stats off, Ray's dashboard still sends one "disabled" report; Ray offers
    # this variable for tests: point it at a loopback port where nothing listens.
    "RAY_USAGE_STATS_REPORT_URL": "http://127.0.0.1:1/",
}
"""Environment of the head's processes, unless the user set these variables."""
_ENV_LOCK = threading.Lock()
HOST_STARTS_AT_ONCE = 4
"""Hosts whose Ray nodes start at once: a start mostly waits for its raylet, so one at a
time leaves the machine idle; four stay within Ray's bound for a raylet to register."""


@contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    """``values`` in ``os.environ`` for the block, restored after (one block at a time)."""
    with _ENV_LOCK:
        saved = {key: os.environ.get(key) for key in values}
        os.environ.update(values)
        try:
            yield
        finally:
            apply_env(saved)


@dataclass(frozen=True)
class _Spawn:
    run: Callable[[], None]
    env: Mapping[str, str]
    done: Future[None]


class _Spawner:
    """Runs each host's spawn step on the starting thread, one at a time, while pool
    threads wait for the raylets: on Linux a node's processes die with the thread that
    spawned them, and Ray reads the host's identity from this process's environment."""

    def __init__(self, block: Callable[[Mapping[str, str]], AbstractContextManager[None]]) -> None:
        self._block = block
        self._queue: queue.SimpleQueue[_Spawn] = queue.SimpleQueue()

    def hand(self, run: Callable[[], None], env: Mapping[str, str]) -> None:
        """From a pool thread: run ``run`` on the starting thread in the block for ``env``."""
        spawn = _Spawn(run, env, Future())
        self._queue.put(spawn)
        spawn.done.result()

    def serve(self, futures: Sequence[Future[None]]) -> None:
        """On the starting thread: run the steps handed over until every start has ended."""
        while not all(future.done() for future in futures):
            try:
                spawn = self._queue.get(timeout=0.05)
            except queue.Empty:
                continue
            try:
                with self._block(spawn.env):
                    spawn.run()
            except BaseException as exc:
                spawn.done.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise
            else:
                spawn.done.set_result(None)


class SimulatorError(TPUSliceError, RuntimeError):
    """The simulated cluster could not start or was used wrongly."""


@dataclass(frozen=True)
class SliceSpec:
    """``count`` slices of one generation and topology (``v6e:4x4:2`` on the CLI).
    ``chips_per_vm`` ``None`` is the shape's default; ``layout_seed`` scrambles the hosts'
    physical positions against their worker ids, as on real slices."""

    accelerator: str
    topology: str
    count: int = 1
    chips_per_vm: int | None = None
    layout_seed: int | None = None

    @classmethod
    def parse(cls, text: str) -> SliceSpec:
        """Parse ``"v6e:4x4"``, ``"v6e:4x4:2"``, ``"v6e:2x4:1:4"`` or ``"v6e:4x4:1::7"``.

        Args:
            text: ``GENERATION:TOPOLOGY[:COUNT[:CHIPS_PER_VM[:LAYOUT_SEED]]]``.

        Returns:
            The spec; its shape is not checked yet (see :meth:`shape`).

        Raises:
            InvalidArgumentError: ``text`` is malformed or a number is not an integer.
        """
        parts = text.strip().split(":")
        if not 2 <= len(parts) <= 5 or not all(parts[:3]) or (len(parts) == 5 and not parts[4]):
            raise InvalidArgumentError(
                f"slice spec {text!r} is malformed; expected GENERATION:TOPOLOGY[:COUNT"
                "[:CHIPS_PER_VM[:LAYOUT_SEED]]], such as 'v6e:4x4:2' or 'v6e:4x4:1::7'"
            )
        try:
            numbers = [int(p) if p else None for p in parts[2:]]
        except ValueError as exc:
            raise InvalidArgumentError(
                f"slice spec {text!r}: count, chips per VM and layout seed must be integers"
            ) from exc
        count = numbers[0] if numbers and numbers[0] is not None else 1
        return cls(parts[0], parts[1], count, *numbers[1:])

    def shape(self) -> SliceShape:
        """The validated shape of each of these slices.

        Returns:
            The shape.

        Raises:
            InvalidArgumentError: ``count`` < 1, or an invalid generation, topology or chips.
        """
        if self.count < 1:
            raise InvalidArgumentError(f"slice count must be >= 1, got {self.count}")
        return slice_shape(self.topology, self.accelerator, self.chips_per_vm)


SliceLike = SliceSpec | tuple[Any, ...] | str


def _as_spec(item: SliceLike) -> SliceSpec:
    if isinstance(item, SliceSpec):
        return item
    if isinstance(item, str):
        return SliceSpec.parse(item)
    return SliceSpec(*item)


def _one_or_many(slices: SliceLike | Iterable[SliceLike]) -> list[SliceLike]:
    """A list of specs; one spec alone (not to be iterated field by field) becomes a list."""
    if isinstance(slices, SliceSpec | str):
        return [slices]
    items = list(slices)
    if items and isinstance(items[0], str) and ":" not in items[0]:
        return [tuple(items)]  # one tuple of fields, such as ("v6e", "4x4", 2)
    return items


@dataclass
class SimulatedHost:
    """One simulated TPU VM: its Ray node (``None`` while dead) and metadata server."""

    slice_name: str
    worker_id: int
    node: Any = None
    metadata: MetadataServer | None = None

    @property
    def alive(self) -> bool:
        """Whether the host has a running Ray node."""
        return self.node is not None


@dataclass
class SimulatedSlice:
    """One simulated TPU slice: its hosts by worker id, and where each sits (``physical``)."""

    name: str
    shape: SliceShape
    tpu_resource_per_chip: int = 1
    hosts: list[SimulatedHost] = field(default_factory=list)
    physical: dict[int, int] = field(default_factory=dict)


class SimulatedCluster:
    """Context manager running a local Ray cluster of simulated TPU slices.

    Start hosts (:meth:`start`, :meth:`add_slice`, :meth:`restore_slice`) from a thread
    that outlives them: on Linux, a node's processes die with the thread that spawned them.

    Examples:
        >>> with SimulatedCluster([("v6e", "4x4", 2)], connect=True) as sim:
        ...     run_on_slice(fn, topology="4x4", accelerator_version="v6e")

    Args:
        slices: Specs or one alone: :class:`SliceSpec`, ``"v6e:4x4:2"`` or ``(gen, topology, ...)``.
        cpus_per_host: Logical CPUs of each simulated host.
        head_cpus: Logical CPUs of the head node.
        tpu_resource_per_chip: ``TPU`` units per chip on every host.
        object_store_mb: Object store size of each node, in MiB.
        connect: ``ray.init`` this process to the cluster once it has started.
        fast_failure_detection: Detect dead nodes in ~1.5 s instead of Ray's ~15 s.
        full_host_agents: Run Ray's full agent (which exports metrics) on every host.
        auth: Require Ray's token authentication; hand :attr:`auth_env` to other drivers.
        progress: Called with each startup step's message (default: logged at INFO).

    Raises:
        InvalidArgumentError: a slice spec is malformed or names no valid shape.
    """

    def __init__(
        self,
        slices: SliceLike | Iterable[SliceLike] = (("v6e", "4x4", 2),),
        *,
        cpus_per_host: int = 8,
        head_cpus: int = 2,
        tpu_resource_per_chip: int = 1,
        object_store_mb: int = 80,
        connect: bool = False,
        fast_failure_detection: bool = True,
        full_host_agents: bool = False,
        auth: bool = False,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.specs = [_as_spec(s) for s in _one_or_many(slices)]
        for spec in self.specs:
            spec.shape()  # validate before starting anything
        self.cpus_per_host = cpus_per_host
        self.head_cpus = head_cpus
        self.tpu_resource_per_chip = tpu_resource_per_chip
        self.object_store_bytes = object_store_mb * MiB
        self._connect_on_start = connect
        self._fast_failure_detection = fast_failure_detection
        self._full_host_agents = full_host_agents
        self.auth = auth
        self.token_path: Path | None = None
        """The file holding the cluster's token while it runs with ``auth=True``."""
        self._saved_auth_env: dict[str, str | None] | None = None
        self._progress = progress or (lambda message: logger.info("%s", message))
        self._cluster: Cluster | None = None
        self._connected = False
        self._known_pids: set[int] = set()
        self._host_starts = itertools.count()
        self.slices: dict[str, SimulatedSlice] = {}
        self.startup_seconds: float | None = None
        self._root: Path | None = None  # holds every host's root

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> SimulatedCluster:
        """Start the head and every host; on failure, shut down what started.

        Returns:
            This cluster.

        Raises:
            SimulatorError: it runs already, ``TPU_*`` is set here, or a host did not start.
        """
        if self._cluster is not None:
            raise SimulatorError("this SimulatedCluster is already running")
        _check_driver_env()
        self._root = Path(tempfile.mkdtemp(prefix="tpuslice-sim-"))
        started = time.monotonic()
        try:
            if self.auth:
                self._require_token()
            self._start_head()
            hosts: list[tuple[SimulatedSlice, int]] = []
            for spec in self.specs:
                for _ in range(spec.count):
                    hosts += self._new_slice(spec.shape(), None, spec.layout_seed)
            self._start_hosts(hosts)
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
        """Shut down; an error from the block wins over one from shutting down (logged)."""
        try:
            self.shutdown()
        except Exception:
            if exc is None:
                raise
            logger.exception("shutting the simulated cluster down failed (after: %r)", exc)

    @property
    def token(self) -> str | None:
        """The cluster's token (``auth=True``, while it runs); ``None`` otherwise."""
        if self.token_path is None:
            return None
        return self.token_path.read_text(encoding="utf-8")

    @property
    def auth_env(self) -> dict[str, str]:
        """The ``RAY_AUTH_*`` variables another driver needs to join; empty without auth."""
        if self.token_path is None:
            return {}
        return {_auth.MODE_ENV: "token", _auth.TOKEN_PATH_ENV: str(self.token_path)}

    @property
    def address(self) -> str:
        """The head's address; raises :class:`SimulatorError` if the cluster is not running."""
        if self._cluster is None:
            raise SimulatorError("the simulated cluster is not running; call start() first")
        return str(self._cluster.address)

    def connect(self, namespace: str | None = None) -> None:
        """``ray.init`` this process to the cluster, then start the hosts' agents and the
        slice queue, as a real cluster's operator would, so no reservation waits for them.

        Args:
            namespace: Ray namespace of this driver (default: an anonymous one).

        Raises:
            SimulatorError: the cluster is not running.
        """
        ray.init(
            address=self.address,
            namespace=namespace,
            log_to_driver=False,
            logging_level=logging.WARNING,
        )
        self._connected = True
        from tpuslice._reserve.queue.actor import start_queue
        from tpuslice._reserve.queue.agents import Agents

        hosts = [h.node.node_id for s in self.slices.values() for h in s.hosts if h.alive]
        connection().part(Agents).handles(hosts)
        try:
            start_queue()
        except QueueUnreachableError as exc:  # the first reservations wait for it instead
            logger.warning("the slice queue did not start with the cluster: %s", exc)

    def shutdown(self) -> None:
        """Disconnect this process if its driver is on this cluster and stop every process
        started, by pid if Ray's teardown fails (its error is raised). Idempotent."""
        cluster, self._cluster = self._cluster, None
        if ray.is_initialized() and (self._connected or _driver_on(cluster)):
            close_connection()
            ray.shutdown()
        self._connected = False
        for sim_slice in self.slices.values():
            _close_metadata(sim_slice)
        self.slices.clear()
        if cluster is None:
            self._forget_token()
            return
        self._known_pids |= self.pids(cluster)
        try:
            cluster.shutdown()
        finally:
            stuck = kill_and_wait(self.leftover_pids())
            if stuck:
                logger.error("simulator processes survived SIGKILL: %s", sorted(stuck))
            self._forget_token()
            root, self._root = self._root, None
            if root is not None:
                shutil.rmtree(root, ignore_errors=True)

    def pids(self, cluster: Cluster | None = None) -> set[int]:
        """Pids of every Ray process of this cluster (nodes and their workers).

        Args:
            cluster: The Ray cluster to look at (default: this one's, if running).

        Returns:
            The pids; empty when the cluster is not running.
        """
        cluster = cluster or self._cluster
        if cluster is None:
            return set()
        roots = [pid for node in cluster.list_all_nodes() for pid in _ray.node_process_pids(node)]
        return descendants(roots)

    def leftover_pids(self) -> set[int]:
        """Pids this cluster ever had that are still alive (none after a clean shutdown).

        Returns:
            The live pids.
        """
        return {pid for pid in self._known_pids | self.pids() if pid_alive(pid)}

    # --- faults and growth -------------------------------------------------------------

    def add_slice(
        self,
        accelerator: str,
        topology: str,
        chips_per_vm: int | None = None,
        tpu_resource_per_chip: int | None = None,
        *,
        layout_seed: int | None = None,
    ) -> str:
        """A slice arriving later, as from an autoscaler.

        Args:
            accelerator: TPU generation, in any accepted spelling.
            topology: The slice's chip grid.
            chips_per_vm: Chips on each host; ``None`` for the shape's default.
            tpu_resource_per_chip: ``TPU`` units per chip on its hosts (default: the cluster's).
            layout_seed: Scramble its hosts' physical positions (see :class:`SliceSpec`).

        Returns:
            The new slice's name (``v6e-16-c``).

        Raises:
            InvalidArgumentError: the generation, topology or chips per VM is not valid.
            SimulatorError: a host did not start or register in time.
        """
        shape = slice_shape(topology, accelerator, chips_per_vm)
        hosts = self._new_slice(shape, tpu_resource_per_chip, layout_seed)
        self._start_hosts(hosts)
        self._wait_for_alive_nodes()
        return hosts[0][0].name

    def kill_host(self, slice_name: str, worker_id: int) -> None:
        """SIGKILL one host and every process on it, like a VM dying.

        Args:
            slice_name: The host's slice.
            worker_id: The host's TPU worker id.

        Raises:
            SimulatorError: no such host, or it is already dead.
        """
        host = self._host(slice_name, worker_id)
        if not host.alive:
            raise SimulatorError(f"host {worker_id} of {slice_name} is already dead")
        assert self._cluster is not None
        doomed = descendants(_ray.node_process_pids(host.node))
        self._known_pids |= doomed
        for pid in doomed:  # workers first: a VM's processes all die at once
            send_signal(pid, signal.SIGKILL)
        self._cluster.remove_node(host.node, allow_graceful=False)
        host.node = None

    def preempt_slice(
        self, slice_name: str, notice_s: float = 30.0, *, wait: bool = True
    ) -> threading.Thread | None:
        """Preempt a slice as GCE does: ``instance/preempted`` turns ``TRUE`` on every host,
        then after ``notice_s`` they all die.

        Args:
            slice_name: The slice; hosts already dead are left as they are.
            notice_s: Seconds of notice (GCE gives about 30; 0 for none).
            wait: Block until the hosts are dead; else they die in a background thread.

        Returns:
            The background thread when ``wait`` is false, else ``None``.

        Raises:
            SimulatorError: no such slice, or ``notice_s`` is negative.
        """
        sim_slice = self._slice(slice_name)
        _check_notice(notice_s)
        if notice_s > 0:
            for host in sim_slice.hosts:
                if host.alive and host.metadata is not None:
                    host.metadata.set(PREEMPTED, "TRUE")

        def die() -> None:
            time.sleep(notice_s)
            for host in sim_slice.hosts:
                if host.alive:
                    self.kill_host(slice_name, host.worker_id)

        return self._later(die, wait, f"preempt {slice_name}")

    def schedule_maintenance(
        self,
        slice_name: str,
        worker_id: int,
        notice_s: float = 60.0,
        *,
        event: str = TERMINATE_ON_MAINTENANCE,
        wait: bool = True,
    ) -> threading.Thread | None:
        """Host maintenance as GCE announces it: ``instance/maintenance-event`` is ``event``
        for ``notice_s``; then a terminated host dies, a migrated one lives on.

        Args:
            slice_name: The host's slice.
            worker_id: Its TPU worker id.
            notice_s: Seconds of notice (GCE gives 60).
            event: ``TERMINATE_ON_HOST_MAINTENANCE`` or ``MIGRATE_ON_HOST_MAINTENANCE``.
            wait: Block until the maintenance is over; else return a background thread.

        Returns:
            The background thread when ``wait`` is false, else ``None``.

        Raises:
            SimulatorError: no such live host, an unknown ``event``, or negative notice.
        """
        host = self._host(slice_name, worker_id)
        if event not in (TERMINATE_ON_MAINTENANCE, MIGRATE_ON_MAINTENANCE):
            raise SimulatorError(
                f"maintenance event {event!r} is not one GCE sends: use "
                f"{TERMINATE_ON_MAINTENANCE} or {MIGRATE_ON_MAINTENANCE}"
            )
        _check_notice(notice_s)
        if not host.alive or host.metadata is None:
            raise SimulatorError(f"host {worker_id} of {slice_name} is dead")
        server = host.metadata
        server.set(MAINTENANCE_EVENT, event)

        def maintain() -> None:
            time.sleep(notice_s)
            if event == TERMINATE_ON_MAINTENANCE and host.alive:
                self.kill_host(slice_name, worker_id)
            else:
                server.set(MAINTENANCE_EVENT, "NONE")

        return self._later(maintain, wait, f"maintain {slice_name}/{worker_id}")

    def hang_host(self, slice_name: str, worker_id: int) -> list[int]:
        """Make the host's user work hang, like a collective stuck on a lost peer: its main
        thread blocks for ever, while Ray sees the host healthy and can still kill it.

        Args:
            slice_name: The host's slice.
            worker_id: Its TPU worker id.

        Returns:
            The pids made to hang.

        Raises:
            SimulatorError: no such host, or it is dead.
        """
        host = self._live_host(slice_name, worker_id)
        hung = [
            pid
            for pid in sorted(descendants(_ray.node_process_pids(host.node)))
            if _is_user_work(pid)
        ]
        for pid in hung:
            send_signal(pid, HANG_SIGNAL)
        return hung

    def wedge_tpu(self, slice_name: str, worker_id: int) -> list[int]:
        """Make the host's TPU hang whoever touches it, now and later, like a bad chip,
        until the host is replaced or repaired (:meth:`repair_host`).

        Args:
            slice_name: The host's slice.
            worker_id: Its TPU worker id.

        Returns:
            The pids of the running work made to hang.

        Raises:
            SimulatorError: no such host, or it is dead.
        """
        self._live_host(slice_name, worker_id)
        set_fault(self.host_root(slice_name, worker_id), TPU_HANGS)
        return self.hang_host(slice_name, worker_id)

    def cut_off_host(self, slice_name: str, worker_id: int) -> None:
        """Cut the user's work on the host off from its peers, as a firewall would (for
        processes started from now on); Ray still sees it healthy.

        Args:
            slice_name: The host's slice.
            worker_id: Its TPU worker id.

        Raises:
            SimulatorError: no such host.
        """
        set_fault(self.host_root(slice_name, worker_id), UNREACHABLE)

    def repair_host(self, slice_name: str, worker_id: int) -> None:
        """End the host's standing faults, as an operator's fix would; hung processes stay.

        Args:
            slice_name: The host's slice.
            worker_id: Its TPU worker id.

        Raises:
            SimulatorError: no such host.
        """
        clear_faults(self.host_root(slice_name, worker_id))

    def metadata_server(self, slice_name: str, worker_id: int) -> MetadataServer:
        """A host's GCE metadata server, to read or set its values.

        Args:
            slice_name: The host's slice.
            worker_id: Its TPU worker id.

        Returns:
            The server.

        Raises:
            SimulatorError: no such host, or it has no server.
        """
        server = self._host(slice_name, worker_id).metadata
        if server is None:
            raise SimulatorError(f"host {worker_id} of {slice_name} has no metadata server")
        return server

    def _later(self, action: Callable[[], None], wait: bool, what: str) -> threading.Thread | None:
        if wait:
            action()
            return None

        def run() -> None:
            try:
                action()
            except Exception:  # the cluster may have been shut down meanwhile
                logger.exception("simulated %s failed", what)

        thread = threading.Thread(target=run, name=f"simulated {what}", daemon=True)
        thread.start()
        return thread

    def restore_slice(self, slice_name: str) -> None:
        """Bring the slice's dead hosts back as new VMs: same labels, no notice or fault.

        Args:
            slice_name: The slice.

        Raises:
            SimulatorError: no such slice, or a host did not start.
        """
        sim_slice = self._slice(slice_name)
        dead = [host for host in sim_slice.hosts if not host.alive]
        for host in dead:
            if host.metadata is not None:
                host.metadata.set(PREEMPTED, "FALSE")
                host.metadata.set(MAINTENANCE_EVENT, "NONE")
            clear_faults(self.host_root(slice_name, host.worker_id))
        self._start_hosts([(sim_slice, host.worker_id) for host in dead])
        self._wait_for_alive_nodes()

    def restart_slice(self, slice_name: str) -> None:
        """Kill every live host of the slice, then bring them all back, holding nothing.

        Args:
            slice_name: The slice.

        Raises:
            SimulatorError: no such slice, or a host did not start.
        """
        for host in self._slice(slice_name).hosts:
            if host.alive:
                self.kill_host(slice_name, host.worker_id)
        self.restore_slice(slice_name)

    def remove_slice(self, slice_name: str) -> None:
        """Kill the slice and forget it.

        Args:
            slice_name: The slice.

        Raises:
            SimulatorError: no such slice.
        """
        self.preempt_slice(slice_name, notice_s=0)
        _close_metadata(self.slices.pop(slice_name))

    def host_root(self, slice_name: str, worker_id: int) -> Path:
        """The host's own root (``TPUSLICE_SIM_HOST_ROOT``): its ``dev/accel*`` and ``tmp/``.

        Args:
            slice_name: The host's slice.
            worker_id: Its TPU worker id.

        Returns:
            The directory.

        Raises:
            SimulatorError: no such host, or the cluster is not running.
        """
        self._host(slice_name, worker_id)
        if self._root is None:
            raise SimulatorError("the simulated cluster is not running; call start() first")
        return self._root / slice_name / str(worker_id)

    def physical_positions(self, slice_name: str) -> dict[int, int]:
        """Each host's physical position in the slice, as its ``libtpu.sdk`` reports it.

        Args:
            slice_name: The slice.

        Returns:
            ``{worker id: physical position}``.

        Raises:
            SimulatorError: no such slice.
        """
        return dict(self._slice(slice_name).physical)

    def tpu_owners(self) -> dict[tuple[str, int], TPUOwner]:
        """Who owns each owned host TPU (read directly: hosts share this machine).

        Returns:
            ``{(slice name, worker id): owner}`` for each owned TPU.
        """
        roots = {
            self.host_root(name, host.worker_id): (name, host.worker_id)
            for name, sim_slice in self.slices.items()
            for host in sim_slice.hosts
        }
        return {roots[root]: owner for root, owner in find_owners(list(roots)).items()}

    def wait_tpus_free(self, timeout: float = 30.0) -> None:
        """Wait (bounded) until no process owns any simulated host's TPU.

        Args:
            timeout: Seconds to wait.

        Raises:
            SimulatorError: some TPU is still owned (named with its owner).
        """
        deadline = time.monotonic() + timeout
        while (owned := self.tpu_owners()) and time.monotonic() < deadline:
            time.sleep(0.05)
        if owned:
            held = "; ".join(f"{s}/{w}: {o.describe()}" for (s, w), o in sorted(owned.items()))
            raise SimulatorError(f"TPUs still owned after {timeout:.0f} s: {held}")

    def wait_until_dead(self, slice_name: str, worker_id: int, timeout: float = 30.0) -> None:
        """Wait (bounded) until Ray's view marks a killed host dead.

        Args:
            slice_name: The host's slice.
            worker_id: The host's TPU worker id.
            timeout: Seconds to wait.

        Raises:
            SimulatorError: Ray still sees the host alive.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not any(n["Alive"] and _is_host(n, slice_name, worker_id) for n in ray.nodes()):
                return
            time.sleep(0.05)
        raise SimulatorError(f"host {worker_id} of {slice_name} still alive after {timeout}s")

    # --- internals ---------------------------------------------------------------------

    def _require_token(self) -> None:
        """A fresh token that this process and (by inheritance) the cluster's present."""
        path = self._root_dir() / "auth_token"
        _auth.write_token(path)
        self.token_path = path
        self._saved_auth_env = _auth.present_token_file(path)

    def _forget_token(self) -> None:
        """Put back this process's own token settings, once everything has stopped."""
        saved, self._saved_auth_env = self._saved_auth_env, None
        self.token_path = None
        if saved is not None:
            _auth.restore_auth_env(saved)

    def _start_head(self) -> None:
        self._progress("starting head node")
        head_args: dict[str, Any] = {
            "num_cpus": self.head_cpus,
            "include_dashboard": False,
            "object_store_memory": self.object_store_bytes,
        }
        system_config = {**IDLE_WORKERS, **FAST_METRICS}
        if self._fast_failure_detection:
            system_config.update(FAST_FAILURE_DETECTION)
        head_args["_system_config"] = system_config
        # The head's processes (its dashboard reports usage) inherit this environment.
        head_env = {key: os.environ.get(key, value) for key, value in HEAD_ENV_DEFAULTS.items()}
        with _environment(head_env):
            self._cluster = Cluster(initialize_head=True, head_node_args=head_args)

    def _new_slice(
        self,
        shape: SliceShape,
        per_chip: int | None = None,
        layout_seed: int | None = None,
    ) -> list[tuple[SimulatedSlice, int]]:
        """Record a new slice with its hosts' metadata servers running; return the hosts."""
        name = self._next_name(shape)
        sim_slice = SimulatedSlice(name, shape, per_chip or self.tpu_resource_per_chip)
        sim_slice.physical = physical_layout(shape, name, layout_seed)
        self.slices[name] = sim_slice
        for worker_id in range(shape.num_hosts):
            values = host_values(name, worker_id, shape.pod_type, shape.topology)
            host = SimulatedHost(name, worker_id, metadata=MetadataServer(values).start())
            sim_slice.hosts.append(host)
        return [(sim_slice, worker_id) for worker_id in range(shape.num_hosts)]

    def _start_hosts(self, hosts: Sequence[tuple[SimulatedSlice, int]]) -> None:
        """Start these hosts' Ray nodes, :data:`HOST_STARTS_AT_ONCE` at a time, each node
        recorded on its host as soon as it exists (see :class:`_Spawner`)."""
        spawner = _Spawner(self._host_start_block)

        def start(sim_slice: SimulatedSlice, worker_id: int) -> None:
            node = self._start_host(sim_slice, worker_id, spawner)
            sim_slice.hosts[worker_id].node = node

        pool = ThreadPoolExecutor(HOST_STARTS_AT_ONCE, thread_name_prefix="simulated host")
        futures = [pool.submit(start, *host) for host in hosts]
        try:
            try:
                spawner.serve(futures)
            except BaseException:
                # A failure or Ctrl-C: start no more, and let the starts under way
                # finish, so that shutdown() finds every node this call started.
                for future in futures:
                    future.cancel()
                spawner.serve(futures)
                raise
        finally:
            pool.shutdown(wait=True)
        for future in futures:
            future.result()

    def _start_host(self, sim_slice: SimulatedSlice, worker_id: int, spawner: _Spawner) -> Any:
        assert self._cluster is not None
        shape, name = sim_slice.shape, sim_slice.name
        self._progress(f"starting {name} host {worker_id + 1}/{shape.num_hosts}")
        root = self.host_root(name, worker_id)
        make_host_root(root, shape, name, worker_id, sim_slice.physical)
        server = sim_slice.hosts[worker_id].metadata
        env = {
            **host_env(shape, name, worker_id),
            HOST_ROOT_ENV: str(root),
            "PYTHONPATH": host_pythonpath(),
            **({METADATA_HOST_ENV: server.host} if server is not None else {}),
        }
        # Hosts start at once, and Ray names a node's sockets by the first free name,
        # which two nodes starting together would both take: name them here.
        sockets = self._root_dir() / "sockets"
        sockets.mkdir(exist_ok=True)
        start = next(self._host_starts)
        try:
            with _ray.node_processes_started_by(lambda run: spawner.hand(run, env)):
                return self._cluster.add_node(
                    wait=False,
                    num_cpus=self.cpus_per_host,
                    object_store_memory=self.object_store_bytes,
                    resources=host_resources(
                        shape, name, worker_id, sim_slice.tpu_resource_per_chip
                    ),
                    labels=host_labels(shape, name, worker_id),
                    env_vars=env,
                    raylet_socket_name=str(sockets / f"raylet.{start}"),
                    plasma_store_socket_name=str(sockets / f"plasma.{start}"),
                )
        except (OSError, RuntimeError, TimeoutError) as exc:
            raise SimulatorError(
                f"could not start {name} host {worker_id}: {exc}\n{self._log_tail()}"
            ) from exc

    @contextmanager
    def _host_start_block(self, env: Mapping[str, str]) -> Iterator[None]:
        """Ray reads a starting node's TPU from this process's environment: set the host's."""
        agents: AbstractContextManager[None] = (
            nullcontext() if self._full_host_agents else _ray.minimal_node_agents()
        )
        with _environment(env), agents:
            yield

    def _root_dir(self) -> Path:
        assert self._root is not None
        return self._root

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

    def _live_host(self, slice_name: str, worker_id: int) -> SimulatedHost:
        host = self._host(slice_name, worker_id)
        if not host.alive:
            raise SimulatorError(f"host {worker_id} of {slice_name} is dead")
        return host


SIM_SITE = Path(__file__).parent / "sim_site"
"""Stand-ins for what simulated hosts import from a TPU VM, put on their ``PYTHONPATH``."""


def host_pythonpath() -> str:
    """A simulated host's ``PYTHONPATH``: :data:`SIM_SITE` first, then this process's own."""
    paths = [str(SIM_SITE), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return os.pathsep.join(dict.fromkeys(paths))


def _close_metadata(sim_slice: SimulatedSlice) -> None:
    for host in sim_slice.hosts:
        if host.metadata is not None:
            host.metadata.close()
            host.metadata = None


def _check_notice(notice_s: float) -> None:
    if not notice_s >= 0:
        raise SimulatorError(f"notice_s must be seconds >= 0, got {notice_s!r}")


USER_WORK_EXCLUDED = (
    "ray::IDLE",
    "ray::DashboardAgent",
    "ray::RuntimeEnvAgent",
    "ray::HostAgent",
    "ray::SliceQueueActor",
)
"""Process titles :meth:`SimulatedCluster.hang_host` leaves running: idle workers, Ray's
agents and tpuslice's own actors (a stuck collective does not stop those)."""


def _is_user_work(pid: int) -> bool:
    title = process_title(pid).strip()
    return title.startswith("ray::") and not title.startswith(USER_WORK_EXCLUDED)


def physical_layout(shape: SliceShape, name: str, seed: int | None) -> dict[int, int]:
    """``{worker id: physical position}``: in worker-id order, or shuffled by ``seed``
    and ``name`` (so slices with one seed differ)."""
    positions = list(range(shape.num_hosts))
    if seed is not None:
        random.Random(f"{seed}:{name}").shuffle(positions)
    return dict(enumerate(positions))


def make_host_root(
    path: Path, shape: SliceShape, slice_name: str, worker_id: int, physical: Mapping[int, int]
) -> None:
    """Make (if new) a host's root: ``dev/accel*``, ``tmp/`` and the ``chip_coords.json``
    its ``libtpu.sdk`` reports (``physical``: see :func:`physical_layout`)."""
    (path / "tmp").mkdir(parents=True, exist_ok=True)
    (path / "dev").mkdir(exist_ok=True)
    for chip in range(shape.chips_per_host):
        (path / "dev" / f"accel{chip}").touch()
    coordinates = _chip_coordinates(shape, physical[worker_id])
    if coordinates is not None:
        (path / "chip_coords.json").write_text(
            json.dumps({"hostname": f"{slice_name}-w-{worker_id}", "coordinates": coordinates})
        )


def _chip_coordinates(shape: SliceShape, physical: int) -> list[list[int]] | None:
    """The host's chip coordinates; ``None`` if the hosts do not tile the chip grid."""
    grid = shape.worker_grid
    if len(grid) != len(shape.dims):
        return None
    return chip_coordinates(physical, shape.topology, grid)


def _driver_on(cluster: Cluster | None) -> bool:
    if cluster is None:
        return False
    return str(ray.get_runtime_context().gcs_address) == str(cluster.address)


def _suffixes() -> Iterable[str]:
    """a, b, ..., z, aa, ab, ... (readable, unique, unbounded)."""
    for length in itertools.count(1):
        for letters in itertools.product(string.ascii_lowercase, repeat=length):
            yield "".join(letters)


def _is_host(node: dict[str, Any], slice_name: str, worker_id: int) -> bool:
    labels = node.get("Labels") or {}
    return bool(
        labels.get(SLICE_NAME_LABEL) == slice_name and labels.get(WORKER_ID_LABEL) == str(worker_id)
    )


def _check_driver_env(env: Sequence[str] = (*HOST_ENV_VARS, HOST_ROOT_ENV)) -> None:
    """Simulated nodes inherit the driver's env: a TPU_* there would leak into every host."""
    leaked = [name for name in env if name in os.environ]
    if leaked:
        raise SimulatorError(
            f"{', '.join(leaked)} set in this process; simulated hosts would inherit it. "
            "Unset it before starting a SimulatedCluster."
        )
