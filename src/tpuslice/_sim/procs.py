"""Process bookkeeping for the simulator (psutil, which works wherever Ray does): who
descends from whom, who is alive, and signalling by pid."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import psutil


def kill_and_wait(pids: Iterable[int]) -> set[int]:
    """SIGKILL every pid (skipping ones gone or not ours) and wait up to 10 s; return
    those still running (zombies do not count)."""
    processes = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            process.kill()
            processes.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    _, alive = psutil.wait_procs(processes, timeout=10.0)
    return {p.pid for p in alive if pid_alive(p.pid)}


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def descendants(pids: Iterable[int]) -> set[int]:
    """The given pids that are alive and every live process below them."""
    found: set[int] = set()
    for pid in pids:
        try:
            process = psutil.Process(pid)
            found.add(pid)
            found.update(child.pid for child in process.children(recursive=True))
        except psutil.NoSuchProcess:
            continue
    return found


def send_signal(pid: int, sig: int) -> None:
    """Send ``sig`` to ``pid``; a process gone, or not ours, is skipped."""
    with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
        psutil.Process(pid).send_signal(sig)


def process_title(pid: int) -> str:
    """A process's command line (Ray workers set ``ray::<task>``); ``""`` if gone or
    unreadable."""
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return ""
