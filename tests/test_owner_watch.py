"""A host agent's watch over its TPU-owner record (agent.OwnerWatch): once the recorded
owner lets go, the record is made again, without anyone asking the host. Pure: no Ray."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from tpuslice._host import agent
from tpuslice._host.agent import OwnerWatch
from tpuslice._host.tpu_lock import TPUOwner
from tpuslice._reserve.queue import agents as client
from tpuslice._tpu._connection import connection
from tpuslice._view import agents as view


@pytest.fixture(autouse=True)
def hourly(monkeypatch: pytest.MonkeyPatch) -> None:
    """The watch's own thread looks once a period: an hour keeps it out of the tests that
    look by hand, which would otherwise race it."""
    monkeypatch.setattr(agent, "OWNER_RECHECK_S", 3600.0)


class Host:
    """A host whose TPU is held by the pids in ``holders``; a refresh records the first
    holder left (or none) back into the watch, as the agent's record does."""

    def __init__(self, *holders: int) -> None:
        self.holders = list(holders)
        self.refreshes = 0
        self.refreshed = threading.Event()
        self.watch = OwnerWatch(lambda pid: pid in self.holders, self.refresh)

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
    watch = OwnerWatch(lambda pid: watch.watch(7777) or False, host.refresh)
    watch.watch(4242)
    assert watch.check() is False
    assert host.refreshes == 0


def test_nothing_is_looked_at_while_no_owner_is_recorded() -> None:
    looked: list[int] = []
    watch = OwnerWatch(lambda pid: looked.append(pid) or True, lambda: None)
    watch.watch(None)
    assert watch.check() is False
    assert looked == []


def test_the_watch_thread_notices_an_exit_by_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent, "OWNER_RECHECK_S", 0.01)
    host = Host(4242)
    host.watch.watch(4242)
    host.holders.clear()
    assert host.refreshed.wait(timeout=10)  # bounded: the thread looks every 10 ms
    assert host.refreshes == 1


# --- the agent's records -------------------------------------------------------------------


@pytest.fixture
def host_agent(monkeypatch: pytest.MonkeyPatch) -> tuple[agent.HostAgent, list[object]]:
    """An agent with Ray's KV store scripted; its watch looks only when told to."""
    seen: list[object] = []
    monkeypatch.setattr(agent._ray, "kv_put", lambda k, v, ns: seen.append(("put", v)))
    monkeypatch.setattr(agent._ray, "kv_delete", lambda k, ns: seen.append(("delete",)))
    found = agent.HostAgent.__new__(agent.HostAgent)
    found.node_id, found.root = "n1", Path("/nonexistent")
    found._record_lock, found._records, found._stored_free = threading.Lock(), 0, False
    found._free_key = agent.FreeKey(lambda: None, lambda: None)
    found._owner_watch = OwnerWatch(lambda pid: False, found._refresh)
    return found, seen


def test_a_refresh_leaves_a_record_made_while_it_looked(
    host_agent: tuple[agent.HostAgent, list[object]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watch finds the TPU free, but while it looked a reservation's probe recorded a
    new owner: that record stands (the stale finding is dropped)."""
    found, seen = host_agent
    newer = TPUOwner(5151, "python train.py", None, 0, True)

    def scan(root: Path, among: object = None) -> None:
        found._record(newer)  # the actor's method, between the look and the write
        return None

    monkeypatch.setattr(agent, "find_owner", scan)
    found._refresh()
    assert [entry[0] for entry in seen] == ["put"]
    assert json.loads(seen[0][1])["pid"] == 5151  # type: ignore[index]


def test_a_refresh_searches_every_process_and_records_what_it_finds(
    host_agent: tuple[agent.HostAgent, list[object]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An owner that bypassed libtpu's lock is found only by searching every process's
    descriptors; the refresh does, so such an owner is not recorded as gone."""
    found, seen = host_agent
    bypasser = TPUOwner(6262, "python raw.py", None, 0, False)
    asked: list[object] = []

    def scan(root: Path, among: object = None) -> TPUOwner:
        asked.append(among)
        return bypasser

    monkeypatch.setattr(agent, "find_owner", scan)
    found._refresh()
    assert asked == [None]
    assert json.loads(seen[0][1])["pid"] == 6262  # type: ignore[index]


def test_a_new_agent_watches_the_owner_an_earlier_one_recorded(
    host_agent: tuple[agent.HostAgent, list[object]], monkeypatch: pytest.MonkeyPatch
) -> None:
    found, _ = host_agent
    watched: list[int | None] = []
    monkeypatch.setattr(found._owner_watch, "watch", watched.append)
    stored = json.dumps({"pid": 4242, "command": "python notebook.py"}).encode()
    monkeypatch.setattr(agent._ray, "kv_get", lambda key, ns: stored)
    found._watch_recorded()
    assert watched == [4242]


def test_a_free_tpu_found_again_is_not_deleted_again(
    host_agent: tuple[agent.HostAgent, list[object]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each reservation's probe asks the agent; a TPU free again costs no second delete,
    but a free TPU after an owner's record deletes that record."""
    found, seen = host_agent
    monkeypatch.setattr(agent._ray, "kv_get", lambda key, ns: None)
    found._watch_recorded()  # a new agent: no record stored
    assert found._record(None) is None
    assert found._record(None) is None
    assert seen == []
    owner = TPUOwner(7373, "python train.py", None, 0, True)
    found._record(owner)
    found._record(None)
    found._record(None)
    assert [entry[0] for entry in seen] == ["put", "delete"]


def test_a_new_agent_deletes_an_earlier_agents_record_once_the_tpu_is_free(
    host_agent: tuple[agent.HostAgent, list[object]], monkeypatch: pytest.MonkeyPatch
) -> None:
    found, seen = host_agent
    stored = json.dumps({"pid": 4242, "command": "python notebook.py"}).encode()
    monkeypatch.setattr(agent._ray, "kv_get", lambda key, ns: stored)
    found._watch_recorded()
    found._record(None)
    found._record(None)
    assert seen == [("delete",)]


# --- the free key: a host vouched free without being asked ------------------------------


class Keys:
    """Writes of one host's free key, on a clock the test moves."""

    def __init__(self) -> None:
        self.writes: list[str] = []
        self.now = 1000.0

    def key(self) -> agent.FreeKey:
        return agent.FreeKey(
            lambda: self.writes.append("show"),
            lambda: self.writes.append("hide"),
            clock=lambda: self.now,
        )


def test_the_free_key_is_written_once_per_change_and_first_whatever_it_says() -> None:
    """Unknown at first (an earlier agent may have left it either way): the first finding
    is written; a finding repeated every half second costs nothing."""
    keys = Keys()
    key = keys.key()
    for free in (False, False, True, True, True, False):
        key.set(free)
    assert keys.writes == ["hide", "show", "hide"]


def test_a_free_key_is_put_again_now_and_then_while_the_tpu_stays_free() -> None:
    """A key lost while the TPU stays free (a GCS restarted without its store) must come
    back without a change to trigger it; a hidden key is not deleted again."""
    keys = Keys()
    key = keys.key()
    key.set(True)
    keys.now += agent.FREE_RENEW_S / 2
    key.set(True)
    assert keys.writes == ["show"]
    keys.now += agent.FREE_RENEW_S / 2
    key.set(True)
    assert keys.writes == ["show", "show"]
    key.set(False)
    keys.now += 3 * agent.FREE_RENEW_S
    key.set(False)
    assert keys.writes == ["show", "show", "hide"]


def test_a_look_at_the_lock_shows_the_key_while_free_and_hides_it_once_held(
    host_agent: tuple[agent.HostAgent, list[object]], monkeypatch: pytest.MonkeyPatch
) -> None:
    found, seen = host_agent
    keys = Keys()
    found._free_key = keys.key()
    found._stored_free = True
    holder: list[int | None] = [None]
    monkeypatch.setattr(agent, "lock_holder", lambda root: holder[0])
    found.look_at_lock()
    found.look_at_lock()
    holder[0] = 4242  # a process outside Ray takes the TPU
    found.look_at_lock()
    assert keys.writes == ["show", "hide"]
    assert seen == []  # the holder is not recorded: the next reservation asks, and records


def test_no_look_at_the_lock_while_an_owner_is_recorded(
    host_agent: tuple[agent.HostAgent, list[object]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An owner that bypassed libtpu's lock leaves the lock free: the key must stay gone
    until the owner watch finds the TPU free again."""
    found, _ = host_agent
    keys = Keys()
    found._free_key = keys.key()
    owner = TPUOwner(6262, "python raw.py", None, 0, False)
    found._record(owner)
    monkeypatch.setattr(agent, "lock_holder", lambda root: None)
    found.look_at_lock()
    assert keys.writes == ["hide"]
    found._record(None)  # the owner watch, once it let go
    assert keys.writes == ["hide", "show"]


def test_the_cluster_read_lists_the_free_keys_without_reading_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One listing for every host record; only the owner, notice and suspect records are
    read, so a cluster with only free keys still costs one call."""
    owner = TPUOwner(7373, "python train.py", None, 0, True)
    store = {
        "tpu-free/n1": b"1",
        "tpu-free/n2": b"1",
        "tpu-owner/n3": json.dumps(owner.to_dict()).encode(),
    }
    read: list[list[str]] = []

    def get_many(keys: list[str], ns: str) -> dict[str, bytes]:
        read.append(list(keys))
        return {k: store[k] for k in keys}

    monkeypatch.setattr(agent._ray, "kv_list", lambda prefix, ns: sorted(store))
    monkeypatch.setattr(agent._ray, "kv_get_many", get_many)
    notes = view.recorded_notes()
    assert notes.seen_free == {"n1", "n2"}
    assert set(notes.owners) == {"n3"}
    assert read == [["tpu-owner/n3"]]
    # Their agents wrote the keys, so they are up: an ask of one is waited for.
    agents = connection().part(client.Agents)
    assert agents.is_up("n1") and agents.is_up("n2")
