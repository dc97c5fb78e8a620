"""Who holds each slice, and the queue's notices to leave: reading the records in Ray's
KV store (their writers are :mod:`tpuslice._reserve.queue.holders`).

A reservation, once it holds its slices, records a :class:`Holder` for each
(``holder/<slice>``): its tenant, priority, whether it may be preempted, since when, and
its placement groups. It deletes them at its hand-back. The queue reads them at each
decision, to know whose every busy slice is (for quotas, fair share and preemption) and,
when a preempted holder outstays its grace period, which groups to remove.

When the queue preempts work, it records on each host of the work's slices a notice in
the format a metadata server's preemption notice takes (``tpu-preempt/<node id>``,
:data:`QUEUE_SOURCE`), so the work's ``notices()``, its resilient run's ``on_notice``,
``tpuslice status`` and new reservations see it as they see GCE's.
"""

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
    """A reservation holding a slice.

    Attributes:
        holder: The reservation's id (one for all its slices).
        slice_name: The slice.
        tenant: Whom it is charged to.
        priority: Its priority.
        preemptible: Whether the queue may preempt it.
        since: When it was held (wall-clock seconds).
        who: The driver (``pid 12 on host-a``).
        groups: Its placement groups on the slice, as hex ids.
        job: The Ray job whose work runs there (hex): a take-back has the hosts' agents
            stop that job's processes that still own their TPUs.
        nodes: The slice's hosts, as node ids.
    """

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
        """Encode for the KV store.

        Returns:
            UTF-8 JSON.
        """
        data = asdict(self)
        data["groups"] = list(self.groups)
        data["nodes"] = list(self.nodes)
        return json.dumps(data).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Holder:
        """Decode what :meth:`to_json` wrote.

        Args:
            raw: The stored bytes.

        Returns:
            The holder.

        Raises:
            ValueError: it is not a holder record.
        """
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
    """Every holder record, by slice (one listing and one read).

    Returns:
        Slice -> its holder; empty when Ray is not connected. Unreadable records are
        skipped (logged at debug).
    """
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
    """Whether a notice is the queue's (its work was preempted to serve another), not a
    metadata server's (its host is going away).

    Args:
        notice: A host's notice, or ``None``.

    Returns:
        True for the queue's.
    """
    return notice is not None and notice.source == QUEUE_SOURCE


def holders_by_id(holders: Mapping[str, Holder]) -> dict[str, list[Holder]]:
    """Group holder records by reservation.

    Args:
        holders: Slice -> its holder.

    Returns:
        Holder id -> its records, by slice name.
    """
    grouped: dict[str, list[Holder]] = {}
    for name in sorted(holders):
        grouped.setdefault(holders[name].holder, []).append(holders[name])
    return grouped
