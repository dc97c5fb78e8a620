"""The driver's connection (``tpuslice._tpu._connection``): one part of each kind, closed
in tiers, let go on a reconnection or in a forked child. Pure: which connection Ray has
is replaced by a value the test sets."""

from __future__ import annotations

import os
import threading
from typing import ClassVar

import pytest

from tpuslice._run.run import Releaser
from tpuslice._tpu import _connection
from tpuslice._tpu._connection import Connection, Pool, Tier, close_connection, connection
from tpuslice.record.events import EventWriter

LOG: list[str] = []
"""What the parts below did, in order."""


class Holder:
    tier = Tier.HOLDER

    def close(self) -> None:
        LOG.append("holder closed")

    def drop(self) -> None:
        LOG.append("holder dropped")


class Service:
    def close(self) -> None:
        LOG.append("service closed")


class Writer:
    tier = Tier.WRITER

    def close(self) -> None:
        LOG.append("writer closed")


class LateWriter(Writer):
    def close(self) -> None:
        LOG.append("late writer closed")


class RecordingHolder(Holder):
    """Its close makes a writer, as a hand-back makes the goodput writer."""

    def close(self) -> None:
        LOG.append("holder closed")
        connection().part(LateWriter)


class Counted:
    made: ClassVar[int] = 0

    def __init__(self) -> None:
        Counted.made += 1


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    LOG.clear()
    monkeypatch.setattr(_connection._ray, "connection_identity", lambda: b"first")
    monkeypatch.setattr(_connection, "_current", None)


def test_each_kind_is_made_once_per_connection_even_when_asked_at_once() -> None:
    Counted.made = 0
    own = Connection()
    found: list[Counted] = []
    askers = [threading.Thread(target=lambda: found.append(own.part(Counted))) for _ in range(8)]
    for asker in askers:
        asker.start()
    for asker in askers:
        asker.join(timeout=10)
    assert Counted.made == 1 and len(found) == 8 and all(f is found[0] for f in found)
    assert Connection().part(Counted) is not found[0]


def test_holders_close_first_then_services_then_writers_whatever_the_order_made() -> None:
    own = Connection()
    for kind in (Writer, Service, Holder, Counted):  # Counted has no close: left alone
        own.part(kind)
    own.close()
    assert LOG == ["holder closed", "service closed", "writer closed"]


def test_a_part_made_while_closing_is_closed_in_its_tier_s_turn() -> None:
    own = connection()
    own.part(Writer)
    own.part(RecordingHolder)
    close_connection()
    assert LOG == ["holder closed", "writer closed", "late writer closed"]
    assert _connection._current is None


def test_closing_twice_closes_once() -> None:
    own = Connection()
    own.part(Holder)
    own.close()
    own.close()
    assert LOG == ["holder closed"]


def test_a_reconnection_drops_the_old_connection_and_hands_nothing_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    old = connection()
    old.part(Holder)
    assert connection() is old
    monkeypatch.setattr(_connection._ray, "connection_identity", lambda: b"second")
    new = connection()
    assert new is not old and new.identity == b"second"
    assert LOG == ["holder dropped"]
    close_connection()
    assert LOG == ["holder dropped"]  # the new one had no part


def test_a_connection_closed_after_ray_reconnected_is_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    connection().part(Holder)
    monkeypatch.setattr(_connection._ray, "connection_identity", lambda: None)  # disconnected
    close_connection()
    assert LOG == ["holder dropped"]


def test_a_forked_child_gets_a_connection_and_writer_of_its_own() -> None:
    parent = connection()
    parent.part(Holder)
    parent_writer = parent.part(EventWriter)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: report, and never return into pytest
        try:
            own = connection()
            writer = own.part(EventWriter)
            close_connection()  # at exit: not the parent's parts
            fine = own is not parent and writer.writer != parent_writer.writer and LOG == []
            os.write(write, b"ok" if fine else repr(LOG).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        said = answer.read()
    os.waitpid(child, 0)
    assert said == b"ok"
    assert connection() is parent and LOG == []


def test_a_pool_runs_work_here_once_its_threads_are_stopped() -> None:
    pool = Pool(1, "test-pool")
    assert pool.submit(threading.current_thread).result(timeout=5) is not threading.current_thread()
    pool.close()  # as Python does to every executor at interpreter exit
    here = pool.submit(threading.current_thread)
    assert here.done() and here.result() is threading.current_thread()
    failed = pool.submit(int, "not a number")
    assert isinstance(failed.exception(), ValueError)


def test_a_dropped_releaser_stops_its_thread_and_hands_nothing_back() -> None:
    class Group:
        slice_names = ("s",)

        def shutdown(self) -> None:
            LOG.append("handed back")

    releaser = Releaser()
    releaser.release_when_done([], Group())  # type: ignore[arg-type]
    thread = releaser._thread
    assert thread is not None
    releaser.drop()
    thread.join(timeout=10)
    assert not thread.is_alive() and LOG == []


def test_the_releaser_takes_new_one_shots_without_waiting_when_none_came() -> None:
    releaser = Releaser()
    releaser._take_new(block=False)  # nothing queued: nothing taken, no error
    job = object()
    releaser._queue.put(job)  # type: ignore[arg-type]
    releaser._queue.put(None)  # a wake-up only
    releaser._take_new(block=False)
    assert releaser.pending == [job]
