"""The driver's connection: everything one process keeps while it is connected to a
cluster (threads, actor handles, caches, writers), owned in one place and closed in one
order, as trio's nurseries own their tasks. Host agents and the queue actor are
processes too, each with a connection of its own.

:func:`connection` gives this process's current one; a reconnection, or a fork, starts
another and lets the old one go without handing anything back (its cluster is not the
one this process talks to now). :func:`close_connection` closes it: at exit (the one
exit hook, added with the first connection, so after ``import ray`` and before Ray's
``shutdown``), and before this process disconnects.
"""

from __future__ import annotations

import enum
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar, cast

from tpuslice._tpu import _ray
from tpuslice._tpu._process import EXIT_HOOKS

logger = logging.getLogger(__name__)

P = TypeVar("P")
R = TypeVar("R")


class Tier(enum.IntEnum):
    """When a part closes: holders first (their hand-backs record events and use the
    services), then services, then writers (which write what the others recorded)."""

    HOLDER = 0
    SERVICE = 1
    WRITER = 2


class Connection:
    """What one process keeps for one connection to a cluster: one part of each kind,
    made on first use.

    A part is an instance of a class made with no arguments. It may say its ``tier``
    (default :attr:`Tier.SERVICE`), and have a ``close()`` (let go in order, finishing
    its work: a hand-back, a flush) and a ``drop()`` (let go at once: threads told to
    stop, work discarded).

    Args:
        identity: Which connection (:func:`tpuslice._tpu._ray.connection_identity`);
            ``None`` for a process not connected, whose parts still work where no Ray
            call is needed.
    """

    def __init__(self, identity: bytes | None = None) -> None:
        self.identity = identity
        self.pid = os.getpid()
        self._lock = threading.RLock()  # a part's constructor may ask for another
        self._parts: dict[type[Any], Any] = {}
        self._ended = False

    def part(self, kind: type[P]) -> P:
        """This connection's ``kind()``, made on first use.

        Args:
            kind: A class made with no arguments.

        Returns:
            The one instance of it for this connection.
        """
        with self._lock:
            found = self._parts.get(kind)
            if found is None:
                found = self._parts[kind] = kind()
            return cast(P, found)

    def close(self) -> None:
        """Close every part that has a ``close()``: holders, then services, then writers.
        A part made meanwhile (a hand-back may make the goodput writer) is closed in its
        tier's turn. Idempotent."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
        closed: set[int] = set()
        while (part := self._next_to_close(closed)) is not None:
            closed.add(id(part))
            try:
                part.close()
            except Exception:  # the other parts still close: a failure here is logged
                logger.exception("closing %s failed", type(part).__name__)

    def drop(self) -> None:
        """Let every part go without finishing its work: nothing is handed back or
        written, since this process no longer talks to that cluster."""
        with self._lock:
            self._ended = True
            parts = list(self._parts.values())
        for part in parts:
            if hasattr(part, "drop"):
                part.drop()

    def _next_to_close(self, closed: set[int]) -> Any:
        with self._lock:
            waiting = [
                p for p in self._parts.values() if id(p) not in closed and hasattr(p, "close")
            ]
        return min(waiting, key=lambda p: getattr(p, "tier", Tier.SERVICE), default=None)


class Pool:
    """Threads a part runs work on, in the background. Once Python has stopped its
    executors (at interpreter exit, before the exit hooks run) or the pool was closed,
    work runs on the caller's thread instead, so a hand-back at exit still completes.

    Args:
        workers: How many threads at most.
        name: Their name's prefix.
    """

    def __init__(self, workers: int, name: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)

    def submit(self, fn: Callable[..., R], *args: Any) -> Future[R]:
        """Run ``fn(*args)`` in the background, or here if no thread may.

        Args:
            fn: The work.
            *args: Its arguments.

        Returns:
            Its future (already done when it ran here).
        """
        try:
            return self._executor.submit(fn, *args)
        except RuntimeError:  # the executor is shut down: the work is still wanted
            done: Future[R] = Future()
            try:
                done.set_result(fn(*args))
            except Exception as exc:  # noqa: BLE001  (the future carries it, as a thread's would)
                done.set_exception(exc)
            return done

    def close(self) -> None:
        """Finish the work submitted, then stop the threads."""
        self._executor.shutdown(wait=True)

    def drop(self) -> None:
        """Stop the threads; work not started is cancelled."""
        self._executor.shutdown(wait=False, cancel_futures=True)


_current: Connection | None = None
_lock = threading.Lock()


def connection() -> Connection:
    """This process's connection to the cluster it is connected to now (a detached one
    when it is not). A connection made before a reconnection, or in the parent before a
    fork, is let go first (:meth:`Connection.drop`; in a forked child, not touched: its
    threads are the parent's). Never starts Ray.

    Returns:
        The connection.
    """
    global _current
    identity, pid = _ray.connection_identity(), os.getpid()
    current = _current
    if current is not None and current.identity == identity and current.pid == pid:
        return current
    with _lock:
        old = _current
        if old is not None and old.identity == identity and old.pid == pid:
            return old
        current = _current = Connection(identity)
        EXIT_HOOKS.add(close_connection)
    if old is not None and old.pid == pid:
        old.drop()
    return current


def close_connection() -> None:
    """Close this process's connection and forget it: its one-shots are handed back and
    its writers flushed, while it can still call Ray. Called at exit, and by whoever
    disconnects this process (the simulator, the CLI) just before. One that Ray is no
    longer connected through (it reconnected, or disconnected, since) is dropped instead,
    and a forked parent's is left alone, as :func:`connection` would."""
    global _current
    current = _current
    if current is not None and current.pid == os.getpid():
        # Still current while it closes: what its hand-backs record goes to its writers.
        if current.identity == _ray.connection_identity():
            current.close()
        else:
            current.drop()
    with _lock:
        if _current is current:
            _current = None


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # a parent's thread may have held it at the fork


os.register_at_fork(after_in_child=_after_fork_in_child)
