"""Faults of a simulated host that outlive a process (a retry there meets them again).

:data:`TPU_HANGS`: the TPU hangs whoever opens it, like a bad chip. :data:`UNREACHABLE`: the
user's work's TCP traffic to or from the host is dropped, as by a firewall, while Ray sees
it healthy. Kept as files under the host's root; standard library only (loaded at start).
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
"""How long Linux waits for an unanswered SYN before ``ETIMEDOUT``."""
JOB_ENV = "RAY_JOB_ID"
"""Set by Ray in the processes it starts for a job: the user's work."""
METADATA_ENV = "GCE_METADATA_HOST"


def set_fault(root: Path, fault: str) -> None:
    """Make ``fault`` (one of :data:`FAULTS`, else ``ValueError``) stand on the host."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")
    (root / FAULTS_DIR).mkdir(parents=True, exist_ok=True)
    (root / FAULTS_DIR / fault).touch()


def clear_faults(root: Path) -> None:
    """End every fault of the host (it was replaced or repaired)."""
    for fault in FAULTS:
        (root / FAULTS_DIR / fault).unlink(missing_ok=True)


def has_fault(root: Path, fault: str) -> bool:
    """Whether ``fault`` stands on the host whose root is ``root``."""
    return (root / FAULTS_DIR / fault).exists()


def blocked_ports(shared: Path) -> set[int]:
    """Ports bound by user work on unreachable hosts (``shared``: the simulator's root)."""
    try:
        text = (shared / BLOCKED_PORTS).read_text()
    except OSError:
        return set()
    return {int(line) for line in text.split() if line.isdigit()}


def hang_forever() -> None:
    """Block the calling thread for good: only killing the process ends it."""
    threading.Event().wait()


def install_network_faults(root: Path) -> bool:
    """Make this process's TCP connections obey :data:`UNREACHABLE` if Ray started it
    for a job; return whether it did."""
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
