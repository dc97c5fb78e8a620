"""Writing holder records and the queue's notices (:mod:`tpuslice._view.holders` reads them)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Sequence

from tpuslice._host.notices import Notice
from tpuslice._tpu import _ray
from tpuslice._tpu._connection import Pool
from tpuslice._tpu.keys import HOLDER_KEY_PREFIX, NAMESPACE, PREEMPT_KEY_PREFIX
from tpuslice._view.holders import Holder

logger = logging.getLogger(__name__)


class HolderRecords(Pool):
    """Writes holder records off the reservation's path on one thread, so a hand-back's
    deletion runs after the records were written. A part of the connection."""

    def __init__(self) -> None:
        super().__init__(1, "tpuslice-holders")


def record_held(holders: Iterable[Holder]) -> None:
    """Record a reservation's slices (one holder each) as held by it; best effort: without
    them the queue sees the slices busy, held by no one it can name."""
    try:
        for holder in holders:
            _ray.kv_put(HOLDER_KEY_PREFIX + holder.slice_name, holder.to_json(), NAMESPACE)
    except _ray.kv_errors() as exc:
        logger.debug("could not record the slices held: %s", exc)


def forget_held(slice_names: Sequence[str], node_ids: Sequence[str], holder: str) -> None:
    """At a hand-back, delete the holder's records and queue notices on these slices and
    their hosts (only its own: a preemption may have given them to another), best effort."""
    try:
        forget_records(slice_names, holder)
        # One listing, then only the hosts warned (almost always none).
        prefix = PREEMPT_KEY_PREFIX
        warned = [k for k in _ray.kv_list(prefix, NAMESPACE) if k.removeprefix(prefix) in node_ids]
        for key, raw in _ray.kv_get_many(warned, NAMESPACE).items():
            with contextlib.suppress(ValueError):
                if Notice.from_json(raw).holder == holder:
                    _ray.kv_delete(key, NAMESPACE)
    except _ray.kv_errors() as exc:
        logger.debug("could not forget the slices held: %s", exc)


def forget_records(slice_names: Sequence[str], holder: str) -> None:
    """Delete the holder records of these slices that are still ``holder``'s."""
    keys = [HOLDER_KEY_PREFIX + name for name in slice_names]
    for key, raw in _ray.kv_get_many(keys, NAMESPACE).items():
        try:
            mine = Holder.from_json(raw).holder == holder
        except ValueError:
            mine = True  # unreadable: nobody's
        if mine:
            _ray.kv_delete(key, NAMESPACE)


def give_notices(notices: Iterable[Notice]) -> None:
    """Record the queue's notices, each on the host its ``node_id`` names."""
    for notice in notices:
        _ray.kv_put(PREEMPT_KEY_PREFIX + notice.node_id, notice.to_json(), NAMESPACE)


def clear_notices(node_ids: Iterable[str]) -> None:
    """Delete the queue's notices on these hosts."""
    for node_id in node_ids:
        _ray.kv_delete(PREEMPT_KEY_PREFIX + node_id, NAMESPACE)
