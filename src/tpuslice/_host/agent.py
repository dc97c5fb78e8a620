"""One small agent per TPU host: who owns its TPU, and giving it back.

Only code running on a host can see who holds its TPU (``/proc``, libtpu's lockfile).
Asking through tasks would start a worker process on every host for every new driver,
so tpuslice keeps one detached
actor per TPU host instead, ``tpuslice-host:<node id>`` in the ``tpuslice`` namespace,
created on first use and shared by every driver. It uses no resources and dies with its host.

- :func:`probe_owners`: each host's TPU owner, if any.
- :func:`release_tpus`: on each host, stop this job's processes that still own the TPU
  (SIGTERM, then SIGKILL after a grace), and confirm the TPU is free of them.
- :func:`kill_owner`: stop a named owner on request (``tpuslice release-tpu``), only a
  process of the same user.

Every agent records what it finds in Ray's KV store (``tpu-owner/<node id>``), so the
cluster view (:func:`tpuslice._view.cluster.read_snapshot`) shows a host whose TPU a process
holds as busy, with the reason, without asking any host.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from tpuslice._host.notices import (
    MAINTENANCE_PATH,
    PREEMPTED_PATH,
    Notice,
    notice_period,
    watch_value,
)
from tpuslice._host.suspects import Suspect, forget, live_suspects
from tpuslice._host.tpu_lock import TPUOwner, find_owner, holds_tpu, host_root, lock_holder
from tpuslice._tpu import _ray
from tpuslice._tpu.keys import AGENT_NAME_PREFIX as NAME_PREFIX
from tpuslice._tpu.keys import (
    FREE_KEY_PREFIX,
    HOST_KEY_PREFIX,
    NAMESPACE,
    NOTICE_KEY_PREFIX,
    OWNER_KEY_PREFIX,
    PREEMPT_KEY_PREFIX,
    SUSPECT_KEY_PREFIX,
)
from tpuslice._tpu.labels import SLICE_NAME_LABEL, WORKER_ID_LABEL

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 60.0
"""Bound on one round of agent calls; the first on a host includes starting its agent."""
LOOKUPS_AT_ONCE = 8
"""Agent handles a driver looks up at once (threads, each waiting on the GCS)."""
GRACE_S = 2.0
"""How long an owner may take to exit after SIGTERM before it gets SIGKILL."""
RELEASE_TIMEOUT_S = 15.0
FOREIGN_RECHECK_S = 0.1
"""How long a hand-back waits to look again at a TPU owner that seems not to be the
job's before it leaves it be (a worker being killed can seem so for a moment)."""
START_WAIT_S = 1.0
"""How long a reservation waits for an agent not yet known to be up (it may be
starting) before it counts that host's TPU as free."""
FREE_TRUST_S = 2.0
"""How long this driver trusts its own finding that a host's TPU is free (from a probe
or a hand-back) before a reservation asks that host again. Back-to-back jobs in one
driver skip a probe round; a process outside Ray that takes the TPU meanwhile is met by
the next call instead (a TPUInUseError naming it) and recorded at that slice's
hand-back."""


WATCH_S = 0.5
"""How often a host's agent looks at libtpu's lock while no owner is recorded, to keep
its ``tpu-free/`` key true. A reservation does not ask a host whose key the cluster read
found (:meth:`tpuslice._reserve.claim.Reserver._ask_owners`), so a process outside Ray
that takes the TPU is missed for at most this long plus the read's age (at most
:data:`~tpuslice._reserve.claim.FREE_KEY_TRUST_S`); it is then met by
the first call, a TPUInUseError naming it, as for a host this driver saw free lately."""
FREE_RENEW_S = 30.0
"""How often a host's agent puts its ``tpu-free/`` key again while the TPU stays free
(one KV write per host per this long), in case the key was lost."""
IDLE = "ray::IDLE"
"""The command line Ray gives a worker process that runs no task."""
OWNER_RECHECK_S = 2.0
"""While a TPU owner is recorded for a host, how often its agent looks whether that
process still holds the TPU: the record of one that exited must not keep the slice busy
until someone happens to ask the host again."""


class OwnerWatch:
    """Keeps a host's TPU-owner record true after the owner lets go: while an owner is
    recorded, a daemon thread looks every ``period`` seconds whether that process still
    holds the TPU (:func:`~tpuslice._host.tpu_lock.holds_tpu`: one read of
    ``/proc/locks`` and of its descriptors), and once it does not, has the owner found
    and recorded again (nobody, or whoever took it meanwhile).

    Args:
        still_holds: Whether a pid still holds this host's TPU.
        refresh: Find this host's owner again and record it (which calls :meth:`watch`).
        period: Seconds between looks.
    """

    def __init__(
        self,
        still_holds: Callable[[int], bool],
        refresh: Callable[[], object],
        period: float = OWNER_RECHECK_S,
    ) -> None:
        self._still_holds = still_holds
        self._refresh = refresh
        self._period = period
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._thread: threading.Thread | None = None

    def watch(self, pid: int | None) -> None:
        """The owner now recorded (``None``: none is); the first owner starts the thread.

        Args:
            pid: The recorded owner's pid.
        """
        with self._lock:
            self._pid = pid
            if pid is None or self._thread is not None:
                return
            self._thread = threading.Thread(
                target=self._run, name="tpuslice-owner-watch", daemon=True
            )
        self._thread.start()

    def check(self) -> bool:
        """Look once: if the recorded owner no longer holds the TPU, find and record the
        owner again.

        Returns:
            Whether the record was refreshed.
        """
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
            time.sleep(self._period)
            try:
                self.check()
            except Exception:  # a failed look is retried at the next one
                logger.exception("checking the recorded TPU owner failed")


class FreeKey:
    """A host's ``tpu-free/<node id>`` key: present while its agent last saw the TPU free.
    Written when what it says changes (a put or a delete per change, none per look), and
    put again every :data:`FREE_RENEW_S` while free, so that a key lost meanwhile (a GCS
    restarted without a persistent store, or deleted as a dead node's by a cluster read
    that raced this node's join) comes back. Not thread-safe: the agent calls it under its
    record lock.

    Args:
        show: Writes the key.
        hide: Deletes it.
        clock: Monotonic seconds.
    """

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
        self._free: bool | None = None
        """What the key says now; unknown at first, since an earlier agent of this host
        (one Ray restarted) may have left it either way."""
        self._shown_at = 0.0

    def set(self, free: bool) -> None:
        """Make the key say whether the TPU is free.

        Args:
            free: Whether it is.
        """
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
    """The agent on one TPU host (a Ray actor; see the module docstring). It also
    watches the host's metadata for preemption and maintenance notices (one long-poll
    per value, in daemon threads) and records the one standing (:mod:`tpuslice._host.notices`),
    and keeps its TPU-owner record true once the owner lets go (:class:`OwnerWatch`).
    While no owner is recorded, a daemon thread looks at libtpu's lock every
    :data:`WATCH_S` and keeps the host's ``tpu-free/`` key true (:class:`FreeKey`).
    """

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.root = host_root()
        self._notices: dict[str, Notice | None] = {}
        self._notices_lock = threading.Lock()
        self._record_lock = threading.Lock()
        self._records = 0
        """How many owner records this agent made: a refresh that finds one made while it
        looked leaves that one be."""
        self._stored_free = False
        """Whether this host's owner record is known to be absent. Only this host's agent
        writes it, so a free TPU found again needs no second delete (a GCS round trip on
        every reservation's probe)."""
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

    def _standing(self) -> Notice | None:
        with self._notices_lock:
            found = [n for n in self._notices.values() if n is not None]
        return min(found, key=lambda n: n.deadline) if found else None

    def _record_notice(self, path: str, notice: Notice | None) -> None:
        """One watched value's notice changed: record the most urgent one standing."""
        with self._notices_lock:
            self._notices[path] = notice
        standing = self._standing()
        key = NOTICE_KEY_PREFIX + self.node_id
        if standing is None:
            _ray.kv_delete(key, NAMESPACE)
        else:
            logger.warning("%s", standing.describe())
            _ray.kv_put(key, standing.to_json(), NAMESPACE)

    def owner(self, thorough: bool = False) -> dict[str, Any] | None:
        """This host's TPU owner now (and recorded for the cluster view).

        Args:
            thorough: Also search every process's descriptors for one that bypassed
                libtpu's lock (``status --owners``); else only the lock is read, which is
                what decides whether a new process may start (reservations).

        Returns:
            The owner as :meth:`TPUOwner.to_dict` data, or ``None`` if the TPU is free.
        """
        return self._record(find_owner(self.root, among=None if thorough else ()))

    def release(
        self, job_id: str, pids: list[int], grace_s: float, timeout_s: float
    ) -> dict[str, Any] | None:
        """Stop every process that ran the work being handed back and still owns this
        host's TPU: one of ``pids``, a worker started for Ray job ``job_id``, or an idle
        Ray worker (``ray::IDLE``: the work's bundle held this TPU, and the reservation
        found it free when it claimed it, so an idle worker holding it ran that work,
        even one Ray started before the job whose environment names none). Wait until
        none does.

        Args:
            job_id: The Ray job handing the slice back (hex).
            pids: Processes that ran its work on this host.
            grace_s: Seconds from SIGTERM to SIGKILL.
            timeout_s: How long to wait in all.

        Returns:
            The owner left (recorded): ``None``, a process of someone else (never
            stopped here), or, if the time ran out, one of ours that would not die.
        """
        deadline = time.monotonic() + timeout_s
        signalled: dict[int, float] = {}
        foreign: set[int] = set()
        ours = set(pids)
        while True:
            owner = find_owner(self.root, among=ours)
            if owner is None or time.monotonic() > deadline:
                return self._record(owner)
            if not owner.command:
                # Exiting (a process being killed has no command line left): its lock
                # and devices go with it in a moment; it is nobody's to judge or signal.
                time.sleep(0.02)
                continue
            idle = owner.command.startswith(IDLE)
            if owner.pid not in ours and owner.job_id != job_id and not idle:
                if owner.pid in foreign:
                    return self._record(owner)
                # Looked at once more before it is called someone else's: a worker of
                # this job killed a moment ago can lose its environment (and so its job)
                # before its command line, while it still holds the TPU.
                foreign.add(owner.pid)
                time.sleep(FOREIGN_RECHECK_S)
                continue
            first = signalled.setdefault(owner.pid, time.monotonic())
            late = time.monotonic() - first > grace_s
            _signal(owner.pid, signal.SIGKILL if late else signal.SIGTERM)
            time.sleep(0.02)

    def kill(self, pid: int, uid: int, timeout_s: float) -> dict[str, Any] | None:
        """Stop owner ``pid`` if it still owns this TPU and belongs to user ``uid``.

        Args:
            pid: The owner to stop.
            uid: The asking user; the process must be theirs.
            timeout_s: Seconds from SIGTERM to SIGKILL.

        Returns:
            The owner left afterwards (recorded), ``None`` if the TPU is free.

        Raises:
            PermissionError: the process belongs to another user.
        """
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
        """Look once at libtpu's lock and keep the free key true. While an owner is
        recorded the key is already gone, and :class:`OwnerWatch` looks instead. A holder
        found here is not recorded: the key goes, and the next reservation asks this
        host, whose answer records it (what a probe finds is what it always recorded)."""
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
        """The recorded owner let go: find the owner again (every process searched, as
        ``status --owners`` does) and record it, unless a record was made meanwhile."""
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
        """Watch the owner an earlier agent of this host recorded (it died, or Ray
        restarted it), so that record too goes once its process lets go. Called only
        from ``__init__``, before any call can record."""
        stored = _ray.kv_get(OWNER_KEY_PREFIX + self.node_id, NAMESPACE)
        self._stored_free = stored is None
        if stored is not None:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                self._owner_watch.watch(int(json.loads(stored)["pid"]))


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return


# --- the driver's side --------------------------------------------------------------------

_remote_agent = ray.remote(num_cpus=0, max_restarts=-1)(HostAgent)


class Agents:
    """This driver's handles to the host agents, and what their answers told it: which
    agents are up, and when each host's TPU was last seen free.

    A host's own lock is held while its handle is found or created, so that it gets one
    agent, and the hosts of one reservation are looked up at once (:meth:`handles`); the
    notes are single dict and set operations, taken without a lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        """Guards :attr:`_host_locks`."""
        self._host_locks: dict[str, threading.Lock] = {}
        self._handles: dict[str, Any] = {}
        self._free_at: dict[str, float] = {}
        """Node id -> when this driver last saw its TPU free (monotonic seconds)."""
        self._up: set[str] = set()
        """Nodes whose agents have answered this process: they are up."""

    def handle(self, node_id: str) -> Any:
        """The agent actor of one node, created there if it has none (cached).

        An existing agent is looked up by name (well under a millisecond); only a missing
        one is created, since creating (even ``get_if_exists``) makes a new driver export
        the actor class first.

        Args:
            node_id: Hex id of a live node.

        Returns:
            Its actor handle.
        """
        handle = self._handles.get(node_id)
        if handle is not None:
            return handle
        with self._lock:
            host_lock = self._host_locks.setdefault(node_id, threading.Lock())
        with host_lock:
            handle = self._handles.get(node_id)  # another thread's, found meanwhile
            if handle is None:
                try:
                    handle = ray.get_actor(NAME_PREFIX + node_id, namespace=NAMESPACE)
                except ValueError:  # no agent there yet
                    handle = _remote_agent.options(
                        name=NAME_PREFIX + node_id,
                        namespace=NAMESPACE,
                        lifetime="detached",
                        get_if_exists=True,
                        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                    ).remote(node_id)
                self._handles[node_id] = handle
            return handle

    def handles(self, node_ids: Sequence[str]) -> dict[str, Any]:
        """The agents of several nodes; those this driver has no handle to yet are looked
        up at once (each lookup is a round trip to the GCS, which a fresh driver's first
        reservation of 16 hosts would otherwise pay 16 times in a row).

        Args:
            node_ids: Hex ids of live nodes.

        Returns:
            Node id -> its agent's actor handle.
        """
        missing = [n for n in dict.fromkeys(node_ids) if n not in self._handles]
        if len(missing) > 1:
            with ThreadPoolExecutor(min(LOOKUPS_AT_ONCE, len(missing))) as pool:
                list(pool.map(self.handle, missing))
        return {node: self.handle(node) for node in node_ids}

    def forget(self, node_id: str) -> None:
        """Drop a node's handle after a failed call (found or created again next time).

        Args:
            node_id: The node.
        """
        self._handles.pop(node_id, None)

    def note(self, node_id: str, owner: object) -> None:
        """Remember that the node's agent answered, and when its host was seen free
        (forget that as soon as it was seen owned).

        Args:
            node_id: The node.
            owner: What the agent answered: ``None`` when the TPU is free.
        """
        self._up.add(node_id)
        if owner is None:
            self._free_at[node_id] = time.monotonic()
        else:
            self._free_at.pop(node_id, None)

    def vouched(self, node_ids: Collection[str]) -> None:
        """Remember that these nodes' agents are up: each wrote its ``tpu-free/`` key,
        so an ask of one that is slow to answer is waited for, not taken as free.

        Args:
            node_ids: The nodes whose keys a cluster read listed.
        """
        self._up.update(node_ids)

    def is_up(self, node_id: str) -> bool:
        """Whether the node's agent has answered this process, or a listing showed its
        ``tpu-free/`` key (:meth:`vouched`; a dead node's key lasts until a cluster read
        deletes it).

        Args:
            node_id: The node.

        Returns:
            True once either happened.
        """
        return node_id in self._up

    def seen_free_within(self, node_id: str, seconds: float, now: float) -> bool:
        """Whether this driver saw the node's TPU free less than ``seconds`` before ``now``.

        Args:
            node_id: The node.
            seconds: How recent the finding must be.
            now: Monotonic seconds.

        Returns:
            True if it was seen free that recently.
        """
        return now - self._free_at.get(node_id, -seconds) < seconds


AGENTS = Agents()
"""This driver's agent handles."""


def _round(
    node_ids: Sequence[str], call: Callable[[str, Any], Any], timeout_s: float
) -> dict[str, TPUOwner | Exception | None]:
    """Call every node's agent at once; each node's owner, or the error its call met."""
    refs = {node: call(node, handle) for node, handle in AGENTS.handles(node_ids).items()}
    if not refs:
        return {}
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    done = set(ready)
    results: dict[str, TPUOwner | Exception | None] = {}
    for node, ref in refs.items():
        if ref not in done:
            results[node] = TimeoutError(f"the TPU agent on node {node[:12]} did not answer")
            continue
        try:
            data = ray.get(ref)
        except ray.exceptions.RayError as exc:
            AGENTS.forget(node)  # recreated next time, if the node still lives
            results[node] = exc
            continue
        results[node] = None if data is None else TPUOwner.from_dict(data)
        AGENTS.note(node, data)
    return results


def probe_owners(
    node_ids: Sequence[str], timeout_s: float = PROBE_TIMEOUT_S, *, thorough: bool = True
) -> dict[str, TPUOwner | Exception | None]:
    """Each node's TPU owner now.

    Args:
        node_ids: Live TPU hosts.
        timeout_s: Bound on the whole round (including starting agents).
        thorough: Also find processes that bypassed libtpu's lock (see
            :meth:`HostAgent.owner`).

    Returns:
        Per node: its owner, ``None`` if the TPU is free, or the error that prevented
        the answer (host gone, no answer in time).
    """
    return _round(node_ids, lambda node, a: a.owner.remote(thorough), timeout_s)


def start_probe(
    node_ids: Sequence[str], timeout_s: float = PROBE_TIMEOUT_S
) -> Callable[[], dict[str, str | None]]:
    """Ask each node's agent who owns its TPU, without waiting yet. A host this driver saw
    free within :data:`FREE_TRUST_S` (its own probe or hand-back) is not asked again.

    An agent that has not answered this process before may still be starting (the first
    reservations on a fresh cluster start them): it gets :data:`START_WAIT_S`, and if it
    has not answered by then its TPU counts as free. Its record joins the cluster view
    once it is up, and a process it would have named is met by the first call instead,
    as a :class:`~tpuslice.errors.TPUInUseError` naming it.

    Args:
        node_ids: The hosts to ask.
        timeout_s: Bound on the wait for agents known to be up.

    Returns:
        A function that waits (bounded) and returns, per node, the owner described, or
        ``None`` when the TPU is free or the agent could not answer (logged).
    """
    now = time.monotonic()
    asked = [n for n in node_ids if not AGENTS.seen_free_within(n, FREE_TRUST_S, now)]
    refs = {node: handle.owner.remote() for node, handle in AGENTS.handles(asked).items()}

    def answers() -> dict[str, str | None]:
        found: dict[str, str | None] = dict.fromkeys(node_ids)  # seen free just now
        if not refs:
            return found
        done = _wait_for(refs, timeout_s)
        for node, ref in refs.items():
            found[node] = None
            if ref not in done:
                if AGENTS.is_up(node):
                    logger.warning("TPU agent on node %s did not answer; assuming free", node[:12])
                else:
                    logger.info("TPU agent on node %s is starting; TPU not checked", node[:12])
                continue
            try:
                data = ray.get(ref)
            except ray.exceptions.RayError as exc:
                AGENTS.forget(node)
                logger.warning("TPU agent on node %s failed: %s", node[:12], exc)
                continue
            found[node] = None if data is None else TPUOwner.from_dict(data).describe()
            AGENTS.note(node, data)
        return found

    return answers


def _wait_for(refs: Mapping[str, Any], timeout_s: float) -> set[Any]:
    """The refs answered: every agent gets :data:`START_WAIT_S`; those that answered this
    process before get up to ``timeout_s`` in all."""
    started = time.monotonic()
    pending = list(refs.values())
    ready, pending = ray.wait(pending, num_returns=len(pending), timeout=START_WAIT_S)
    known = [refs[n] for n in refs if AGENTS.is_up(n) and refs[n] in pending]
    if known:
        rest = max(0.0, timeout_s - (time.monotonic() - started))
        more, _ = ray.wait(known, num_returns=len(known), timeout=rest)
        ready = [*ready, *more]
    return set(ready)


def release_tpus(
    node_ids: Sequence[str],
    pids: Mapping[str, set[int]] | None = None,
    job_id: str | None = None,
    *,
    grace_s: float = GRACE_S,
    timeout_s: float = RELEASE_TIMEOUT_S,
) -> dict[str, TPUOwner | Exception | None]:
    """On every node, stop the processes that ran the work being handed back and still
    own its TPU, and confirm none does.

    A process counts as ours if its pid is in ``pids`` for that node (it ran our tasks),
    if it is a worker started for ``job_id`` (Ray sets ``RAY_JOB_ID`` in such a worker's
    environment; a prestarted worker shows ``ffffffff`` instead), or if it is an idle Ray
    worker (see :meth:`HostAgent.release`). Anyone else is left alone.

    Args:
        node_ids: The hosts being handed back.
        pids: Per node, pids of processes that ran this work.
        job_id: This job (hex; default: the driver's).
        grace_s: Seconds between SIGTERM and SIGKILL.
        timeout_s: Bound on the whole round.

    Returns:
        Per node: ``None`` (free), someone else's owner (left alone), or the error that
        prevented the answer.
    """
    job = job_id or ray.get_runtime_context().get_job_id()
    known = pids or {}
    return _round(
        node_ids,
        lambda node, a: a.release.remote(job, sorted(known.get(node, ())), grace_s, timeout_s),
        timeout_s + PROBE_TIMEOUT_S,
    )


def stop_job_tpus(node_ids: Sequence[str], job_id: str) -> None:
    """On each node, have its agent stop the processes of Ray job ``job_id`` that still
    own its TPU, without waiting for the answers (the queue's take-back: a worker of the
    work taken back can outlive its group in Ray's pool of idle workers).

    Args:
        node_ids: The hosts taken back.
        job_id: The job whose work ran there (hex).
    """
    try:
        agents = AGENTS.handles(node_ids)
    except (ray.exceptions.RayError, ConnectionError, ValueError) as exc:
        logger.warning(
            "could not ask the agents of %d host(s) to free their TPUs: %s", len(node_ids), exc
        )
        return
    for agent in agents.values():
        agent.release.remote(job_id, [], GRACE_S, RELEASE_TIMEOUT_S)


def kill_owner(node_id: str, pid: int, timeout_s: float = 5.0) -> TPUOwner | None:
    """Stop the TPU owner ``pid`` on one node, if it is this user's process.

    Args:
        node_id: The host.
        pid: The owner to stop (it must still own the TPU).
        timeout_s: Seconds between SIGTERM and SIGKILL.

    Returns:
        The owner left afterwards, ``None`` if the TPU is free.

    Raises:
        PermissionError: the process belongs to another user.
        ray.exceptions.RayError: the agent could not be reached.
    """
    data = ray.get(AGENTS.handle(node_id).kill.remote(pid, os.getuid(), timeout_s))
    return None if data is None else TPUOwner.from_dict(data)


class HostNotes(NamedTuple):
    """What is recorded about the hosts in Ray's KV store, by node id.

    Attributes:
        owners: The process each host's agent last saw owning its TPU.
        notices: The notice standing on each warned host.
        suspects: The live suspect record of each suspect host
            (:mod:`tpuslice._host.suspects`).
        seen_free: The hosts whose agent last saw the TPU free (``tpu-free/`` keys).
    """

    owners: dict[str, TPUOwner]
    notices: dict[str, Notice]
    suspects: dict[str, Suspect]
    seen_free: frozenset[str] = frozenset()


def recorded_notes(now: float | None = None) -> HostNotes:
    """The TPU owners and notices the agents last recorded, the hosts they last saw free,
    and the suspect records, by node id (Ray's KV store: one listing and one read for all,
    so a cluster with none costs one call; the free keys are only listed, never read).

    A notice more than :data:`~tpuslice._host.notices.STALE_S` past its deadline is deleted:
    its host died (its agent with it) or was replaced, and nobody else would. So is a
    suspect record whose cool-down ended.

    Args:
        now: Wall-clock seconds (default: now).

    Returns:
        The records; all empty when Ray is not connected.
    """
    owners: dict[str, TPUOwner] = {}
    notices: dict[str, Notice] = {}
    listed = _ray.kv_list(HOST_KEY_PREFIX, NAMESPACE)
    seen_free = _vouched_by(listed)
    keys = [
        key
        for key in listed
        if key.startswith(
            (OWNER_KEY_PREFIX, NOTICE_KEY_PREFIX, SUSPECT_KEY_PREFIX, PREEMPT_KEY_PREFIX)
        )
    ]
    now = time.time() if now is None else now
    stored = _ray.kv_get_many(keys, NAMESPACE)
    suspects, ended = live_suspects(
        {k: v for k, v in stored.items() if k.startswith(SUSPECT_KEY_PREFIX)}, now
    )
    forget(ended)
    for key, raw in stored.items():
        if key.startswith(SUSPECT_KEY_PREFIX):
            continue
        try:
            if key.startswith(OWNER_KEY_PREFIX):
                owners[key.removeprefix(OWNER_KEY_PREFIX)] = TPUOwner.from_dict(json.loads(raw))
                continue
            notice = Notice.from_json(raw)
        except (ValueError, KeyError, TypeError) as exc:
            logger.debug("ignoring unreadable record %s: %s", key, exc)
            continue
        if notice.stale(now):
            _ray.kv_delete(key, NAMESPACE)
            continue
        node = _node_of(key)
        standing = notices.get(node)
        # Both the host's own and the queue's may stand: the sooner one is what matters.
        if standing is None or notice.deadline < standing.deadline:
            notices[node] = notice
    return HostNotes(owners, notices, suspects, seen_free)


def free_hosts() -> frozenset[str]:
    """The nodes whose agents' ``tpu-free/`` keys are there now (one listing): each agent
    saw its TPU free at its last look, at most :data:`WATCH_S` ago, or confirmed it since.

    Returns:
        Their node ids (none when the store cannot be read: then every host is asked);
        the nodes are also marked up (see :meth:`Agents.vouched`).
    """
    try:
        keys = _ray.kv_list(FREE_KEY_PREFIX, NAMESPACE)
    except _ray.kv_errors() as exc:
        logger.debug("could not list the agents' free keys: %s", exc)
        return frozenset()
    return _vouched_by(keys)


def _vouched_by(keys: Sequence[str]) -> frozenset[str]:
    """The nodes whose ``tpu-free/`` keys are among ``keys``, marked up (their agents
    wrote them: see :meth:`Agents.vouched`)."""
    nodes = frozenset(
        k.removeprefix(FREE_KEY_PREFIX) for k in keys if k.startswith(FREE_KEY_PREFIX)
    )
    AGENTS.vouched(nodes)
    return nodes


def forget_free_keys(node_ids: Sequence[str]) -> None:
    """Delete the ``tpu-free/`` keys of these nodes, which Ray lists as dead: their
    agents died with them, and nothing else would (a node that comes back has a new id).

    Args:
        node_ids: The dead nodes.
    """
    for node in node_ids:
        _ray.kv_delete(FREE_KEY_PREFIX + node, NAMESPACE)


def notices_for(node_ids: Sequence[str]) -> dict[str, Notice]:
    """The notices recorded for these nodes, by their agents or by the queue preempting
    their work (one listing, and one read of those that have one; where both stand, the
    sooner).

    Args:
        node_ids: Ray node ids.

    Returns:
        Per node with a notice standing, the notice; empty when Ray is not connected.
    """
    wanted = set(node_ids)
    keys = [
        key
        for key in _ray.kv_list(HOST_KEY_PREFIX, NAMESPACE)
        if key.startswith((NOTICE_KEY_PREFIX, PREEMPT_KEY_PREFIX)) and _node_of(key) in wanted
    ]
    found: dict[str, Notice] = {}
    for key, raw in _ray.kv_get_many(keys, NAMESPACE).items():
        try:
            notice = Notice.from_json(raw)
        except ValueError as exc:
            logger.debug("ignoring unreadable notice %s: %s", key, exc)
            continue
        standing = found.get(_node_of(key))
        if standing is None or notice.deadline < standing.deadline:
            found[_node_of(key)] = notice
    return found


def _node_of(key: str) -> str:
    """The node id a host record's key names."""
    return key.removeprefix(NOTICE_KEY_PREFIX).removeprefix(PREEMPT_KEY_PREFIX)


def describe_errors(results: Mapping[str, TPUOwner | Exception | None]) -> list[str]:
    """One line per node whose agent could not answer (for logs).

    Args:
        results: What a round of agent calls returned.

    Returns:
        ``<node>: <error>`` for each node that did not answer.
    """
    return [f"{node[:12]}: {err}" for node, err in results.items() if isinstance(err, Exception)]


def confirm_released(
    node_ids: Sequence[str], pids: Mapping[str, set[int]] | None = None
) -> dict[str, TPUOwner | Exception | None]:
    """The hand-back check: on every host, stop our processes that still own the TPU and
    confirm it. Never raises for the cluster's sake: a host that cannot answer (dead, or
    Ray gone) is logged, since there is nothing left to free on it.

    Args:
        node_ids: The hosts being handed back.
        pids: Per node, pids of processes that ran the work (see :func:`release_tpus`).

    Returns:
        As :func:`release_tpus`; empty if Ray is not connected.
    """
    if not node_ids or not ray.is_initialized():
        return {}
    try:
        results = release_tpus(node_ids, pids)
    except (ray.exceptions.RayError, ConnectionError) as exc:
        logger.warning("could not confirm the TPUs of %d host(s) are free: %s", len(node_ids), exc)
        return {}
    ours = {pid for node_pids in (pids or {}).values() for pid in node_pids}
    job = ray.get_runtime_context().get_job_id()
    for node, found in results.items():
        if isinstance(found, Exception):
            logger.warning("TPU of node %s not confirmed free: %s", node[:12], found)
        elif found is not None and (found.pid in ours or found.job_id == job):
            held = found.describe()
            logger.error("TPU of node %s still held by %s after SIGKILL", node[:12], held)
        elif found is not None:
            logger.warning(
                "TPU of node %s is held by %s, not started by this work: left running "
                "(tpuslice release-tpu stops it)",
                node[:12],
                found.describe(),
            )
    return results
