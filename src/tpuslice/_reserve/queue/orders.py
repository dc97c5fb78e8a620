"""What the queue actor does to running work after a decision (the I/O of
:class:`~tpuslice._reserve.queue.service.Orders`), and the tenants' use kept across restarts."""

from __future__ import annotations

import json
import logging

import ray
from ray.util.placement_group import PlacementGroup, remove_placement_group

from tpuslice._reserve.queue.agents import stop_job_tpus
from tpuslice._reserve.queue.holders import clear_notices, forget_records, give_notices
from tpuslice._reserve.queue.service import Orders
from tpuslice._reserve.queue.share import Usage
from tpuslice._tpu import _ray
from tpuslice._tpu.keys import NAMESPACE, USAGE_KEY
from tpuslice._view.holders import Holder
from tpuslice._view.quotas import DEFAULT_HALF_LIFE_S, read_quotas
from tpuslice.record import events, metrics

logger = logging.getLogger(__name__)

USAGE_SAVE_S = 60.0
"""How often the queue actor stores the tenants' use (what a restart may lose)."""


def carry_out(orders: Orders) -> None:
    """Give notices, record preemptions, take back work whose grace ran out, clear notices
    and stale records. Best effort: the next decision sees what is still to do."""
    try:
        give_notices(orders.notices)
    except _ray.kv_errors() as exc:
        logger.warning("could not give the preemption notices: %s", exc)
    for preemption, records in orders.preempted:
        tenant = records[0].tenant if records else ""
        metrics.preempted(preemption.cause, tenant)
        events.record(
            "preempted",
            slices=tuple(r.slice_name for r in records),
            what=records[0].who if records else preemption.holder,
            seconds=preemption.grace_s,
            outcome=preemption.cause,
            detail=preemption.reason,
        )
    taken = {h.holder: h for h in orders.take_back}
    for holder_id, first in taken.items():
        mine = [h for h in orders.take_back if h.holder == holder_id]
        if not _take_back(mine):
            continue
        metrics.preempted("taken_back", first.tenant)
        events.record(
            "taken_back",
            slices=tuple(h.slice_name for h in mine),
            what=first.who,
            outcome="taken_back",
            detail=f"{first.who} of tenant {first.tenant} did not leave within its grace",
        )
    try:
        clear_notices(orders.clear)
        for stale in orders.stale:
            forget_records([stale.slice_name], stale.holder)
    except _ray.kv_errors() as exc:
        logger.debug("could not clear the queue's notices: %s", exc)


def _take_back(records: list[Holder]) -> bool:
    """Remove a holder's groups, have its hosts stop its job's TPU owners (an idle worker
    keeps libtpu's lock after its group is gone), then forget its records. A failed removal
    keeps the records, so the next decision tries again; returns whether it was taken back."""
    for group in dict.fromkeys(g for r in records for g in r.groups):
        try:
            remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(group))))
        except ValueError as exc:  # no such group: already gone
            logger.debug("placement group %s already removed: %s", group, exc)
        except (ray.exceptions.RayError, ConnectionError) as exc:
            logger.warning("could not take back placement group %s: %s", group, exc)
            return False
    nodes = sorted({n for r in records for n in r.nodes})
    if records[0].job and nodes:
        stop_job_tpus(nodes, records[0].job)
    try:
        forget_records([r.slice_name for r in records], records[0].holder)
    except _ray.kv_errors() as exc:
        logger.warning("could not forget the records of %s: %s", records[0].who, exc)
    return True


def read_usage() -> Usage:
    """The tenants' use as last stored (none if missing or unreadable)."""
    half_life = read_quotas().half_life_s or DEFAULT_HALF_LIFE_S
    raw = _ray.kv_get(USAGE_KEY, NAMESPACE)
    if raw is None:
        return Usage(half_life)
    try:
        data = json.loads(raw)
        values = {str(t): float(v) for t, v in data["usage"].items()}
        return Usage.from_dict(values, float(data["at"]), half_life)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        logger.warning("ignoring the unreadable record of the tenants' use: %s", exc)
        return Usage(half_life)


def save_usage(usage: dict[str, float], at: float) -> None:
    """Store the tenants' use (tenant -> slice-seconds at ``at``), best effort."""
    data = {"at": at, "usage": usage}
    try:
        _ray.kv_put(USAGE_KEY, json.dumps(data).encode(), NAMESPACE)
    except _ray.kv_errors() as exc:
        logger.debug("could not store the tenants' use: %s", exc)
