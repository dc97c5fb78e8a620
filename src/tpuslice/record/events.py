"""The slice timeline (reservations, waits, hand-backs, runs, notices, suspects, ...), kept
in Ray's KV store so it outlives the driver: one key per event, sorting by time.
:func:`record` returns at once; the connection's writer thread writes and trims the store.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol, TypeVar

from tpuslice._tpu import _ray
from tpuslice._tpu._connection import Tier, connection
from tpuslice._tpu.keys import EVENT_KEY_PREFIX as KEY_PREFIX
from tpuslice._tpu.keys import NAMESPACE

__all__ = ["KINDS", "MAX_EVENTS", "SliceEvent", "flush", "read_events"]

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

MAX_EVENTS = 1000
"""The store keeps about this many (the newest)."""
TRIM_EVERY_S = 5.0
"""A writer trims at its first write, then at most this often."""

KINDS = (
    "reserved",  # granted: seconds = the wait
    "timed_out",  # gave up waiting: seconds = the wait
    "impossible",  # the cluster can never hold the request
    "released",  # slices handed back: seconds = how long they were held
    "run",  # a one-shot or `tpuslice run` ended: seconds = its duration, outcome
    "attempt",  # a resilient attempt started, was warned, failed or succeeded
    "gave_up",  # a resilient run used up its budget
    "suspect",  # a host was marked suspect: seconds = its cool-down, outcome = the reason
    "cleared",  # a slice's suspect hosts were trusted again
    "preempted",  # the queue told work to leave: seconds = its grace, detail = why
    "taken_back",  # preempted work outstayed its grace: its groups were removed
    "quota",  # a tenant's quota was set or removed: detail = what, who, from where
)


@dataclass(frozen=True)
class SliceEvent:
    """One entry of the timeline: at ``at`` (wall clock), an event of a ``kind`` of
    :data:`KINDS` for ``what`` (``<count> x <accelerator> <topology>``), recorded by the Ray
    job ``job`` (hex). ``seconds`` is the wait, hold or run time the kind names (``None``:
    none); ``outcome`` how it ended (``granted``, ``ok``, ``failure``, ``preemption``, ...)."""

    at: float
    kind: str
    slices: tuple[str, ...] = ()
    what: str = ""
    job: str = ""
    seconds: float | None = None
    outcome: str = ""
    detail: str = ""
    tenant: str = ""
    """The tenant whose request it was, where the event knows it."""

    def to_dict(self) -> dict[str, Any]:
        """The event as JSON-ready data.

        Returns:
            Its fields, ``slices`` as a list.
        """
        data = asdict(self)
        data["slices"] = list(self.slices)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SliceEvent:
        """Read back :meth:`to_dict`'s output.

        Args:
            data: As written.

        Returns:
            The event.

        Raises:
            KeyError: ``at`` or ``kind`` is missing.
            TypeError: a field has the wrong type.
            ValueError: ``at`` or ``seconds`` is not a number.
        """
        seconds = data.get("seconds")
        return cls(
            at=float(data["at"]),
            kind=str(data["kind"]),
            slices=tuple(str(s) for s in data.get("slices", ())),
            what=str(data.get("what", "")),
            job=str(data.get("job", "")),
            seconds=None if seconds is None else float(seconds),
            outcome=str(data.get("outcome", "")),
            detail=str(data.get("detail", "")),
            tenant=str(data.get("tenant", "")),
        )

    def describe(self) -> str:
        """One line: ``reserved v4-16-a (1 x v4 2x2x2) after 0.4 s: granted``.

        Returns:
            The event as text, without its time.
        """
        text = self.kind.replace("_", " ")
        if self.slices:
            text += " " + ", ".join(self.slices)
        if self.what:
            text += f" ({self.what})"
        if self.seconds is not None:
            text += f" {_SECONDS_WORD.get(self.kind, 'after')} {self.seconds:.1f} s"
        if self.outcome and self.outcome != self.kind:
            text += f": {self.outcome}"
        if self.detail:
            text += f"; {self.detail}"
        return text


_SECONDS_WORD = {
    "released": "held",
    "run": "ran",
    "attempt": "ran",
    "suspect": "for",
    "preempted": "with a grace of",
}


class Recorded(Protocol):
    """What a writer keeps: an event or an account."""

    @property
    def at(self) -> float:
        """Its time, in seconds since the epoch (its key sorts by it)."""

    def to_dict(self) -> dict[str, Any]:
        """Its JSON-ready form."""


def event_key(event: Recorded, writer: str, number: int, prefix: str = KEY_PREFIX) -> str:
    """The KV key of one event: sorts by time, then writer (the writing process's random
    id), then ``number``, how many events this writer wrote before."""
    return f"{prefix}{int(event.at * 1e9):020d}-{writer}-{number:08d}"


def keys_to_trim(keys: list[str], keep: int) -> list[str]:
    """The keys (in any order) to delete to keep the newest ``keep``, oldest first."""
    ordered = sorted(keys)
    return ordered[: max(0, len(ordered) - keep)]


class EventWriter:
    """Writes :class:`Recorded` items to the KV store from a daemon thread, so callers never
    wait on the GCS; trims the store to the newest ``keep``. With no arguments, it is the
    connection's timeline writer on Ray's KV store (``put``, ``list_keys``, ``delete``)."""

    tier = Tier.WRITER

    def __init__(
        self,
        put: Any = None,
        list_keys: Any = None,
        delete: Any = None,
        keep: int = MAX_EVENTS,
        trim_every_s: float = TRIM_EVERY_S,
        prefix: str = KEY_PREFIX,
    ) -> None:
        self.keep = keep
        self.prefix = prefix
        self._trim_every_s = trim_every_s
        self._put = put or (lambda k, v: _ray.kv_put(k, v, NAMESPACE))
        self._list = list_keys or (lambda p: _ray.kv_list(p, NAMESPACE))
        self._delete = delete or (lambda k: _ray.kv_delete(k, NAMESPACE))
        self.writer = secrets.token_hex(4)
        self.dropped = 0
        """Events that could not be written (Ray gone or unreachable) or were pushed out."""
        self._pending: deque[Recorded] = deque()
        self._written = 0
        self._wrote_since_trim = False
        self._last_trim = -float("inf")  # the first write trims
        self._cond = threading.Condition()
        self._busy = False
        self._thread: threading.Thread | None = None
        self._stopped = False

    def record(self, event: Recorded) -> None:
        """Queue ``event`` for writing (returns at once)."""
        with self._cond:
            if self._stopped:
                self.dropped += 1
                return
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="tpuslice-events", daemon=True
                )
                self._thread.start()
            if len(self._pending) >= self.keep:  # the store is stuck: keep the newest
                self._pending.popleft()
                self.dropped += 1
            self._pending.append(event)
            self._cond.notify_all()

    def flush(self, timeout_s: float = 2.0) -> bool:
        """Wait at most ``timeout_s`` until every recorded event is written (or dropped: Ray
        unreachable); whether everything was handled in time."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._pending or self._busy:
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None or not self._thread.is_alive():
                    return not (self._pending or self._busy)
                self._cond.wait(left)
        return True

    def close(self) -> None:
        """Write what is pending (2 s at most), then stop the thread."""
        self.flush()
        self.drop()

    def drop(self) -> None:
        """Stop the thread; what is pending is not written."""
        with self._cond:
            self._stopped = True
            self.dropped += len(self._pending)
            self._pending.clear()
            self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                batch, self._pending = list(self._pending), deque()
                self._busy = True
            try:
                self._write(batch)
                self._trim()
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _write(self, batch: list[Recorded]) -> None:
        for event in batch:
            key = event_key(event, self.writer, self._written, self.prefix)
            self._written += 1
            try:
                self._put(key, json.dumps(event.to_dict()).encode())
                self._wrote_since_trim = True
            except Exception as exc:  # noqa: BLE001 - Ray gone or unreachable: drop it;
                self.dropped += 1  # this thread must live on for the next events
                logger.debug("could not record %s: %s", key, exc)

    def _trim(self) -> None:
        now = time.monotonic()
        if not self._wrote_since_trim or now - self._last_trim < self._trim_every_s:
            return
        self._last_trim, self._wrote_since_trim = now, False
        try:
            for key in keys_to_trim(self._list(self.prefix), self.keep):
                self._delete(key)
        except Exception as exc:  # noqa: BLE001 - as in _write
            logger.debug("could not trim the event store: %s", exc)


def record(kind: str, **fields: Any) -> SliceEvent:
    """Add an event of one of :data:`KINDS` (else ``ValueError``) to the timeline, written
    in the background (an unreachable store only drops it). ``at`` defaults to now, ``job``
    to this process's Ray job."""
    if kind not in KINDS:
        raise ValueError(f"event kind {kind!r} is not one of {', '.join(KINDS)}")
    fields.setdefault("at", time.time())
    if not fields.get("job"):
        fields["job"] = job_id()
    event = SliceEvent(kind=kind, **fields)
    connection().part(EventWriter).record(event)
    return event


def flush(timeout_s: float = 2.0) -> bool:
    """Wait (bounded) until this process's recorded events are in the store.

    Args:
        timeout_s: Seconds to wait at most.

    Returns:
        Whether all were written in time.
    """
    return connection().part(EventWriter).flush(timeout_s)


def read_events(limit: int = MAX_EVENTS) -> list[SliceEvent]:
    """The newest events in the store, oldest first.

    Args:
        limit: How many at most.

    Returns:
        The events; entries that do not parse are skipped.

    Raises:
        ValueError: ``limit`` is below 1.
    """
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    return read_stored(KEY_PREFIX, limit, SliceEvent.from_dict)


def read_stored(prefix: str, limit: int, parse: Callable[[dict[str, Any]], _T]) -> list[_T]:
    """The newest ``limit`` (at least 1) items a writer kept under ``prefix``, oldest
    first; one that does not parse, or was trimmed since the listing, is skipped."""
    keys = sorted(_ray.kv_list(prefix, NAMESPACE))[-limit:]
    found = _ray.kv_get_many(keys, NAMESPACE) if keys else {}
    items = []
    for key in keys:
        raw = found.get(key)
        if raw is None:
            continue
        try:
            items.append(parse(json.loads(raw)))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            logger.debug("skipping %s: %s", key, exc)
    return items


def job_id() -> str:
    """This process's Ray job id (hex); empty when Ray is not connected."""
    import ray

    return _ray.current_job_id() if ray.is_initialized() else ""
