"""One detached agent per TPU host, shared by every driver (tasks would start a worker per
driver): who owns its TPU, and giving it back. Only code on a host can see who holds its
TPU; the agent records it in Ray's KV store, so the cluster view need not ask the host."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import ray

from tpuslice._host.notices import (
    MAINTENANCE_PATH,
    PREEMPTED_PATH,
    Notice,
    notice_period,
    watch_value,
)
from tpuslice._host.tpu_lock import TPUOwner, find_owner, holds_tpu, host_root, lock_holder
from tpuslice._tpu import _ray
from tpuslice._tpu.keys import FREE_KEY_PREFIX, NAMESPACE, NOTICE_KEY_PREFIX, OWNER_KEY_PREFIX
from tpuslice._tpu.labels import SLICE_NAME_LABEL, WORKER_ID_LABEL

logger = logging.getLogger(__name__)

FOREIGN_RECHECK_S = 0.1  # before a second look at an owner not the job's (a dying worker?)
# How often the agent looks at libtpu's lock while no owner is recorded: reservations trust
# the tpu-free/ key, so an outside process taking the TPU is missed this long.
WATCH_S = 0.5
FREE_RENEW_S = 30.0  # the tpu-free/ key is put again this often while free, in case it was lost
IDLE = "ray::IDLE"  # the command line of a Ray worker that runs no task
OWNER_RECHECK_S = 2.0  # how often the agent looks whether a recorded owner still holds the TPU


class OwnerWatch:
    """A daemon thread that has ``refresh`` record the owner again once the recorded one
    lets go of the TPU."""

    def __init__(self, still_holds: Callable[[int], bool], refresh: Callable[[], object]) -> None:
        self._still_holds = still_holds
        self._refresh = refresh
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._thread: threading.Thread | None = None

    def watch(self, pid: int | None) -> None:
        """The owner now recorded (None: none); the first owner starts the thread."""
        with self._lock:
            self._pid = pid
            if pid is None or self._thread is not None:
                return
            self._thread = threading.Thread(
                target=self._run, name="tpuslice-owner-watch", daemon=True
            )
        self._thread.start()

    def check(self) -> bool:
        """Look once; if the recorded owner let go, record the owner again (and say so)."""
        with self._lock:
            pid = self._pid
        if pid is None or self._still_holds(pid):
            return False
        with self._lock:
            if self._pid != pid:  # recorded anew meanwhile: that record is current
                return False
        self._refresh()
        return True

    def _run(self) -> None:
        while True:  # as long as the agent, like its host
            time.sleep(OWNER_RECHECK_S)
            try:
                self.check()
            except Exception:  # a failed look is retried at the next one
                logger.exception("checking the recorded TPU owner failed")


class FreeKey:
    """A host's ``tpu-free/`` key, shown or hidden as it changes, and shown again every
    :data:`FREE_RENEW_S` while free so a lost key comes back. Not thread-safe."""

    def __init__(
        self,
        show: Callable[[], object],
        hide: Callable[[], object],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._show = show
        self._hide = hide
        self._clock = clock
        self._free: bool | None = None  # unknown: an earlier agent may have left it either way
        self._shown_at = 0.0

    def set(self, free: bool) -> None:
        """Make the key say whether the TPU is free."""
        now = self._clock()
        if self._free is free and not (free and now - self._shown_at >= FREE_RENEW_S):
            return
        if free:
            self._show()
            self._shown_at = now
        else:
            self._hide()
        self._free = free


class HostAgent:
    """The agent on one TPU host (a Ray actor); its threads keep the host's records true."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.root = host_root()
        self._notices: dict[str, Notice | None] = {}
        self._notices_lock = threading.Lock()
        self._record_lock = threading.Lock()
        self._records = 0  # a refresh leaves be a record made while it looked
        # The owner record is known absent: only this agent writes it, so no second delete.
        self._stored_free = False
        self._owner_watch = OwnerWatch(lambda pid: holds_tpu(pid, self.root), self._refresh)
        free_key = FREE_KEY_PREFIX + node_id
        self._free_key = FreeKey(
            lambda: _ray.kv_put(free_key, b"1", NAMESPACE),
            lambda: _ray.kv_delete(free_key, NAMESPACE),
        )
        self._watch_recorded()
        threading.Thread(target=self._watch_lock, name="tpuslice-free-watch", daemon=True).start()
        never = threading.Event()  # the watches last as long as the agent, like its host
        labels = ray.get_runtime_context().get_node_labels()
        slice_name = labels.get(SLICE_NAME_LABEL, "")
        worker = labels.get(WORKER_ID_LABEL, "")
        worker_id = int(worker) if worker.isdecimal() else -1

        def describe(kind: str, event: str, since: float) -> Notice:
            deadline = since + notice_period(kind)
            return Notice(kind, event, since, deadline, node_id, slice_name, worker_id)

        for path in (PREEMPTED_PATH, MAINTENANCE_PATH):
            threading.Thread(
                target=watch_value,
                args=(path, self._record_notice, never),
                kwargs={"describe": describe},
                name=f"tpuslice-notice-{path}",
                daemon=True,
            ).start()

    def _record_notice(self, path: str, notice: Notice | None) -> None:
        """One watched value's notice changed: record the most urgent one standing."""
        with self._notices_lock:
            self._notices[path] = notice
            found = [n for n in self._notices.values() if n is not None]
        standing = min(found, key=lambda n: n.deadline, default=None)
        key = NOTICE_KEY_PREFIX + self.node_id
        if standing is None:
            _ray.kv_delete(key, NAMESPACE)
        else:
            logger.warning("%s", standing.describe())
            _ray.kv_put(key, standing.to_json(), NAMESPACE)

    def owner(self, thorough: bool = False) -> dict[str, Any] | None:
        """This host's TPU owner now, recorded (None: free); ``thorough`` searches all pids."""
        return self._record(find_owner(self.root, among=None if thorough else ()))

    def release(
        self, job_id: str, pids: list[int], grace_s: float, timeout_s: float
    ) -> dict[str, Any] | None:
        """Within ``timeout_s``, stop (SIGKILL ``grace_s`` after SIGTERM) whichever of ``pids``,
        worker of ``job_id`` or idle Ray worker (the TPU was free when claimed, so an idle
        holder ran the work) still owns this TPU; the owner left, recorded."""
        deadline = time.monotonic() + timeout_s
        signalled: dict[int, float] = {}
        foreign: set[int] = set()
        ours = set(pids)
        while True:
            owner = find_owner(self.root, among=ours)
            if owner is None or time.monotonic() > deadline:
                return self._record(owner)
            if not owner.command:
                # Exiting (no command line left): its lock goes with it in a moment.
                time.sleep(0.02)
                continue
            idle = owner.command.startswith(IDLE)
            if owner.pid not in ours and owner.job_id != job_id and not idle:
                if owner.pid in foreign:
                    return self._record(owner)
                # Look once more: a worker being killed can lose its environment (and so
                # its job) before its command line, while it still holds the TPU.
                foreign.add(owner.pid)
                time.sleep(FOREIGN_RECHECK_S)
                continue
            first = signalled.setdefault(owner.pid, time.monotonic())
            late = time.monotonic() - first > grace_s
            _signal(owner.pid, signal.SIGKILL if late else signal.SIGTERM)
            # Watched until it has exited: at a normal exit libtpu unlinks its lockfile
            # first, and the devices it still holds are looked for only among ``ours``.
            ours.add(owner.pid)
            time.sleep(0.02)

    def kill(self, pid: int, uid: int, timeout_s: float) -> dict[str, Any] | None:
        """Stop owner ``pid`` (SIGKILL ``timeout_s`` after SIGTERM) if it still owns the TPU
        and is the asking user's (else PermissionError); the owner left, recorded."""
        owner = find_owner(self.root)
        if owner is None or owner.pid != pid:
            return self._record(owner)
        if owner.uid != uid:
            raise PermissionError(
                f"pid {pid} belongs to uid {owner.uid}, not {uid}: only your own processes"
            )
        _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while (now := find_owner(self.root)) is not None and now.pid == pid:
            if time.monotonic() > deadline:
                _signal(pid, signal.SIGKILL)
                deadline += timeout_s
            time.sleep(0.02)
        return self._record(now)

    def look_at_lock(self) -> None:
        """While no owner is recorded, keep the free key true to libtpu's lock. A holder is
        not recorded here: the next reservation's question to this host records it."""
        with self._record_lock:
            if self._stored_free:
                self._free_key.set(lock_holder(self.root) is None)

    def _watch_lock(self) -> None:
        while True:  # as long as the agent, like its host
            try:
                self.look_at_lock()
            except Exception:  # a failed look is retried at the next one
                logger.exception("looking at the TPU's lock failed")
            time.sleep(WATCH_S)

    def _record(self, owner: TPUOwner | None) -> dict[str, Any] | None:
        with self._record_lock:
            self._records += 1
            return self._write(owner)

    def _refresh(self) -> None:
        """Find and record the owner again, unless a record was made meanwhile."""
        with self._record_lock:
            made = self._records
        owner = find_owner(self.root)
        with self._record_lock:
            if self._records == made:
                self._write(owner)

    def _write(self, owner: TPUOwner | None) -> dict[str, Any] | None:
        key = OWNER_KEY_PREFIX + self.node_id
        self._owner_watch.watch(None if owner is None else owner.pid)
        self._free_key.set(owner is None)
        if owner is None:
            if not self._stored_free:
                _ray.kv_delete(key, NAMESPACE)
                self._stored_free = True
            return None
        self._stored_free = False
        data = {**owner.to_dict(), "seen_at": time.time()}
        _ray.kv_put(key, json.dumps(data).encode(), NAMESPACE)
        return owner.to_dict()

    def _watch_recorded(self) -> None:
        """Watch the owner an earlier agent recorded, so its record goes once it lets go.
        Only from ``__init__``, before any call can record."""
        stored = _ray.kv_get(OWNER_KEY_PREFIX + self.node_id, NAMESPACE)
        self._stored_free = stored is None
        if stored is not None:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                self._owner_watch.watch(int(json.loads(stored)["pid"]))


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def forget_free_keys(node_ids: Sequence[str]) -> None:
    """Delete the ``tpu-free/`` keys of dead nodes: their agents died with them."""
    for node in node_ids:
        _ray.kv_delete(FREE_KEY_PREFIX + node, NAMESPACE)


def forget_stale_notices(keys: Iterable[str]) -> None:
    """Delete notice records a reader found stale: their host and its agent are gone."""
    for key in keys:
        _ray.kv_delete(key, NAMESPACE)
