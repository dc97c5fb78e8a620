"""What the host agents recorded in Ray's KV store, read by a driver: each host's TPU
owner and standing notice, the suspect records beside them, and which hosts' agents last
saw their TPU free (their ``tpu-free/`` keys). The agents themselves live in
:mod:`tpuslice._host.agent`; a driver asks them through :mod:`tpuslice._reserve.queue.agents`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from typing import NamedTuple

from tpuslice._host.agent import forget_stale_notices
from tpuslice._host.notices import Notice
from tpuslice._host.suspects import Suspect, forget, live_suspects
from tpuslice._host.tpu_lock import TPUOwner
from tpuslice._tpu import _ray
from tpuslice._tpu._connection import connection
from tpuslice._tpu.keys import (
    FREE_KEY_PREFIX,
    HOST_KEY_PREFIX,
    NAMESPACE,
    NOTICE_KEY_PREFIX,
    OWNER_KEY_PREFIX,
    PREEMPT_KEY_PREFIX,
    SUSPECT_KEY_PREFIX,
)

logger = logging.getLogger(__name__)


class ListedFree(set[str]):
    """Nodes whose ``tpu-free/`` keys a listing on this connection showed
    (:func:`free_hosts`, :func:`recorded_notes`). Each key's agent wrote it, so that agent
    is up, and an ask of it that is slow to answer is waited for, not taken as free
    (:meth:`tpuslice._reserve.queue.agents.Agents.is_up`). A part of the connection, made
    here because the readers learn it; a dead node's id stays, as nothing asks a dead
    node."""


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

    A notice more than :data:`~tpuslice._host.notices.STALE_S` past its deadline is deleted
    (:func:`tpuslice._host.agent.forget_stale_notices`): its host died (its agent with it)
    or was replaced, and nobody else would. So is a suspect record whose cool-down ended
    (:func:`tpuslice._host.suspects.forget`). This module writes nothing itself.

    Args:
        now: Wall-clock seconds (default: now).

    Returns:
        The records; all empty when Ray is not connected.
    """
    owners: dict[str, TPUOwner] = {}
    notices: dict[str, Notice] = {}
    stale: list[str] = []
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
            stale.append(key)
            continue
        node = _node_of(key)
        standing = notices.get(node)
        # Both the host's own and the queue's may stand: the sooner one is what matters.
        if standing is None or notice.deadline < standing.deadline:
            notices[node] = notice
    forget_stale_notices(stale)
    return HostNotes(owners, notices, suspects, seen_free)


def free_hosts() -> frozenset[str]:
    """The nodes whose agents' ``tpu-free/`` keys are there now (one listing): each agent
    saw its TPU free at its last look, at most :data:`~tpuslice._host.agent.WATCH_S` ago,
    or confirmed it since.

    Returns:
        Their node ids (none when the store cannot be read: then every host is asked);
        the nodes are also noted up (:class:`ListedFree`).
    """
    try:
        keys = _ray.kv_list(FREE_KEY_PREFIX, NAMESPACE)
    except _ray.kv_errors() as exc:
        logger.debug("could not list the agents' free keys: %s", exc)
        return frozenset()
    return _vouched_by(keys)


def _vouched_by(keys: Sequence[str]) -> frozenset[str]:
    """The nodes whose ``tpu-free/`` keys are among ``keys``, noted up (their agents
    wrote them: see :class:`ListedFree`)."""
    nodes = frozenset(
        k.removeprefix(FREE_KEY_PREFIX) for k in keys if k.startswith(FREE_KEY_PREFIX)
    )
    connection().part(ListedFree).update(nodes)
    return nodes


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
