"""``tpuslice.heartbeat()``: the user's code says "still making progress", cheaply.

A resilient run with ``heartbeat_timeout_s`` gives each rank's call a key in
``TPUSLICE_HEARTBEAT_KEY`` (an actor group, each actor for its life). :func:`heartbeat`
only notes the time in this process (no Ray call, no I/O: a dict write); a daemon thread
publishes the latest beat of the current key to Ray's KV store (namespace ``tpuslice``)
every :data:`PUBLISH_S`, and the driver reads them (:mod:`tpuslice._run.watchdog`). Outside
such a call it does nothing, and a beat whose call has ended is not published.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from tpuslice import _ray
from tpuslice._tpu.keys import NAMESPACE

logger = logging.getLogger(__name__)

BEAT_ENV = "TPUSLICE_HEARTBEAT_KEY"
PUBLISH_S = 0.5
"""How often this process publishes its beats (a beat reaches the driver this late)."""
FORGET_S = 600.0
"""A key not beaten for this long is forgotten here (its run or attempt is over)."""


def heartbeat() -> None:
    """Say this host is making progress (call it once per step).

    Cheap: it reads one environment variable and writes the time in memory; a background
    thread publishes at most every 0.5 s. Outside a call of a run that watches for hangs
    (``run_resilient(..., heartbeat_timeout_s=...)``) it does nothing.
    """
    key = os.environ.get(BEAT_ENV)
    if key is not None:
        BEATS.note(key)


class Beats:
    """This process's newest beat per key, and the daemon thread that publishes them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.latest: dict[str, float] = {}
        """Key -> the time of its newest beat (written without the lock: one dict store)."""
        self._publisher: threading.Thread | None = None

    def note(self, key: str) -> None:
        """Note a beat of ``key`` now, and have the publisher running.

        Args:
            key: The current call's heartbeat key.
        """
        self.latest[key] = time.time()
        thread = self._publisher
        if thread is None or not thread.is_alive():
            with self._lock:
                if self._publisher is None or not self._publisher.is_alive():
                    self._publisher = threading.Thread(
                        target=self._publish, name="tpuslice-heartbeat", daemon=True
                    )
                    self._publisher.start()

    def _publish(self) -> None:
        """Publish beats every :data:`PUBLISH_S` for the process's life."""
        sent: dict[str, float] = {}
        while True:
            self.publish_due(sent)
            time.sleep(PUBLISH_S)

    def publish_due(self, sent: dict[str, float]) -> None:
        """Publish the current call's newest beat if it changed since ``sent``; forget the
        beats of calls that have ended (a task's key is set only around its call: a beat
        published after it would outlive the attempt, whose keys the driver deletes).

        Args:
            sent: Key -> the beat last published (updated).
        """
        now = time.time()
        current = os.environ.get(BEAT_ENV)
        for key, at in list(self.latest.items()):
            if key != current or now - at > FORGET_S:
                self.latest.pop(key, None)
                sent.pop(key, None)
            elif sent.get(key) != at:
                try:
                    _ray.kv_put(key, repr(at).encode(), NAMESPACE)
                    sent[key] = at
                except _ray.kv_errors() as exc:  # the driver has gone; keep the worker alive
                    logger.debug("could not publish heartbeat %s: %s", key, exc)


BEATS = Beats()
"""This process's beats."""
