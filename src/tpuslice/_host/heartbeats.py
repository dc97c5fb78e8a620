"""``heartbeat()`` and ``checkpointed()``: the user's code says "still making progress" and
"a checkpoint is saved", cheaply; a daemon thread publishes each call's beats to Ray's KV
store for the driver's watchdog and goodput account."""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, replace

from tpuslice._tpu import _ray
from tpuslice._tpu.keys import NAMESPACE
from tpuslice.errors import InvalidArgumentError

logger = logging.getLogger(__name__)

BEAT_ENV = "TPUSLICE_HEARTBEAT_KEY"
PUBLISH_S = 0.5  # how often this process publishes: a beat reaches the driver this late
SLICE_MARK = "@"  # beat/<attempt>/<rank>@<slice>


def beat_key(prefix: str, rank: int, slice_name: str = "") -> str:
    """``beat/<id>/<rank>@<slice>``: the slice tells the slice-second count who works."""
    return f"{prefix}{rank}{SLICE_MARK}{slice_name}" if slice_name else f"{prefix}{rank}"


def heartbeat() -> None:
    """Say this host is making progress (call it once per step): a dict write, published
    by a background thread. Outside a tpuslice call it does nothing."""
    BEATS.note()


def checkpointed(step: int | None = None) -> None:
    """Say this host has just finished saving a checkpoint.

    The goodput account counts the time since the previous beat as checkpointing and the work
    before as saved. A beat too, published at once (a mark made as the call returns is lost).

    Args:
        step: The training step saved, shown in the account (optional).

    Raises:
        InvalidArgumentError: ``step`` is negative or not an integer.
    """
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise InvalidArgumentError(
            f"checkpointed(step={step!r}): step must be a whole number >= 0, or None"
        )
    BEATS.note(checkpoint=True, step=step)


@dataclass(frozen=True)
class Progress:
    """What one rank's call has published: its beats and its checkpoints (wall clock)."""

    last: float
    first: float
    checkpoint_at: float | None = None
    checkpoint_s: float = 0.0
    """Seconds spent checkpointing, over all its checkpoints."""
    checkpoints: int = 0
    step: int | None = None
    """The step its newest checkpoint saved, if given."""

    def encode(self) -> bytes:
        """Space-separated fields (``-`` for none), the newest beat first for its readers."""
        at = "-" if self.checkpoint_at is None else repr(self.checkpoint_at)
        step = "-" if self.step is None else str(self.step)
        fields = (repr(self.last), repr(self.first), at, repr(self.checkpoint_s))
        return " ".join((*fields, str(self.checkpoints), step)).encode()

    @classmethod
    def decode(cls, raw: bytes | None) -> Progress | None:
        """Read a published record (or a bare beat time); None if absent or unreadable."""
        if raw is None:
            return None
        try:
            parts = raw.decode().split()
            last = float(parts[0])
            if len(parts) < 6:
                return cls(last, last)
            return cls(
                last,
                float(parts[1]),
                None if parts[2] == "-" else float(parts[2]),
                float(parts[3]),
                int(parts[4]),
                None if parts[5] == "-" else int(parts[5]),
            )
        except (ValueError, IndexError, UnicodeDecodeError):
            return None


class Beats:
    """This process's progress per key, and the daemon thread that publishes it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._noting = threading.Lock()
        self.latest: dict[str, Progress] = {}
        """Key -> its progress (replaced whole: the publisher reads it without a lock)."""
        self._publisher: threading.Thread | None = None
        self._wake = threading.Event()

    def note(self, *, checkpoint: bool = False, step: int | None = None) -> None:
        """Note a beat (or checkpoint) of the current call, if any; start the publisher."""
        key = os.environ.get(BEAT_ENV)
        if key is None:
            return
        now = time.time()
        with self._noting:  # a threaded actor's calls may beat at once
            before = self.latest.get(key)
            progress = Progress(now, now) if before is None else replace(before, last=now)
            if checkpoint:
                spent = 0.0 if before is None else max(0.0, now - before.last)
                progress = replace(
                    progress,
                    checkpoint_at=now,
                    checkpoint_s=progress.checkpoint_s + spent,
                    checkpoints=progress.checkpoints + 1,
                    step=step,
                )
            self.latest[key] = progress
        thread = self._publisher
        if thread is None or not thread.is_alive():
            with self._lock:
                if self._publisher is None or not self._publisher.is_alive():
                    self._publisher = threading.Thread(
                        target=self._publish, name="tpuslice-heartbeat", daemon=True
                    )
                    self._publisher.start()
        if checkpoint:
            self._wake.set()

    def _publish(self) -> None:
        """Publish every :data:`PUBLISH_S`, or at once on a checkpoint, for the process's life."""
        sent: dict[str, Progress] = {}
        while True:
            self.publish_due(sent)
            self._wake.wait(PUBLISH_S)
            self._wake.clear()

    def publish_due(self, sent: dict[str, Progress]) -> None:
        """Publish the current call's progress if it changed since ``sent``; forget ended
        calls' (a beat published after would outlive the keys the driver deletes)."""
        current = os.environ.get(BEAT_ENV)
        for key, progress in list(self.latest.items()):
            if key != current:
                self.latest.pop(key, None)
                sent.pop(key, None)
            elif sent.get(key) != progress:
                try:
                    _ray.kv_put(key, progress.encode(), NAMESPACE)
                    sent[key] = progress
                except _ray.kv_errors() as exc:  # the driver has gone; keep the worker alive
                    logger.debug("could not publish heartbeat %s: %s", key, exc)


BEATS = Beats()
