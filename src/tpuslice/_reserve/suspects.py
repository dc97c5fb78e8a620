"""Marking hosts suspect and trusting them again: the records, the log and the timeline
in one call. A suspect host is avoided until its cool-down ends or its slice is cleared.
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
    """Mark hosts suspect for the cluster's cool-down, and log and record each; the
    records written. Never raises (empty if none could be written): the failure just seen
    is what the caller must hear of."""
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
    """Trust every host of a slice again: delete its suspect records (returned, by
    worker id), log and record it. A KV error (``ConnectionError``) propagates."""
    records = suspects.clear_slice(slice_name)
    if records:
        hosts = ", ".join(str(r.worker_id) for r in records)
        reason = f": {why}" if why else ""
        logger.info("%s host(s) %s trusted again%s", slice_name, hosts, reason)
        observe.slice_cleared(slice_name, records, why)
    return records
