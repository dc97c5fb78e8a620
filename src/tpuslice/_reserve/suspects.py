"""Marking hosts suspect and trusting them again, as runs and health checks do it: the
records (:mod:`tpuslice._host.suspects`), the log and the timeline in one call.

A suspect host is avoided by new reservations and by the queue's grants until its
cool-down ends or its slice is cleared; its slice shows as
:attr:`~tpuslice._view.cluster.SliceState.SUSPECT` meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from tpuslice._host import suspects
from tpuslice._host.suspects import Blame, Suspect, duration
from tpuslice._reserve import observe
from tpuslice._tpu import _ray

logger = logging.getLogger(__name__)


def mark_suspects(blames: Sequence[Blame]) -> list[Suspect]:
    """Mark hosts suspect for the cluster's cool-down, log each (warning) and record it
    in the timeline. Never raises: it runs where a failure was just seen, and that
    failure is what the caller must hear of (a record that cannot be written is logged).

    Args:
        blames: The hosts and why.

    Returns:
        The records written; empty if none could be.
    """
    if not blames:
        return []
    try:
        records = suspects.mark(blames)
    except _ray.kv_errors() as exc:
        hosts = ", ".join(f"{b.slice_name} host {b.worker_id}" for b in blames)
        logger.warning("could not mark %s suspect (%s): %s", hosts, blames[0].reason.value, exc)
        return []
    for record in records:
        logger.warning(
            "%s host %d (node %s) is suspect for %s, after a %s: %s",
            record.slice_name,
            record.worker_id,
            record.node_id[:12],
            duration(record.until - record.since),
            record.reason.value,
            record.evidence,
        )
        observe.host_suspected(record)
    return records


def clear_slice(slice_name: str, why: str = "") -> list[Suspect]:
    """Trust every host of a slice again (a health check passed, or by hand): delete
    their suspect records, log and record it if any was.

    Args:
        slice_name: The slice.
        why: What cleared it, for the log and the timeline.

    Returns:
        The records deleted, by worker id; empty if none of its hosts was suspect.

    Raises:
        ConnectionError: Ray is not connected (or another of
            :func:`tpuslice._tpu._ray.kv_errors`).
    """
    records = suspects.clear_slice(slice_name)
    if records:
        hosts = ", ".join(str(r.worker_id) for r in records)
        reason = f": {why}" if why else ""
        logger.info("%s host(s) %s trusted again%s", slice_name, hosts, reason)
        observe.slice_cleared(slice_name, records, why)
    return records
