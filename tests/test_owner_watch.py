"""A host agent's watch over its TPU-owner record (agent.OwnerWatch): once the recorded
owner lets go, the record is made again, without anyone asking the host. Pure: no Ray."""

from __future__ import annotations

import threading

from tpuslice._host.agent import OwnerWatch


class Host:
    """A host whose TPU is held by the pids in ``holders``; a refresh records the first
    holder left (or none) back into the watch, as the agent's record does."""

    def __init__(self, *holders: int) -> None:
        self.holders = list(holders)
        self.refreshes = 0
        self.refreshed = threading.Event()
        self.watch = OwnerWatch(lambda pid: pid in self.holders, self.refresh, period=0.01)

    def refresh(self) -> None:
        self.refreshes += 1
        self.watch.watch(self.holders[0] if self.holders else None)
        self.refreshed.set()


def test_an_owner_that_let_go_is_recorded_again() -> None:
    host = Host(4242)
    host.watch.watch(4242)
    assert host.watch.check() is False  # still holds: the record stands
    host.holders.remove(4242)
    assert host.watch.check() is True
    assert host.refreshes == 1
    assert host.watch.check() is False  # recorded free: nothing left to look at


def test_whoever_took_the_tpu_next_is_watched_in_turn() -> None:
    host = Host(4242, 5151)
    host.watch.watch(4242)
    host.holders.remove(4242)
    assert host.watch.check() is True  # records 5151
    assert host.watch.check() is False
    host.holders.remove(5151)
    assert host.watch.check() is True
    assert host.refreshes == 2


def test_a_record_made_while_looking_is_not_overwritten() -> None:
    """The agent records a new owner between the look and the refresh: that record is
    the current one, and the stale look must not replace it."""
    host = Host()
    watch = OwnerWatch(lambda pid: watch.watch(7777) or False, host.refresh, period=0.01)
    watch.watch(4242)
    assert watch.check() is False
    assert host.refreshes == 0


def test_nothing_is_looked_at_while_no_owner_is_recorded() -> None:
    looked: list[int] = []
    watch = OwnerWatch(lambda pid: looked.append(pid) or True, lambda: None, period=0.01)
    watch.watch(None)
    assert watch.check() is False
    assert looked == []


def test_the_watch_thread_notices_an_exit_by_itself() -> None:
    host = Host(4242)
    host.watch.watch(4242)
    host.holders.clear()
    assert host.refreshed.wait(timeout=10)  # bounded: the thread looks every 10 ms
    assert host.refreshes == 1
