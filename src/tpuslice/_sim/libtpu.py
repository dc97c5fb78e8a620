"""libtpu's TPU lock on a simulated host: what JAX's first use of the TPU does there.

On a real TPU VM, the first process that starts the TPU backend (JAX's first
``jax.devices()``) opens ``/tmp/libtpu_lockfile`` (``O_CREAT|O_RDWR``, mode 0600), takes
``lockf(F_TLOCK)`` on it and never releases it: the lock ends with the process. At a
normal exit the file is unlinked; after a crash it stays, harmless since nobody holds it.
A second process is refused: JAX raises ``RuntimeError: Unable to initialize backend
'tpu': ABORTED: The TPU is already in use by process with pid N. Not attempting to load
libtpu.so in this process.``, N being the process libtpu finds holding chip 0's device.

:func:`open_tpu` does the same on a simulated host, under its host root
(:data:`HOST_ROOT_ENV`), so code under test meets the ownership rules it would meet on a
TPU VM. JAX reaches it as it reaches libtpu: the simulated host's ``jax_plugins`` module
registers a ``tpu`` backend whose start is :func:`start_backend`. The escape hatches
behave as in libtpu (:func:`tpuslice._host.tpu_lock.lock_wanted`), and
``TPU_LOAD_LIBRARY=0`` fails as libtpu does. On a host whose TPU hangs
(:data:`tpuslice._sim.faults.TPU_HANGS`), the process opens it and then hangs.

Sources: XLA ``xla/stream_executor/tpu/tpu_initialize_util.cc`` (``TryAcquireTpuLock``,
``FindLibtpuProcess``: the lock, its messages, the escape hatches, the holder looked up on
chip 0's device only), JAX ``jax/_src/xla_bridge.py`` (the ``Unable to initialize
backend`` prefix), jax-ml/jax issues 10192 and 22070. libtpu's own source is closed. Its
versions differ on the unlink at exit; this follows the newest released form (unlink if
the lock was held).
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tpuslice._host.tpu_lock import (
    device_holders,
    lock_wanted,
    lockfile,
    tpu_devices,
)
from tpuslice._sim.faults import TPU_HANGS, hang_forever, has_fault
from tpuslice._tpu._process import EXIT_HOOKS

HOST_ROOT_ENV = "TPUSLICE_SIM_HOST_ROOT"
"""Set on a simulated host: the directory that is that host's ``/`` for its TPU."""
BACKEND = "Unable to initialize backend 'tpu': "
"""How JAX reports a TPU backend that failed to start (a ``RuntimeError``)."""
IN_USE = (
    "ABORTED: The TPU is already in use by process with pid {pid}. "
    "Not attempting to load libtpu.so in this process."
)
"""libtpu's message when another process holds the lock (``{pid}``: chip 0's holder)."""
IN_USE_OTHER_USER = (
    "ABORTED: The TPU is already in use by another process probably owned by another "
    'user. Run "$ sudo lsof -w {device}" to figure out which process is using the TPU. '
    'If you still get this message, run "$ sudo rm /tmp/libtpu_lockfile".'
)
"""libtpu's message when the lockfile cannot be opened (another user's file)."""
LOCK_ERROR = (
    "ABORTED: Internal error when accessing libtpu multi-process lockfile. "
    'Run "$ sudo rm /tmp/libtpu_lockfile".'
)
"""libtpu's message when the lock is held but nobody holds chip 0's device."""
NOT_LOADING = "FAILED_PRECONDITION: TPU_LOAD_LIBRARY=0, not loading libtpu"


class LibtpuError(RuntimeError):
    """What JAX raises when libtpu refuses to start (the text is JAX's and libtpu's)."""


def open_tpu() -> Path | None:
    """Start this simulated host's TPU backend in this process, as libtpu would; the
    environment must name a simulated host root (``TPUSLICE_SIM_HOST_ROOT``).

    Idempotent within a process (JAX starts its backend once).

    Returns:
        The lockfile now held by this process, or ``None`` when an escape hatch says not
        to take it (the devices are still opened).

    Raises:
        LibtpuError: another process holds this host's TPU, or ``TPU_LOAD_LIBRARY=0``
            (libtpu's own messages, with JAX's prefix).
        RuntimeError: this is not a simulated host.
    """
    root = os.environ.get(HOST_ROOT_ENV)
    if not root:
        raise RuntimeError(
            f"{HOST_ROOT_ENV} is not set: open_tpu stands in for libtpu on simulated hosts only"
        )
    return OPENED.open(Path(root), os.environ)


def start_backend() -> Any:
    """JAX's ``tpu`` backend on a simulated host: libtpu's start, then a CPU client.

    Returns:
        The XLA client JAX uses as this host's ``tpu`` backend.

    Raises:
        RuntimeError: libtpu's refusal, in its words; JAX prefixes ``Unable to initialize
            backend 'tpu': `` as it does for the real one.
    """
    from jax._src import xla_bridge

    try:
        open_tpu()
    except LibtpuError as exc:
        raise RuntimeError(str(exc).removeprefix(BACKEND)) from None
    return xla_bridge.make_cpu_client()


class OpenedTPU:
    """This process's TPU once opened: the lock it holds (if any), and the device files it
    keeps open, as libtpu keeps ``/dev/accel*`` open: that is how another process's libtpu
    (and :func:`tpuslice._host.tpu_lock.find_owner`) finds it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._devices: list[int] | None = None
        self._lockfile: Path | None = None
        self._lock_fd: int | None = None

    def open(self, root: Path, environ: Mapping[str, str]) -> Path | None:
        """Open the TPU under ``root`` once (see :func:`open_tpu`).

        Args:
            root: The simulated host's root.
            environ: The process's environment (for libtpu's escape hatches).

        Returns:
            The lockfile held, or ``None`` when an escape hatch says not to take it.

        Raises:
            LibtpuError: another process holds the TPU, or ``TPU_LOAD_LIBRARY=0``.
        """
        with self._lock:
            if self._devices is not None:
                return self._lockfile
            if environ.get("TPU_LOAD_LIBRARY") == "0":
                raise LibtpuError(BACKEND + NOT_LOADING)
            if not lock_wanted(environ):
                self._devices = _open_devices(root)
                if has_fault(root, TPU_HANGS):
                    hang_forever()
                return None
            path = lockfile(root)
            self._lock_fd = _take_lock(root, path)
            self._devices, self._lockfile = _open_devices(root), path
        EXIT_HOOKS.add(self.unlink_lock)
        if has_fault(root, TPU_HANGS):
            hang_forever()  # a wedged chip: this process owns the TPU and never gets on
        return path

    def unlink_lock(self) -> None:
        """libtpu removes the lockfile it held at a normal exit (a crash leaves it)."""
        path = self._lockfile
        if path is not None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                return


OPENED = OpenedTPU()
"""This process's TPU, once opened."""


def _take_lock(root: Path, path: Path) -> int:
    """libtpu's lock on ``path``, as its descriptor; refused as libtpu refuses."""
    devices = tpu_devices(root)
    first = str(devices[0]) if devices else "/dev/accel0"
    try:
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    except PermissionError as exc:
        raise LibtpuError(BACKEND + IN_USE_OTHER_USER.format(device=first)) from exc
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno not in (errno.EACCES, errno.EAGAIN):
            raise
        holders = [p for p in device_holders(root, only=devices[:1]) if p != os.getpid()]
        if not holders:
            raise LibtpuError(BACKEND + LOCK_ERROR) from exc
        raise LibtpuError(BACKEND + IN_USE.format(pid=holders[0])) from exc
    return fd


def _open_devices(root: Path) -> list[int]:
    return [os.open(path, os.O_RDONLY) for path in tpu_devices(root)]
