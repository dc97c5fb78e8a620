"""Preemption and maintenance notices a TPU host's metadata server gives. Each host's agent
long-polls them and records the standing :class:`Notice` in Ray's KV store, so everyone
sees it without asking the host."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from tpuslice._host.metadata import Watched, watch

logger = logging.getLogger(__name__)

PREEMPTED_PATH = "instance/preempted"
MAINTENANCE_PATH = "instance/maintenance-event"
PREEMPTION_NOTICE_S = 30.0  # GCE warns a Spot VM "about 30 seconds" ahead
MAINTENANCE_NOTICE_S = 60.0  # maintenance-event changes this long before maintenance
WATCH_TIMEOUT_S = 60.0  # how long the server may hold one long-poll
STALE_S = 300.0
"""A notice this long past its deadline is left over from a host that is gone."""
RETRY_S = 5.0  # pause after a failed watch


@dataclass(frozen=True)
class Notice:
    """A warning a host's metadata server (or the queue, preempting its work) gave."""

    kind: str
    """``preemption`` or ``maintenance``."""
    event: str
    """The metadata value (``TRUE``, ``TERMINATE_ON_HOST_MAINTENANCE``)."""
    since: float
    deadline: float
    """When the host is expected to go."""
    node_id: str = ""
    slice_name: str = ""
    worker_id: int = -1
    source: str = ""
    """Who gave it: ``""`` for the metadata server, else the giver (the queue)."""
    holder: str = ""
    """With the queue's notice, the reservation whose hand-back clears it."""

    @property
    def state(self) -> str:
        """``PREEMPTING`` or ``MAINTENANCE``, as status shows it."""
        return "PREEMPTING" if self.kind == "preemption" else "MAINTENANCE"

    def left(self, now: float) -> float:
        """Seconds until the expected deadline (never below 0).

        Args:
            now: Wall-clock seconds.

        Returns:
            The time left.
        """
        return max(0.0, self.deadline - now)

    def stale(self, now: float) -> bool:
        """Whether the notice is left over (:data:`STALE_S` past its deadline).

        Args:
            now: Wall-clock seconds.

        Returns:
            True if it no longer describes a live host.
        """
        return now > self.deadline + STALE_S

    def describe(self, now: float | None = None) -> str:
        """``preemption notice on v4-16-a host 1 (instance/preempted=TRUE), 24 s left``.

        Args:
            now: Wall-clock seconds (default: now).

        Returns:
            One line.
        """
        path = PREEMPTED_PATH if self.kind == "preemption" else MAINTENANCE_PATH
        left = self.left(time.time() if now is None else now)
        given = f"{self.source}: {self.event}" if self.source else f"{path}={self.event}"
        return (
            f"{self.kind} notice on {self.slice_name} host {self.worker_id} "
            f"({given}), {left:.0f} s left"
        )

    def to_json(self) -> bytes:
        """Encode for the KV store.

        Returns:
            UTF-8 JSON.
        """
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Notice:
        """Decode what :meth:`to_json` wrote.

        Args:
            raw: The stored bytes.

        Returns:
            The notice.

        Raises:
            ValueError: it is not a notice.
        """
        try:
            data = json.loads(raw)
            return cls(
                kind=str(data["kind"]),
                event=str(data["event"]),
                since=float(data["since"]),
                deadline=float(data["deadline"]),
                node_id=str(data.get("node_id", "")),
                slice_name=str(data.get("slice_name", "")),
                worker_id=int(data.get("worker_id", -1)),
                source=str(data.get("source", "")),
                holder=str(data.get("holder", "")),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a notice: {exc}") from exc


def notice_kind(path: str, value: str | None) -> str | None:
    """What the value at ``path`` warns of: ``preemption``, ``maintenance`` or None."""
    if value is None:
        return None
    if path == PREEMPTED_PATH:
        return "preemption" if value.upper() == "TRUE" else None
    return "maintenance" if value.upper() != "NONE" else None


def notice_period(kind: str) -> float:
    """How many seconds before the host goes GCE warns, for a kind of notice."""
    return PREEMPTION_NOTICE_S if kind == "preemption" else MAINTENANCE_NOTICE_S


def watch_value(
    path: str,
    record: Callable[[str, Notice | None], None],
    stop: threading.Event,
    *,
    describe: Callable[[str, str, float], Notice],
    poll: Callable[[str, str, float], Watched] = lambda p, etag, timeout: watch(p, etag, timeout),
    clock: Callable[[], float] = time.time,
) -> None:
    """Follow one metadata value until ``stop``, recording the notice it gives first (None
    clears a previous watcher's) and at each change. A server that never answered (not on GCE)
    ends the watch; one that stops answering is asked every :data:`RETRY_S`."""
    etag = ""
    answered = recorded = False
    current: tuple[str, str] | None = None
    while not stop.is_set():
        got = poll(path, etag, WATCH_TIMEOUT_S)
        if not got.reachable:
            if not answered:
                logger.debug("no metadata server answers %s: not watching it", path)
                return
            stop.wait(RETRY_S)
            etag = ""
            continue
        answered = True
        if got.etag and got.etag == etag:
            continue  # held until the timeout: unchanged
        etag = got.etag
        kind = notice_kind(path, got.value)
        state = (kind, got.value or "") if kind else None
        if not recorded or state != current:
            recorded, current = True, state
            notice = None if kind is None else describe(kind, got.value or "", clock())
            record(path, notice)
        if not etag:  # a server without ETags (or a 404) cannot hold requests: no spinning
            stop.wait(RETRY_S)
