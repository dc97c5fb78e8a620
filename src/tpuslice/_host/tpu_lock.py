"""Who owns this host's TPU, found as libtpu finds it (Linux; no Ray). libtpu lets one
process use the TPU, holding ``lockf`` on ``/tmp/libtpu_lockfile`` for life (never deleted
here); the owner is that lock's holder, else a process with a TPU device open."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tpuslice.errors import TPUInUseError, first_line

LOCKFILE = "tmp/libtpu_lockfile"
GOOGLE_PCI_VENDOR_ID = "0x1ae0"
JOB_ENV = "RAY_JOB_ID"  # in a Ray worker's environment
PROC = Path("/proc")
COMMAND_LIMIT = 120
HOST_ROOT = Path("/")
"""Where this host's ``tmp/libtpu_lockfile`` and ``dev/accel*`` live; a process that sees
them elsewhere sets it once at start-up."""


def host_root() -> Path:
    """:data:`HOST_ROOT`, read when called (a process may set it)."""
    return HOST_ROOT


def lockfile(root: Path) -> Path:
    """``<root>/tmp/libtpu_lockfile``."""
    return root / LOCKFILE


def tpu_devices(root: Path) -> list[Path]:
    """One device file per TPU chip, sorted: ``dev/accel<N>`` that are not directories (a
    directory is NVIDIA's; plain files let tests fake chips), else Google's VFIO groups."""
    dev = root / "dev"
    with contextlib.suppress(OSError):
        accel = sorted(p for p in dev.glob("accel*") if not p.is_dir())
        if accel:
            return accel
    groups: list[Path] = []
    with contextlib.suppress(OSError):
        for path in sorted((dev / "vfio").iterdir()):
            iommu = root / "sys" / "kernel" / "iommu_groups" / path.name / "devices"
            if path.name.isdigit() and _google_device_in(iommu):
                groups.append(path)
    return groups


def _google_device_in(devices: Path) -> bool:
    """Whether a device in the IOMMU group is Google's; unreadable is not (a false
    positive would take a NIC's VFIO group for a TPU)."""
    with contextlib.suppress(OSError):
        for vendor in devices.glob("*/vendor"):
            with contextlib.suppress(OSError, ValueError):
                if vendor.read_text(encoding="ascii").strip().lower() == GOOGLE_PCI_VENDOR_ID:
                    return True
    return False


@dataclass(frozen=True)
class TPUOwner:
    """A process that owns a host's TPU."""

    pid: int
    command: str
    """Its command line, cut short."""
    job_id: str | None
    """Its Ray job (``RAY_JOB_ID`` in its environment), if any."""
    uid: int | None
    holds_lock: bool
    """It holds libtpu's lock; else it only has a TPU device open."""

    def describe(self) -> str:
        """``pid 4242 (ray::train, Ray job 01000000)``, for messages and status."""
        parts = [self.command or "?"]
        if self.job_id:
            parts.append(f"Ray job {self.job_id}")
        return f"pid {self.pid} ({', '.join(parts)})"

    def to_dict(self) -> dict[str, Any]:
        """Every field by name, JSON-able."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TPUOwner:
        """The inverse of :meth:`to_dict`; KeyError if a field is missing."""
        return cls(
            pid=int(data["pid"]),
            command=str(data["command"]),
            job_id=data["job_id"],
            uid=data["uid"],
            holds_lock=bool(data["holds_lock"]),
        )


def lock_holder(root: Path) -> int | None:
    """The pid holding a POSIX lock on ``root``'s libtpu lockfile, from ``/proc/locks``."""
    key = _lock_key(root)
    return None if key is None else _posix_lock_holders().get(key)


def _lock_key(root: Path) -> str | None:
    """How ``/proc/locks`` names ``root``'s lockfile (``major:minor:inode``), if it exists."""
    try:
        stat = lockfile(root).stat()
    except OSError:
        return None
    return f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"


def _posix_lock_holders() -> dict[str, int]:
    """Each locked file's ``major:minor:inode`` and its holder, from ``/proc/locks``."""
    try:
        table = (PROC / "locks").read_text()
    except OSError:
        return {}
    holders: dict[str, int] = {}
    for line in table.splitlines():
        fields = line.split()
        # "1: POSIX  ADVISORY  WRITE 4242 fd:01:1234 0 EOF"
        posix = len(fields) >= 6 and fields[1] == "POSIX"  # a waiter has "->" there
        if posix and fields[4].isdigit():
            holders.setdefault(fields[5], int(fields[4]))
    return holders


def device_holders(root: Path, only: Sequence[Path] | None = None) -> list[int]:
    """Pids holding any of ``root``'s TPU devices (or ``only`` these) open, ascending."""
    devices = {str(path) for path in (tpu_devices(root) if only is None else only)}
    if not devices:
        return []
    return [pid for pid in _pids() if _holds(pid, devices)]


def _pids() -> Iterator[int]:
    with contextlib.suppress(OSError):
        for entry in os.scandir(PROC):
            if entry.name.isdigit():
                yield int(entry.name)


def _open_files(pid: int) -> Iterator[str]:
    """What ``pid``'s descriptors point to; unreadable ones are skipped."""
    with contextlib.suppress(OSError):
        for fd in os.scandir(PROC / str(pid) / "fd"):
            with contextlib.suppress(OSError):
                yield os.readlink(fd.path)


def _holds(pid: int, devices: set[str]) -> bool:
    return any(path in devices for path in _open_files(pid))


def _describe_process(pid: int, holds_lock: bool) -> TPUOwner:
    """What ``/proc`` says of ``pid``; fields that cannot be read are empty or ``None``."""
    base = PROC / str(pid)
    command = ""
    with contextlib.suppress(OSError):
        raw = (base / "cmdline").read_bytes().replace(b"\0", b" ").strip()
        command = raw.decode("utf-8", "replace")[:COMMAND_LIMIT]
    job_id = None
    with contextlib.suppress(OSError):
        for item in (base / "environ").read_bytes().split(b"\0"):
            if item.startswith(JOB_ENV.encode() + b"="):
                job_id = item.split(b"=", 1)[1].decode("utf-8", "replace") or None
    uid = None
    with contextlib.suppress(OSError):
        uid = base.stat().st_uid
    return TPUOwner(pid, command, job_id, uid, holds_lock)


def find_owner(root: Path, *, among: Iterable[int] | None = None) -> TPUOwner | None:
    """Who owns ``root``'s TPU (None: free): the lock's holder, else a process with a TPU
    device open, searched only ``among`` these pids if given. The lock alone decides whether
    a new process may start; scanning descriptors is dear."""
    return find_owners([root], among=among).get(root)


def find_owners(
    roots: Sequence[Path], *, among: Iterable[int] | None = None
) -> dict[Path, TPUOwner]:
    """:func:`find_owner` for many host roots on one machine (the simulator's), reading
    ``/proc/locks`` and each process's descriptors once; owned roots only."""
    locks = _posix_lock_holders()
    owners: dict[Path, TPUOwner] = {}
    device_root: dict[str, Path] = {}
    for root in roots:
        key = _lock_key(root)
        if key is not None and key in locks:
            owners[root] = _describe_process(locks[key], True)
        else:
            device_root.update({str(path): root for path in tpu_devices(root)})
    unowned = set(device_root.values())
    pids = (_pids() if among is None else set(among)) if unowned else ()
    for pid in sorted(pids):
        if not unowned:
            break
        for path in _open_files(pid):
            held = device_root.get(path)
            if held is not None and held in unowned:
                owners[held] = _describe_process(pid, False)
                unowned.discard(held)
    return owners


def holds_tpu(pid: int, root: Path) -> bool:
    """Whether ``pid`` holds ``root``'s TPU: libtpu's lock, or any TPU device open."""
    return lock_holder(root) == pid or _holds(pid, {str(path) for path in tpu_devices(root)})


def _env_bool(value: str | None) -> bool:
    """libtpu's ``GetEnvBool``: ``true`` / ``false``, else a nonzero integer is true."""
    if value is None or value == "false":
        return False
    if value == "true":
        return True
    try:
        return int(value) != 0
    except ValueError:
        return False


def lock_wanted(environ: Mapping[str, str]) -> bool:
    """Whether libtpu takes (or is refused) its lock in this environment, as XLA's
    ``TryAcquireTpuLock``: not with ``TPU_LOAD_LIBRARY`` 0/1, ``ALLOW_MULTIPLE_LIBTPU_LOAD``
    true, or chip bounds other than the string ``2,2,1`` (Ray's 1- and 2-chip tasks rely on it)."""
    if environ.get("TPU_LOAD_LIBRARY") in ("0", "1"):
        return False
    if _env_bool(environ.get("ALLOW_MULTIPLE_LIBTPU_LOAD")):
        return False
    bounds = environ.get("TPU_CHIPS_PER_PROCESS_BOUNDS") or environ.get(
        "TPU_CHIPS_PER_HOST_BOUNDS", ""
    )
    return bounds in ("", "2,2,1")


def _host_label() -> str:
    """``<TPU_NAME>/<TPU_WORKER_ID>``, else the machine's host name."""
    name, worker = os.environ.get("TPU_NAME"), os.environ.get("TPU_WORKER_ID")
    return f"{name}/{worker}" if name and worker else os.uname().nodename


def in_use_error(cause: BaseException) -> TPUInUseError:
    """The error for libtpu's refusal ``cause``, naming the host and the owner."""
    host = _host_label()
    owner = find_owner(host_root())
    if owner is not None and owner.pid == os.getpid():
        owner = None  # libtpu refused us, so the holder is someone else we cannot see
    held = owner.describe() if owner else "another process (not visible: another user's?)"
    return TPUInUseError(
        f"the TPU of host {host} is in use by {held}, so this process could not open it "
        f"(libtpu: {first_line(cause)}). One process per host may use the TPU: wait for "
        f"that one to end, or if it is a leftover of yours, stop it with "
        f"`tpuslice release-tpu --host {host}`",
        host=host,
        owner=owner,
    )
