"""Suspect hosts: a TPU host that just failed someone's run, avoided for a cool-down.
Whoever sees the failure writes a record under the node id (a replaced VM is not suspect);
placement takes a suspect slice only as a last resort; a reader deletes ended records."""

from __future__ import annotations

import enum
import json
import logging
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields

from tpuslice._tpu import _ray
from tpuslice._tpu.keys import NAMESPACE, SUSPECT_COOLDOWN_KEY, SUSPECT_KEY_PREFIX
from tpuslice.errors import InvalidArgumentError

logger = logging.getLogger(__name__)

DEFAULT_COOLDOWN_S = 600.0
"""Long enough that a run's retries go elsewhere, short enough that a passing fault is
forgiven within the hour."""
MAX_EVIDENCE_CHARS = 400  # kept short: every snapshot reads every record


class SuspectReason(str, enum.Enum):
    """Why a host is suspect."""

    HANG = "hang"
    HOST_FAILURE = "host_failure"
    WORKER_CRASH = "worker_crash"
    HEALTH_CHECK = "health_check"


@dataclass(frozen=True)
class Blame:
    """A host the evidence pins a failure on: what marking it suspect needs."""

    node_id: str
    slice_name: str
    worker_id: int
    """-1 if not known."""
    reason: SuspectReason
    evidence: str
    """What was seen, in one line."""


@dataclass(frozen=True)
class Suspect(Blame):
    """One host's suspect record: a :class:`Blame` and its cool-down (wall clock)."""

    since: float
    until: float

    @classmethod
    def of(cls, blame: Blame, since: float, cooldown_s: float) -> Suspect:
        """The record marking a blamed host for ``cooldown_s`` from ``since``."""
        evidence = blame.evidence
        if len(evidence) > MAX_EVIDENCE_CHARS:
            evidence = evidence[: MAX_EVIDENCE_CHARS - 1].rstrip() + "…"
        named = {f.name: getattr(blame, f.name) for f in fields(Blame)}
        return cls(**{**named, "evidence": evidence}, since=since, until=since + cooldown_s)

    def live(self, now: float) -> bool:
        """Whether the cool-down still runs."""
        return now < self.until

    def left(self, now: float) -> float:
        """Seconds of cool-down left (never below 0)."""
        return max(0.0, self.until - now)

    def describe(self, now: float | None = None) -> str:
        """``host 1 suspect (hang), 9 min left``, as a slice's reason shows it."""
        left = self.left(time.time() if now is None else now)
        return f"host {self.worker_id} suspect ({self.reason.value}), {duration(left)} left"

    def to_json(self) -> bytes:
        """UTF-8 JSON for the KV store."""
        return json.dumps({**asdict(self), "reason": self.reason.value}).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Suspect:
        """Decode what :meth:`to_json` wrote; ValueError if it is not a suspect record."""
        try:
            data = json.loads(raw)
            return cls(
                node_id=str(data["node_id"]),
                slice_name=str(data["slice_name"]),
                worker_id=int(data["worker_id"]),
                reason=SuspectReason(data["reason"]),
                evidence=str(data.get("evidence", "")),
                since=float(data["since"]),
                until=float(data["until"]),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a suspect record: {exc}") from exc


def duration(seconds: float) -> str:
    """``45 s`` under 90 s, else ``9 min``: a cool-down's length or what is left of it."""
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def check_cooldown(seconds: float) -> float:
    """The cool-down as a float; InvalidArgumentError unless finite seconds > 0."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise InvalidArgumentError(f"a suspect cool-down must be seconds > 0, got {seconds!r}")
    if not 0 < seconds < math.inf:
        raise InvalidArgumentError(
            f"a suspect cool-down must be finite seconds > 0, got {seconds!r}; "
            f"the default is {DEFAULT_COOLDOWN_S:g}"
        )
    return float(seconds)


def set_cooldown(seconds: float) -> None:
    """Set the cluster's cool-down (checked) of hosts marked from now on."""
    _ray.kv_put(SUSPECT_COOLDOWN_KEY, str(check_cooldown(seconds)).encode(), NAMESPACE)


def cooldown() -> float:
    """The cluster's valid cool-down setting, else :data:`DEFAULT_COOLDOWN_S`."""
    raw = _ray.kv_get(SUSPECT_COOLDOWN_KEY, NAMESPACE)
    if raw is None:
        return DEFAULT_COOLDOWN_S
    try:
        return check_cooldown(float(raw))
    except ValueError as exc:  # InvalidArgumentError is one too
        logger.debug("ignoring the cluster's suspect cool-down %r: %s", raw, exc)
        return DEFAULT_COOLDOWN_S


def mark(blames: Sequence[Blame], *, now: float | None = None) -> list[Suspect]:
    """Mark hosts suspect for the cluster's cool-down from now; the records written."""
    if not blames:
        return []
    since = time.time() if now is None else now
    seconds = cooldown()
    records = [Suspect.of(blame, since, seconds) for blame in blames]
    for record in records:
        _ray.kv_put(SUSPECT_KEY_PREFIX + record.node_id, record.to_json(), NAMESPACE)
    return records


def live_suspects(stored: Mapping[str, bytes], now: float) -> tuple[dict[str, Suspect], list[str]]:
    """Of stored records by KV key: the live ones by node id, and the keys to delete."""
    found: dict[str, Suspect] = {}
    ended: list[str] = []
    for key, raw in stored.items():
        try:
            record = Suspect.from_json(raw)
        except ValueError as exc:
            logger.debug("deleting unreadable suspect record %s: %s", key, exc)
            ended.append(key)
            continue
        if record.live(now):
            found[key.removeprefix(SUSPECT_KEY_PREFIX)] = record
        else:
            ended.append(key)
    return found, ended


def forget(keys: Iterable[str]) -> None:
    """Delete records by KV key, best effort: the next reader tries again."""
    for key in keys:
        try:
            _ray.kv_delete(key, NAMESPACE)
        except _ray.kv_errors() as exc:
            logger.debug("could not delete %s: %s", key, exc)


def clear_slice(slice_name: str, now: float | None = None) -> list[Suspect]:
    """Trust every host of a slice again (ended records anywhere go too); those deleted."""
    when = time.time() if now is None else now
    keys = _ray.kv_list(SUSPECT_KEY_PREFIX, NAMESPACE)
    found, ended = live_suspects(_ray.kv_get_many(keys, NAMESPACE), when)
    cleared = sorted(
        (r for r in found.values() if r.slice_name == slice_name), key=lambda r: r.worker_id
    )
    forget([*ended, *(SUSPECT_KEY_PREFIX + r.node_id for r in cleared)])
    return cleared


def clear_all() -> list[Suspect]:
    """Trust every host of the cluster again; the live records deleted."""
    keys = _ray.kv_list(SUSPECT_KEY_PREFIX, NAMESPACE)
    found, _ = live_suspects(_ray.kv_get_many(keys, NAMESPACE), time.time())
    forget(keys)
    return sorted(found.values(), key=lambda r: (r.slice_name, r.worker_id))
