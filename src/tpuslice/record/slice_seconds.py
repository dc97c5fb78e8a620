"""The cluster's slice-seconds by state: where every slice's time went, whoever ran on it.
At each cluster report, each slice's seconds since the last go to one of :data:`TIME_USES`
(a busy slice is ``productive`` while a gang on it beats), into the metric and per-minute
totals in Ray's KV store for ``tpuslice goodput --cluster``."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping

from tpuslice._host.heartbeats import SLICE_MARK, Progress
from tpuslice._tpu import _ray
from tpuslice._tpu.keys import BEAT_KEY_PREFIX, NAMESPACE, SLICE_SECONDS_KEY_PREFIX
from tpuslice._view.cluster import ClusterSnapshot, SliceInfo, SliceState
from tpuslice.record import metrics

__all__ = ["BUCKETS_KEPT_S", "TIME_USES", "read_slice_seconds"]

TIME_USES = ("productive", "busy", "idle", "broken", "notice")
"""Where the cluster's slice-seconds go: busy with a gang that beat lately, busy
otherwise, idle (ready, or suspect with every host free), broken, under notice."""
BEAT_FRESH_S = 10.0
"""A slice whose gang beat this recently counts as productive (two reports apart)."""
BUCKET_S = 60
"""Slice-seconds are kept per minute..."""
BUCKETS_KEPT_S = 24 * 3600
"""...for a day."""


def beating_slices(published: Mapping[str, bytes], now: float) -> set[str]:
    """The slices whose gang beat in the last :data:`BEAT_FRESH_S`, from heartbeat keys
    (``beat/<attempt>/<rank>@<slice>``) and their records. Pure."""
    found = set()
    for key, raw in published.items():
        _, mark, slice_name = key.rpartition(SLICE_MARK)
        progress = Progress.decode(raw)
        if mark and slice_name and progress is not None and now - progress.last <= BEAT_FRESH_S:
            found.add(slice_name)
    return found


def slice_state(info: SliceInfo, beating: set[str]) -> str:
    """Where a slice's time goes now (one of :data:`TIME_USES`). Pure."""
    if info.state is SliceState.BROKEN:
        return "broken"
    if info.state is SliceState.NOTICE:
        return "notice"
    if info.state is SliceState.READY or (info.state is SliceState.SUSPECT and info.idle):
        return "idle"
    return "productive" if info.name in beating else "busy"


def slice_seconds_of(
    snapshot: ClusterSnapshot, beating: set[str], seconds: float
) -> dict[str, dict[str, float]]:
    """Pod type -> state -> slice-seconds over ``seconds`` spent as ``snapshot`` shows. Pure."""
    found: dict[str, dict[str, float]] = {}
    for info in snapshot.slices.values():
        by_state = found.setdefault(info.pod_type, {})
        state = slice_state(info, beating)
        by_state[state] = by_state.get(state, 0.0) + seconds
    return found


class SliceSeconds:
    """Counts the cluster's slice-seconds by state into the metric and the per-minute totals;
    the queue actor's cluster reporter calls :meth:`add` every report."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._minute: int | None = None
        self._bucket: dict[str, dict[str, float]] = {}

    def add(self, snapshot: ClusterSnapshot, seconds: float) -> None:
        """Count ``seconds`` (since the report before) of the cluster as ``snapshot`` shows."""
        now = self._clock()
        keys = _ray.kv_list(BEAT_KEY_PREFIX, NAMESPACE)
        published = _ray.kv_get_many(keys, NAMESPACE) if keys else {}
        counted = slice_seconds_of(snapshot, beating_slices(published, now), seconds)
        for pod_type, by_state in counted.items():
            for state, value in by_state.items():
                metrics.slice_seconds(state, pod_type, value)
        minute = int(now // BUCKET_S) * BUCKET_S
        key = f"{SLICE_SECONDS_KEY_PREFIX}{minute:012d}"
        if minute != self._minute:  # a new minute: start from what an earlier life wrote
            self._minute = minute
            raw = _ray.kv_get(key, NAMESPACE)
            self._bucket = _parse_bucket(raw) if raw is not None else {}
            self._trim(now)
        for pod_type, by_state in counted.items():
            into = self._bucket.setdefault(pod_type, {})
            for state, value in by_state.items():
                into[state] = into.get(state, 0.0) + value
        _ray.kv_put(key, json.dumps(self._bucket).encode(), NAMESPACE)

    def _trim(self, now: float) -> None:
        """Delete the minutes older than :data:`BUCKETS_KEPT_S`."""
        oldest = f"{SLICE_SECONDS_KEY_PREFIX}{int(now - BUCKETS_KEPT_S):012d}"
        for key in _ray.kv_list(SLICE_SECONDS_KEY_PREFIX, NAMESPACE):
            if key < oldest:
                _ray.kv_delete(key, NAMESPACE)


def _parse_bucket(raw: bytes) -> dict[str, dict[str, float]]:
    """One minute's totals; empty if unreadable."""
    try:
        data = json.loads(raw)
        return {str(p): {str(s): float(v) for s, v in states.items()} for p, states in data.items()}
    except (ValueError, TypeError, AttributeError):
        return {}


def read_slice_seconds(since_s: float) -> dict[str, dict[str, float]]:
    """The cluster's slice-seconds over the last ``since_s`` seconds, in whole minutes.

    Args:
        since_s: How far back.

    Returns:
        Pod type -> state -> slice-seconds (every state of :data:`TIME_USES`).

    Raises:
        ValueError: ``since_s`` is not above 0.
    """
    return _read_slice_seconds(since_s, time.time())


def _read_slice_seconds(since_s: float, end: float) -> dict[str, dict[str, float]]:
    """:func:`read_slice_seconds` up to ``end``."""
    if not since_s > 0:
        raise ValueError(f"since_s must be above 0, got {since_s}")
    first = int((end - since_s) // BUCKET_S) * BUCKET_S
    oldest = f"{SLICE_SECONDS_KEY_PREFIX}{first:012d}"
    keys = [k for k in _ray.kv_list(SLICE_SECONDS_KEY_PREFIX, NAMESPACE) if k >= oldest]
    values = _ray.kv_get_many(keys, NAMESPACE) if keys else {}
    total: dict[str, dict[str, float]] = {}
    for raw in values.values():
        for pod_type, by_state in _parse_bucket(raw).items():
            into = total.setdefault(pod_type, dict.fromkeys(TIME_USES, 0.0))
            for state, value in by_state.items():
                into[state] = into.get(state, 0.0) + value
    return total
