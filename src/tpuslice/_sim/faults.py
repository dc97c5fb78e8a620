"""Faults of a simulated host that outlive any one process: files under the host's root.

Two real failure modes that a retry on the same host meets again, which is why a slice
that failed someone should be checked before it is trusted (:func:`tpuslice.check_slice`):

- **A TPU that hangs whoever touches it** (:data:`TPU_HANGS`). A bad chip, a wedged
  driver or a broken ICI link leaves libtpu's start-up, or the first collective, blocked
  rather than failed; users name it: "crashes are better than hangs" (levanter PR 877),
  and axlearn aborts on megascale hangs (``--megascale_abort_on_hangs``, apple/axlearn
  PR 716) and checks every TPU before training starts (PR 803). On a marked host, the
  simulated libtpu (:func:`tpuslice._sim.libtpu.open_tpu`) takes the lock and opens the
  devices as usual, then blocks the calling thread for ever, so the process owns the TPU
  while it hangs, as a real one would.
- **A host its peers cannot reach** (:data:`UNREACHABLE`). ``jax.distributed.initialize``
  first connects every rank to the coordinator's port on rank 0; a firewall rule or a
  network fault that drops that traffic leaves ranks waiting until ``DEADLINE_EXCEEDED``,
  while Ray's own control plane, on other ports, sees the host healthy (jax-ml/jax issue
  35905: on a v6e-16, GCP's firewall rule opened 8476 but not the coordinator port JAX
  0.8.1 moved to, and ``initialize`` hung until its deadline).
  On a marked host, the Python-level TCP connections of the user's work processes (those
  Ray started for a job) are dropped, and so are connections from any host to a port that
  such a process bound there. Dropped means as a firewall drops: ``connect`` waits for the
  socket's timeout (at most :data:`DROP_S`, Linux's give-up time for an unanswered SYN),
  then fails with ``ETIMEDOUT``. Ray's processes, written in C++ or not started for a job,
  are untouched, and so is the host's metadata server.

A host replaced by a new VM (:meth:`~tpuslice.testing.SimulatedCluster.restore_slice`
after a kill) is healthy again; :meth:`~tpuslice.testing.SimulatedCluster.repair_host`
clears a living host's faults, as an operator's fix would. Standard library only: every
simulated host's Python processes load this at start (``sim_site/sitecustomize.py``).
"""

from __future__ import annotations

import errno
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

FAULTS_DIR = "faults"
"""Under a host's root: one empty file per fault that stands."""
TPU_HANGS = "tpu-hangs"
UNREACHABLE = "unreachable"
FAULTS = (TPU_HANGS, UNREACHABLE)
BLOCKED_PORTS = "blocked-ports"
"""Under the simulator's root (shared by its hosts): ports that user work on an
unreachable host bound, one per line."""
DROP_S = 127.0
"""How long Linux waits for an unanswered SYN before ``ETIMEDOUT`` (6 retries, from 1 s
doubling): a dropped ``connect`` with no timeout of its own waits this long."""
JOB_ENV = "RAY_JOB_ID"
"""Set by Ray in the processes it starts for a job: the user's work."""
METADATA_ENV = "GCE_METADATA_HOST"


def set_fault(root: Path, fault: str) -> None:
    """Make ``fault`` stand on the host whose root is ``root``.

    Args:
        root: The host's root.
        fault: One of :data:`FAULTS`.

    Raises:
        ValueError: an unknown fault.
    """
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
    (root / FAULTS_DIR).mkdir(parents=True, exist_ok=True)
    (root / FAULTS_DIR / fault).touch()


def clear_faults(root: Path) -> None:
    """End every fault of the host (it was replaced or repaired).

    Args:
        root: The host's root.
    """
    for fault in FAULTS:
        (root / FAULTS_DIR / fault).unlink(missing_ok=True)


def has_fault(root: Path, fault: str) -> bool:
    """Whether ``fault`` stands on the host.

    Args:
        root: The host's root.
        fault: One of :data:`FAULTS`.

    Returns:
        True if it does.
    """
    return (root / FAULTS_DIR / fault).exists()


def blocked_ports(shared: Path) -> set[int]:
    """Ports bound by user work on unreachable hosts.

    Args:
        shared: The simulator's root (a host root's grandparent).

    Returns:
        The ports.
    """
    try:
        text = (shared / BLOCKED_PORTS).read_text()
    except OSError:
        return set()
    return {int(line) for line in text.split() if line.isdigit()}


def hang_forever() -> None:
    """Block the calling thread for good: only killing the process ends it."""
    threading.Event().wait()


def install_network_faults(root: Path) -> bool:
    """Make this process's TCP connections obey :data:`UNREACHABLE` (see the module
    docstring); only a process Ray started for a job is affected.

    Args:
        root: This process's host root.

    Returns:
        Whether the process is the user's work (and so now obeys the fault).
    """
    if not os.environ.get(JOB_ENV):
        return False
    shared = root.parent.parent
    metadata = os.environ.get(METADATA_ENV, "")
    cls: Any = socket.socket
    real_bind: Callable[..., Any] = cls.bind
    real_connect: Callable[..., Any] = cls.connect
    real_connect_ex: Callable[..., Any] = cls.connect_ex

    def dropped(sock: socket.socket, address: Any) -> bool:
        if sock.family not in (socket.AF_INET, socket.AF_INET6) or not isinstance(address, tuple):
            return False
        if f"{address[0]}:{address[1]}" == metadata:
            return False  # the host's own metadata server is on the host
        return has_fault(root, UNREACHABLE) or int(address[1]) in blocked_ports(shared)

    def wait_out(sock: socket.socket) -> None:
        timeout = sock.gettimeout()
        time.sleep(DROP_S if timeout is None else min(timeout, DROP_S))

    def bind(self: socket.socket, address: Any) -> None:
        real_bind(self, address)
        if self.family in (socket.AF_INET, socket.AF_INET6) and has_fault(root, UNREACHABLE):
            with (shared / BLOCKED_PORTS).open("a") as out:
                out.write(f"{self.getsockname()[1]}\n")

    def connect(self: socket.socket, address: Any) -> None:
        if dropped(self, address):
            wait_out(self)
            raise TimeoutError(errno.ETIMEDOUT, os.strerror(errno.ETIMEDOUT))
        real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        if dropped(self, address):
            wait_out(self)
            return errno.ETIMEDOUT
        result: int = real_connect_ex(self, address)
        return result

    cls.bind, cls.connect, cls.connect_ex = bind, connect, connect_ex
    return True
