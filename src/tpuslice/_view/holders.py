"""Who holds each slice, and the queue's notices to leave: records in Ray's KV store.

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

import contextlib
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

from tpuslice._host.notices import Notice
from tpuslice._tpu import _ray
from tpuslice._tpu.keys import HOLDER_KEY_PREFIX, NAMESPACE, PREEMPT_KEY_PREFIX

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


def record_held(holders: Iterable[Holder]) -> None:
    """Record a reservation's slices as held by it (best effort: a cluster without these
    records still works; its queue sees the slices busy, held by no one it can name).

    Args:
        holders: One per slice.
    """
    try:
        for holder in holders:
            _ray.kv_put(HOLDER_KEY_PREFIX + holder.slice_name, holder.to_json(), NAMESPACE)
    except _ray.kv_errors() as exc:
        logger.debug("could not record the slices held: %s", exc)


def forget_held(slice_names: Sequence[str], node_ids: Sequence[str], holder: str) -> None:
    """At a hand-back: delete the slices' holder records and the notices the queue gave
    their hosts, those of this reservation only (the slices may already be another's,
    after a preemption took them back), best effort.

    Args:
        slice_names: The slices handed back.
        node_ids: Their hosts.
        holder: The reservation's holder id.
    """
    try:
        forget_records(slice_names, holder)
        # One listing, then only the hosts warned: almost always none.
        prefix = PREEMPT_KEY_PREFIX
        warned = [k for k in _ray.kv_list(prefix, NAMESPACE) if k.removeprefix(prefix) in node_ids]
        for key, raw in _ray.kv_get_many(warned, NAMESPACE).items():
            with contextlib.suppress(ValueError):
                if Notice.from_json(raw).holder == holder:
                    _ray.kv_delete(key, NAMESPACE)
    except _ray.kv_errors() as exc:
        logger.debug("could not forget the slices held: %s", exc)


def forget_records(slice_names: Sequence[str], holder: str) -> None:
    """Delete the holder records of these slices that are still ``holder``'s.

    Args:
        slice_names: The slices.
        holder: The holder id whose records go.
    """
    keys = [HOLDER_KEY_PREFIX + name for name in slice_names]
    for key, raw in _ray.kv_get_many(keys, NAMESPACE).items():
        try:
            mine = Holder.from_json(raw).holder == holder
        except ValueError:
            mine = True  # unreadable: nobody's
        if mine:
            _ray.kv_delete(key, NAMESPACE)


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


def give_notices(notices: Iterable[Notice]) -> None:
    """Record the queue's notices on their hosts.

    Args:
        notices: One per host (their ``node_id`` names the host).
    """
    for notice in notices:
        _ray.kv_put(PREEMPT_KEY_PREFIX + notice.node_id, notice.to_json(), NAMESPACE)


def clear_notices(node_ids: Iterable[str]) -> None:
    """Delete the queue's notices on these hosts.

    Args:
        node_ids: The hosts.
    """
    for node_id in node_ids:
        _ray.kv_delete(PREEMPT_KEY_PREFIX + node_id, NAMESPACE)


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
