"""What the cluster-wide queue publishes to Ray's KV store after each decision, which every
snapshot carries (so status and metrics see who waits). Pure.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

RECORD_FRESH_S = 3.0
"""The queue writes at every decision while anyone waits: an older record means its actor
is gone or idle."""


@dataclass(frozen=True)
class QueuedRequest:
    """One request waiting in the queue (or granted, not yet claimed), from the driver
    ``who`` (``pid 12 on host-a (job 01000000)``) that asked at ``since`` (wall clock) for
    ``count`` (min, max) slices of ``kind`` (``v6e-16 4x4``)."""

    ticket: str
    kind: str
    count: tuple[int, int]
    priority: int
    who: str
    since: float
    position: int
    """Its place in the queue, from 1."""
    granted: tuple[str, ...] = ()
    """Slices granted to it and not yet claimed."""
    reason: str = ""
    arrival: int = 0
    """Its arrival number: a restarted queue keeps its place for it."""
    tenant: str = ""
    preemptible: bool = False

    @property
    def wanted(self) -> str:
        """``2`` or ``1..3`` slices."""
        low, high = self.count
        return str(low) if low == high else f"{low}..{high}"

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready form (``count`` as ``[min, max]``)."""
        data = asdict(self)
        data["count"], data["granted"] = list(self.count), list(self.granted)
        return data


@dataclass(frozen=True)
class QueueRecord:
    """The queue at one moment: when it was written (wall clock), and every ticket in
    serving order."""

    at: float
    requests: tuple[QueuedRequest, ...] = ()

    def fresh(self, now: float) -> bool:
        """Whether the record still describes a live queue at wall-clock ``now``."""
        return now - self.at < RECORD_FRESH_S

    def to_json(self) -> bytes:
        """Encode for the KV store, as UTF-8 JSON."""
        data = {"at": self.at, "requests": [r.to_dict() for r in self.requests]}
        return json.dumps(data).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> QueueRecord:
        """Decode what :meth:`to_json` wrote (``ValueError`` if it is not such a record)."""
        data = json.loads(raw)
        try:
            requests = tuple(
                QueuedRequest(
                    ticket=str(r["ticket"]),
                    kind=str(r["kind"]),
                    count=(int(r["count"][0]), int(r["count"][1])),
                    priority=int(r["priority"]),
                    who=str(r["who"]),
                    since=float(r["since"]),
                    position=int(r["position"]),
                    granted=tuple(str(s) for s in r.get("granted", ())),
                    reason=str(r.get("reason", "")),
                    arrival=int(r.get("arrival", 0)),
                    tenant=str(r.get("tenant", "")),
                    preemptible=bool(r.get("preemptible", False)),
                )
                for r in data["requests"]
            )
            return cls(at=float(data["at"]), requests=requests)
        except (KeyError, TypeError, IndexError) as exc:
            raise ValueError(f"not a queue record: {exc}") from exc
