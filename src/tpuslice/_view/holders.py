"""Who holds each slice (``holder/<slice>`` records, written by
:mod:`tpuslice._reserve.queue.holders`), and how to tell the queue's notices to leave from
GCE's: the queue gives them in the same format, with :data:`QUEUE_SOURCE`."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from tpuslice._host.notices import Notice
from tpuslice._tpu import _ray
from tpuslice._tpu.keys import HOLDER_KEY_PREFIX, NAMESPACE

logger = logging.getLogger(__name__)

QUEUE_SOURCE = "tpuslice queue"
"""The :attr:`~tpuslice._host.notices.Notice.source` of a notice the queue gave."""


@dataclass(frozen=True)
class Holder:
    """A reservation (``holder``, one id for all its slices) holding a slice since a
    wall-clock time; the queue reads these for quotas, fair share and preemption. ``job``
    is the Ray job whose work runs there: a take-back stops its processes."""

    holder: str
    slice_name: str
    tenant: str
    priority: int
    preemptible: bool
    since: float
    who: str
    groups: tuple[str, ...] = ()
    job: str = ""
    nodes: tuple[str, ...] = ()

    def to_json(self) -> bytes:
        """Encode for the KV store, as UTF-8 JSON."""
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Holder:
        """Decode what :meth:`to_json` wrote (``ValueError`` if it is not a holder record)."""
        try:
            data = json.loads(raw)
            return cls(
                holder=str(data["holder"]),
                slice_name=str(data["slice_name"]),
                tenant=str(data.get("tenant", "")),
                priority=int(data.get("priority", 0)),
                preemptible=bool(data.get("preemptible", False)),
                since=float(data["since"]),
                who=str(data.get("who", "")),
                groups=tuple(str(g) for g in data.get("groups", ())),
                job=str(data.get("job") or ""),
                nodes=tuple(str(n) for n in data.get("nodes", ())),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a holder record: {exc}") from exc


def read_holders() -> dict[str, Holder]:
    """Slice -> its holder record (none without Ray; unreadable ones skipped)."""
    keys = _ray.kv_list(HOLDER_KEY_PREFIX, NAMESPACE)
    found: dict[str, Holder] = {}
    for key, raw in _ray.kv_get_many(keys, NAMESPACE).items():
        try:
            holder = Holder.from_json(raw)
        except ValueError as exc:
            logger.debug("ignoring unreadable record %s: %s", key, exc)
            continue
        found[holder.slice_name] = holder
    return found


def given_by_queue(notice: Notice | None) -> bool:
    """Whether a notice is the queue's (its work was preempted), not a metadata server's."""
    return notice is not None and notice.source == QUEUE_SOURCE


def holders_by_id(holders: Mapping[str, Holder]) -> dict[str, list[Holder]]:
    """Group holder records (by slice) by reservation, each group in slice-name order."""
    grouped: dict[str, list[Holder]] = {}
    for name in sorted(holders):
        grouped.setdefault(holders[name].holder, []).append(holders[name])
    return grouped
