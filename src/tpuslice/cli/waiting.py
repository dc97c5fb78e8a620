"""What a command shows while its reservation waits (:class:`WaitLine`: time waited, place
in the cluster's queue and the queue's reason), and library messages in the command line's
terms (:func:`in_cli_terms`).
"""

from __future__ import annotations

import os
import threading
import time
from types import TracebackType

from rich.console import Console
from rich.text import Text

from tpuslice._view.cluster import ClusterSnapshot, read_snapshot

__all__ = ["WaitLine", "in_cli_terms"]

CLI_OPTIONS = {
    "max_retries_failure / max_retries_preemption": "--retries",
    "head_reservation_timeout_s": "--timeout",
}
"""Arguments of the Python API that library messages name -> the ``tpuslice run`` option."""
REDRAW_S = 1.0
"""How often the line is redrawn (it reads the cluster view each time)."""


def in_cli_terms(message: str) -> str:
    """A library message, naming the command's options instead of the API's arguments.

    Args:
        message: As the library wrote it.

    Returns:
        The message for a user of the command line.
    """
    for argument, option in CLI_OPTIONS.items():
        message = message.replace(argument, option)
    return message


def wait_line(
    what: str, waited_s: float, timeout_s: float | None, snapshot: ClusterSnapshot, pid: int
) -> str:
    """One line on where a waiting reservation of this process stands. Pure.

    Args:
        what: The request, as ``1 x v6e 4x4``.
        waited_s: How long it has waited.
        timeout_s: Its ``--timeout`` (``None``: no limit).
        snapshot: The cluster now (with the queue's record).
        pid: This process, as the queue names its requests' drivers.

    Returns:
        ``waiting 3 s of 8 s for 1 x v6e 4x4: position 2 in the cluster's queue, ...``.
    """
    limit = "" if timeout_s is None else f" of {timeout_s:g} s"
    head = f"waiting {waited_s:.0f} s{limit} for {what}"
    ours = [r for r in snapshot.queued() if r.who.startswith(f"pid {pid} ")]
    if not ours:
        return f"{head}: reserving"
    request = min(ours, key=lambda r: r.position)
    if request.granted:
        return f"{head}: granted {', '.join(request.granted)}, claiming"
    ahead = request.position - 1
    place = (
        "first in the cluster's queue"
        if ahead == 0
        else f"position {request.position} in the cluster's queue, {ahead} request(s) ahead"
    )
    return f"{head}: {place}" + (f"; {request.reason}" if request.reason else "")


class WaitLine:
    """Redraws :func:`wait_line` every :data:`REDRAW_S` from a daemon thread, from entering
    until :meth:`stop` (or leaving). Only a terminal gets it: the line redraws in place.

    Args:
        console: Where to draw (stderr).
        what: The request.
        timeout_s: Its timeout.
    """

    def __init__(self, console: Console, what: str, timeout_s: float | None) -> None:
        self._console = console
        self._what = what
        self._timeout_s = timeout_s
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> WaitLine:
        if self._console.is_terminal:
            self._thread = threading.Thread(target=self._loop, name="tpuslice-wait", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop redrawing, and clear the line (the work's own output follows)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(2 * REDRAW_S)

    def line(self) -> str:
        """The line now (reads the cluster once).

        Returns:
            The text.
        """
        waited = time.monotonic() - self._started
        return wait_line(self._what, waited, self._timeout_s, read_snapshot(), os.getpid())

    def _loop(self) -> None:
        with self._console.status(self._fit(f"waiting for {self._what}")) as status:
            while not self._stop.wait(REDRAW_S):
                try:
                    status.update(self._fit(self.line()))
                except Exception:  # noqa: BLE001 - the line is a courtesy: never fail the run
                    status.update(self._fit(f"waiting for {self._what}"))

    def _fit(self, text: str) -> Text:
        """Cut to the terminal's width less the spinner: a wrapped line would not redraw."""
        room = max(10, self._console.width - 3)
        return Text(text if len(text) <= room else text[: room - 1] + "…")
