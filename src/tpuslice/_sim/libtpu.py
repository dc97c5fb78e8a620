"""libtpu's TPU lock on a simulated host, reached by JAX through the host's ``jax_plugins``.

The first process takes ``lockf`` on the host's ``/tmp/libtpu_lockfile`` for its life and
keeps the devices open; a second is refused in libtpu's words, naming chip 0's holder, as
XLA's ``tpu_initialize_util.cc`` does.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tpuslice._host.tpu_lock import device_holders, lock_wanted, lockfile, tpu_devices
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
    """Start this simulated host's TPU backend in this process, once, as libtpu would.

    Returns:
        The lockfile now held; ``None`` when an escape hatch says not to take it.

    Raises:
        LibtpuError: another process holds the TPU, or ``TPU_LOAD_LIBRARY=0`` (libtpu's words).
        RuntimeError: this is not a simulated host (no ``TPUSLICE_SIM_HOST_ROOT``).
    """
    root = os.environ.get(HOST_ROOT_ENV)
    if not root:
        raise RuntimeError(
            f"{HOST_ROOT_ENV} is not set: open_tpu stands in for libtpu on simulated hosts only"
        )
    return _OPENED.open(Path(root), os.environ)


def start_backend() -> Any:
    """JAX's ``tpu`` backend on a simulated host: libtpu's start, then a CPU client.
    A refusal is a ``RuntimeError`` in libtpu's words (JAX adds its prefix)."""
    from jax._src import xla_bridge

    try:
        open_tpu()
    except LibtpuError as exc:
        raise RuntimeError(str(exc).removeprefix(BACKEND)) from None
    return xla_bridge.make_cpu_client()


class _OpenedTPU:
    """This process's TPU once opened: the lock it holds (if any) and the device files it
    keeps open, by which other processes find it, as with libtpu's ``/dev/accel*``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._devices: list[int] | None = None
        self._lockfile: Path | None = None
        self._lock_fd: int | None = None

    def open(self, root: Path, environ: Mapping[str, str]) -> Path | None:
        """Open the TPU under ``root`` once, as :func:`open_tpu` says; ``environ`` holds
        libtpu's escape hatches."""
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
        if self._lockfile is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._lockfile)


_OPENED = _OpenedTPU()


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
