"""The I/O of the queue actor's :class:`Orders`, and of the tenants' use kept across restarts."""

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
from tpuslice._view.quotas import DEFAULT_HALF_LIFE_S, Quotas, read_quotas
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
        metrics.preempted(preemption.cause, records[0].tenant if records else "")
        events.record(
            "preempted",
            slices=tuple(r.slice_name for r in records),
            what=records[0].who if records else preemption.holder,
            seconds=preemption.grace_s,
            outcome=preemption.cause,
            detail=preemption.reason,
            tenant=records[0].tenant if records else "",
        )
    for holder_id in dict.fromkeys(h.holder for h in orders.take_back):
        _take_back([h for h in orders.take_back if h.holder == holder_id])
    try:
        clear_notices(orders.clear)
        for stale in orders.stale:
            forget_records([stale.slice_name], stale.holder)
    except _ray.kv_errors() as exc:
        logger.debug("could not clear the queue's notices: %s", exc)


def _take_back(records: list[Holder]) -> None:
    """Remove a holder's groups, have its hosts stop its job's TPU owners (an idle worker
    keeps libtpu's lock after its group is gone), forget its records and record it. A failed
    removal keeps the records, so the next decision tries again."""
    for group in dict.fromkeys(g for r in records for g in r.groups):
        try:
            remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(group))))
        except ValueError as exc:  # no such group: already gone
            logger.debug("placement group %s already removed: %s", group, exc)
        except (ray.exceptions.RayError, ConnectionError) as exc:
            logger.warning("could not take back placement group %s: %s", group, exc)
            return
    first = records[0]
    nodes = sorted({n for r in records for n in r.nodes})
    if first.job and nodes:
        stop_job_tpus(nodes, first.job)
    try:
        forget_records([r.slice_name for r in records], first.holder)
    except _ray.kv_errors() as exc:
        logger.warning("could not forget the records of %s: %s", first.who, exc)
    metrics.preempted("taken_back", first.tenant)
    events.record(
        "taken_back",
        slices=tuple(r.slice_name for r in records),
        what=first.who,
        outcome="taken_back",
        detail=f"{first.who} of tenant {first.tenant} did not leave within its grace",
    )


def read_usage(quotas: Quotas | None = None) -> Usage:
    """The tenants' use as last stored (none if missing or unreadable), decaying with the
    half-life of ``quotas`` (default: read now)."""
    half_life = (read_quotas() if quotas is None else quotas).half_life_s or DEFAULT_HALF_LIFE_S
    raw = _ray.kv_get(USAGE_KEY, NAMESPACE)
    if raw is not None:
        try:
            data = json.loads(raw)
            return Usage.from_dict(data["usage"], float(data["at"]), half_life)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            logger.warning("ignoring the unreadable record of the tenants' use: %s", exc)
    return Usage(half_life)


def save_usage(usage: dict[str, float], at: float) -> None:
    """Store the tenants' use (tenant -> slice-seconds at ``at``), best effort."""
    try:
        _ray.kv_put(USAGE_KEY, json.dumps({"at": at, "usage": usage}).encode(), NAMESPACE)
    except _ray.kv_errors() as exc:
        logger.debug("could not store the tenants' use: %s", exc)
