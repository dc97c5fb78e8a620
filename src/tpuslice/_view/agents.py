"""What the host agents (:mod:`tpuslice._host.agent`) recorded in Ray's KV store, read by a
driver: TPU owners, notices, suspect records, and which agents last saw their TPU free.
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
    """Nodes whose ``tpu-free/`` keys a listing on this connection showed: their agents are
    up, so a slow answer from one is waited for, not taken as free. A dead node's id may
    stay: nothing asks a dead node."""


class HostNotes(NamedTuple):
    """What Ray's KV store records of the hosts, by node id: TPU owners, the soonest notice
    standing on each, live suspect records, and the hosts whose agent last saw the TPU free."""

    owners: dict[str, TPUOwner]
    notices: dict[str, Notice]
    suspects: dict[str, Suspect]
    seen_free: frozenset[str] = frozenset()


def recorded_notes(now: float | None = None) -> HostNotes:
    """The agents' records by node id (all empty without Ray): one listing and one read for
    all. Deletes notices long past their deadline (their host and agent are gone, nobody else
    would) and ended suspect records, through the :mod:`tpuslice._host` functions that own
    them."""
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
        _keep_sooner(notices, key, notice)
    forget_stale_notices(stale)
    return HostNotes(owners, notices, suspects, seen_free)


def free_hosts() -> frozenset[str]:
    """The nodes whose agents saw their TPU free at their last look, noted up
    (:class:`ListedFree`); none when the store cannot be read (then every host is asked)."""
    try:
        keys = _ray.kv_list(FREE_KEY_PREFIX, NAMESPACE)
    except _ray.kv_errors() as exc:
        logger.debug("could not list the agents' free keys: %s", exc)
        return frozenset()
    return _vouched_by(keys)


def _vouched_by(keys: Sequence[str]) -> frozenset[str]:
    """The nodes whose ``tpu-free/`` keys are among ``keys``, noted up."""
    nodes = frozenset(
        k.removeprefix(FREE_KEY_PREFIX) for k in keys if k.startswith(FREE_KEY_PREFIX)
    )
    connection().part(ListedFree).update(nodes)
    return nodes


def notices_for(node_ids: Sequence[str]) -> dict[str, Notice]:
    """The notices standing on these nodes, by their agents or the queue: the sooner one
    per node (none without Ray)."""
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
        _keep_sooner(found, key, notice)
    return found


def _node_of(key: str) -> str:
    """The node id a host record's key names."""
    return key.removeprefix(NOTICE_KEY_PREFIX).removeprefix(PREEMPT_KEY_PREFIX)


def _keep_sooner(found: dict[str, Notice], key: str, notice: Notice) -> None:
    """Keep the sooner notice of the key's node: the host's own and the queue's may both
    stand."""
    node = _node_of(key)
    standing = found.get(node)
    if standing is None or notice.deadline < standing.deadline:
        found[node] = notice
