"""A driver's client to the host agents (:mod:`tpuslice._host.agent`): who owns each host's
TPU, stopping a job's processes that still own it at a hand-back or take-back, and stopping a
named owner (``tpuslice release-tpu``). In the queue's layer because the queue asks them too."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from tpuslice._host.agent import HostAgent
from tpuslice._host.tpu_lock import TPUOwner
from tpuslice._tpu._connection import connection
from tpuslice._tpu.keys import AGENT_NAME_PREFIX as NAME_PREFIX
from tpuslice._tpu.keys import NAMESPACE
from tpuslice._view.agents import ListedFree

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 60.0
"""Bound on one round of agent calls (the first on a host starts its agent)."""
LOOKUPS_AT_ONCE = 8
"""Agent handles a driver looks up at once (threads, each waiting on the GCS)."""
GRACE_S = 2.0
"""How long an owner may take to exit after SIGTERM before it gets SIGKILL."""
RELEASE_TIMEOUT_S = 15.0
START_WAIT_S = 1.0
"""How long a reservation waits for an agent not known to be up before it counts the TPU free."""
FREE_TRUST_S = 2.0
"""How long this driver trusts that a host's TPU it saw free still is, before asking again
(a process that takes it meanwhile is met by the next call, as a TPUInUseError)."""

_remote_agent = ray.remote(num_cpus=0, max_restarts=-1)(HostAgent)


class Agents:
    """This driver's handles to the host agents, which are up, and when each TPU was last seen
    free (a part of the connection). A per-host lock makes one agent per host; the notes are
    single dict and set operations, safe without a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _host_locks
        self._host_locks: dict[str, threading.Lock] = {}
        self._handles: dict[str, Any] = {}
        self._free_at: dict[str, float] = {}  # node id -> when its TPU was last seen free
        self._up: set[str] = set()  # nodes whose agents answered this process

    def handle(self, node_id: str) -> Any:
        """The agent actor of one live node, created there if it has none (cached). Looked up
        by name first: creating (even ``get_if_exists``) makes a new driver export the class."""
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
        """Node id -> its agent, missing ones looked up at once (not one after another)."""
        missing = [n for n in dict.fromkeys(node_ids) if n not in self._handles]
        if len(missing) > 1:
            try:
                with ThreadPoolExecutor(min(LOOKUPS_AT_ONCE, len(missing))) as pool:
                    list(pool.map(self.handle, missing))
            except RuntimeError:  # at exit Python starts no executor's work: looked up below
                logger.debug("looking up %d agents one after another", len(missing))
        return {node: self.handle(node) for node in node_ids}

    def forget(self, node_id: str) -> None:
        """Drop a node's handle after a failed call."""
        self._handles.pop(node_id, None)

    def note(self, node_id: str, owner: object) -> None:
        """Note that the node's agent answered, and whether its TPU was free (``owner`` None)."""
        self._up.add(node_id)
        if owner is None:
            self._free_at[node_id] = time.monotonic()
        else:
            self._free_at.pop(node_id, None)

    def is_up(self, node_id: str) -> bool:
        """Whether the node's agent answered this process, or its ``tpu-free/`` key was listed."""
        return node_id in self._up or node_id in connection().part(ListedFree)

    def seen_free_within(self, node_id: str, seconds: float, now: float) -> bool:
        """Whether this driver saw the node's TPU free within ``seconds`` of monotonic ``now``."""
        return now - self._free_at.get(node_id, -seconds) < seconds


def _round(
    node_ids: Sequence[str], call: Callable[[str, Any], Any], timeout_s: float
) -> dict[str, TPUOwner | Exception | None]:
    """Call every node's agent at once; each node's owner, or the error its call met."""
    agents = connection().part(Agents)
    refs = {node: call(node, handle) for node, handle in agents.handles(node_ids).items()}
    if not refs:
        return {}
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    return _collect(agents, refs, set(ready))


def _collect(
    agents: Agents, refs: Mapping[str, Any], done: set[Any]
) -> dict[str, TPUOwner | Exception | None]:
    """Each node's owner from its answered ref, or the error met (noted in ``agents``)."""
    results: dict[str, TPUOwner | Exception | None] = {}
    for node, ref in refs.items():
        if ref not in done:
            results[node] = TimeoutError(f"the TPU agent on node {node[:12]} did not answer")
            continue
        try:
            data = ray.get(ref)
        except ray.exceptions.RayError as exc:
            agents.forget(node)  # recreated next time, if the node still lives
            results[node] = exc
            continue
        results[node] = None if data is None else TPUOwner.from_dict(data)
        agents.note(node, data)
    return results


def probe_owners(node_ids: Sequence[str]) -> dict[str, TPUOwner | Exception | None]:
    """Each node's TPU owner (even one bypassing libtpu's lock), ``None`` if free, or the error."""
    return _round(node_ids, lambda node, a: a.owner.remote(True), PROBE_TIMEOUT_S)


def start_probe(node_ids: Sequence[str]) -> Callable[[], dict[str, str | None]]:
    """Ask each node's agent who owns its TPU, without waiting yet; a host seen free within
    :data:`FREE_TRUST_S` is not asked. An agent that may be starting gets :data:`START_WAIT_S`,
    then its TPU counts as free (an owner it would name is met by the first call instead).
    The function returned waits and gives per node the owner described, or ``None`` when the
    TPU is free or the agent could not answer (logged)."""
    now = time.monotonic()
    agents = connection().part(Agents)
    asked = [n for n in node_ids if not agents.seen_free_within(n, FREE_TRUST_S, now)]
    refs = {node: handle.owner.remote() for node, handle in agents.handles(asked).items()}

    def answers() -> dict[str, str | None]:
        found: dict[str, str | None] = dict.fromkeys(node_ids)  # seen free just now
        if not refs:
            return found
        done = _wait_for(refs, PROBE_TIMEOUT_S)
        for node, owner in _collect(agents, refs, done).items():
            if refs[node] not in done and agents.is_up(node):
                logger.warning("TPU agent on node %s did not answer; assuming free", node[:12])
            elif refs[node] not in done:
                logger.info("TPU agent on node %s is starting; TPU not checked", node[:12])
            elif isinstance(owner, Exception):
                logger.warning("TPU agent on node %s failed: %s", node[:12], owner)
            else:
                found[node] = None if owner is None else owner.describe()
        return found

    return answers


def _wait_for(refs: Mapping[str, Any], timeout_s: float) -> set[Any]:
    """The refs answered: each gets :data:`START_WAIT_S`; agents known up, ``timeout_s`` in all."""
    started = time.monotonic()
    pending = list(refs.values())
    ready, pending = ray.wait(pending, num_returns=len(pending), timeout=START_WAIT_S)
    agents = connection().part(Agents)
    known = [refs[n] for n in refs if agents.is_up(n) and refs[n] in pending]
    if known:
        rest = max(0.0, timeout_s - (time.monotonic() - started))
        more, _ = ray.wait(known, num_returns=len(known), timeout=rest)
        ready = [*ready, *more]
    return set(ready)


def stop_job_tpus(node_ids: Sequence[str], job_id: str) -> None:
    """Have each node's agent stop the job's processes that still own its TPU, not waiting
    (the queue's take-back: a worker can outlive its group as an idle worker)."""
    try:
        agents = connection().part(Agents).handles(node_ids)
    except (ray.exceptions.RayError, ConnectionError, ValueError) as exc:
        logger.warning(
            "could not ask the agents of %d host(s) to free their TPUs: %s", len(node_ids), exc
        )
        return
    for agent in agents.values():
        agent.release.remote(job_id, [], GRACE_S, RELEASE_TIMEOUT_S)


def kill_owner(node_id: str, pid: int) -> TPUOwner | None:
    """Stop the TPU owner ``pid`` on one node if it is this user's (SIGTERM, then SIGKILL),
    else PermissionError; the owner left afterwards, ``None`` if the TPU is free."""
    data = ray.get(connection().part(Agents).handle(node_id).kill.remote(pid, os.getuid(), 5.0))
    return None if data is None else TPUOwner.from_dict(data)


def describe_errors(results: Mapping[str, TPUOwner | Exception | None]) -> list[str]:
    """``<node>: <error>`` for each node whose agent could not answer (for logs)."""
    return [f"{node[:12]}: {err}" for node, err in results.items() if isinstance(err, Exception)]


def confirm_released(
    node_ids: Sequence[str], pids: Mapping[str, set[int]]
) -> dict[str, TPUOwner | Exception | None]:
    """The hand-back check: on every host, stop our processes that still own the TPU and
    confirm none does (ours: :meth:`tpuslice._host.agent.HostAgent.release`). Never raises: a
    host that cannot answer is logged, since there is nothing left to free on it. ``pids``
    are, per node, the processes that ran the work. Returns per node ``None`` (free), someone
    else's owner (left alone), or the error met; empty if Ray is not connected."""
    if not node_ids or not ray.is_initialized():
        return {}
    try:
        job = ray.get_runtime_context().get_job_id()
        results = _round(
            node_ids,
            lambda node, a: a.release.remote(
                job, sorted(pids.get(node, ())), GRACE_S, RELEASE_TIMEOUT_S
            ),
            RELEASE_TIMEOUT_S + PROBE_TIMEOUT_S,
        )
    except (ray.exceptions.RayError, ConnectionError) as exc:
        logger.warning("could not confirm the TPUs of %d host(s) are free: %s", len(node_ids), exc)
        return {}
    ours = {pid for node_pids in pids.values() for pid in node_pids}
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
