"""What one process keeps while connected (threads, actor handles, caches, writers), owned
in one place and closed in one order: at exit (a hook added after ``import ray``, so before
Ray's ``shutdown``) and before a disconnect. A reconnection or fork drops the old one."""

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
    """When a part closes: holders (their hand-backs use the services), then services,
    then writers (which write what the others recorded)."""

    HOLDER = 0
    SERVICE = 1
    WRITER = 2


class Connection:
    """One part of each kind (a class made with no arguments), made on first use; a part
    may have a ``tier``, a ``close()`` (finish its work) and a ``drop()`` (stop at once)."""

    def __init__(self, identity: bytes | None = None) -> None:
        self.identity = identity
        self.pid = os.getpid()
        self._lock = threading.RLock()  # a part's constructor may ask for another
        self._parts: dict[type[Any], Any] = {}
        self._ended = False

    def part(self, kind: type[P]) -> P:
        """This connection's one ``kind()``, made on first use."""
        with self._lock:
            found = self._parts.get(kind)
            if found is None:
                found = self._parts[kind] = kind()
            return cast(P, found)

    def close(self) -> None:
        """Close every part that has a ``close()``, by tier (a part made meanwhile too)."""
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
        """Let every part go unfinished: this process no longer talks to that cluster."""
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
    """Up to ``workers`` threads for a part; once Python stopped its executors (at exit, before
    the hooks) or the pool closed, work runs here, so a hand-back at exit still completes."""

    def __init__(self, workers: int, name: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)

    def submit(self, fn: Callable[..., R], *args: Any) -> Future[R]:
        """Run ``fn(*args)`` in the background, or here if no thread may; its future."""
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
    """This process's connection now (a detached one when not connected); an older one is
    dropped, unless a forked parent's (its threads are not ours). Never starts Ray."""
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
    """Close and forget this process's connection while Ray still works (at exit, before a
    disconnect); one Ray no longer talks through is dropped, a forked parent's left alone."""
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
