"""A host agent's hand-back check (HostAgent.release) over scripted owners: no Ray, no
processes signalled for real."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from tpuslice._host import agent
from tpuslice._host.tpu_lock import TPUOwner


class Watched(list[int | None]):
    """Stands in for the agent's OwnerWatch: the owners it was told are recorded."""

    def watch(self, pid: int | None) -> None:
        self.append(pid)


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[agent.HostAgent, list[object]]]:
    """An agent whose owner scan, signals and records are scripted."""
    seen: list[object] = []
    monkeypatch.setattr(agent._ray, "kv_put", lambda k, v, ns: seen.append(("put", k)))
    monkeypatch.setattr(agent._ray, "kv_delete", lambda k, ns: seen.append(("delete", k)))
    monkeypatch.setattr(agent, "_signal", lambda pid, sig: seen.append(("signal", pid, sig)))
    found = agent.HostAgent.__new__(agent.HostAgent)
    found.node_id, found.root = "n1", Path("/nonexistent")
    found._record_lock, found._records, found._stored_free = threading.Lock(), 0, False
    found._free_key = agent.FreeKey(lambda: None, lambda: None)
    found._owner_watch = Watched()
    yield found, seen


def script(monkeypatch: pytest.MonkeyPatch, owners: list[TPUOwner | None]) -> None:
    answers = iter(owners)
    monkeypatch.setattr(agent, "find_owner", lambda root, among=None: next(answers))


def test_an_owner_that_is_exiting_is_waited_for_not_recorded_as_someone_elses(
    host: tuple[agent.HostAgent, list[object]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker killed a moment ago still holds the lock while it exits, with no command
    line and no environment left to tell whose it is."""
    exiting = TPUOwner(4242, "", None, 0, True)
    script(monkeypatch, [exiting, exiting, None])
    found, seen = host
    assert found.release("01000000", [], grace_s=1.0, timeout_s=10.0) is None
    assert seen == [("delete", "tpu-owner/n1")]  # no signal, and the host recorded free


def test_someone_elses_owner_is_recorded_and_left_running(
    host: tuple[agent.HostAgent, list[object]], monkeypatch: pytest.MonkeyPatch
) -> None:
    notebook = TPUOwner(4343, "python notebook.py", None, 0, True)
    script(monkeypatch, [notebook, notebook])  # looked at twice, then left be
    found, seen = host
    assert found.release("01000000", [], grace_s=1.0, timeout_s=10.0) == notebook.to_dict()
    assert seen == [("put", "tpu-owner/n1")]
    assert found._owner_watch == [4343]  # watched from now on, so its exit is noticed


def test_a_killed_worker_that_lost_its_environment_first_is_looked_at_again(
    host: tuple[agent.HostAgent, list[object]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its command line still reads, its job no longer does: it seems someone else's for
    one look, and is gone at the next."""
    dying = TPUOwner(4444, "ray::train", None, 0, True)
    script(monkeypatch, [dying, None])
    found, seen = host
    assert found.release("01000000", [], grace_s=1.0, timeout_s=10.0) is None
    assert seen == [("delete", "tpu-owner/n1")]


def test_an_idle_worker_of_no_named_job_that_owns_the_tpu_is_stopped(
    host: tuple[agent.HostAgent, list[object]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker Ray started before the job used it names no job in its environment, and
    a take-back knows no pids: an idle Ray worker owning the TPU of work being handed back
    ran that work, so it is stopped (SIGTERM), and the host recorded free once it exits."""
    prestarted = TPUOwner(4545, "ray::IDLE", "ffffffff", 0, True)
    script(monkeypatch, [prestarted, None])
    found, seen = host
    assert found.release("01000000", [], grace_s=1.0, timeout_s=10.0) is None
    assert seen[0] == ("signal", 4545, agent.signal.SIGTERM)
    assert seen[-1] == ("delete", "tpu-owner/n1")


def test_a_signalled_owner_is_waited_for_after_its_exit_unlinks_the_lockfile(
    host: tuple[agent.HostAgent, list[object]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """At a normal exit libtpu unlinks its lockfile before the process has closed the
    devices; a worker whose pid was not reported is then found only by its devices, so
    the agent looks for it among the processes it signalled until it has exited."""
    worker = TPUOwner(4646, "ray::IDLE", "01000000", 0, True)
    exiting = TPUOwner(4646, "ray::IDLE", "01000000", 0, False)
    looks: list[set[int]] = []

    def find_owner(root: Path, among: Iterable[int] | None = None) -> TPUOwner | None:
        looks.append(set(among or ()))
        if len(looks) == 1:
            return worker  # the lock's holder: found without any pid
        return exiting if 4646 in looks[-1] and len(looks) < 4 else None

    monkeypatch.setattr(agent, "find_owner", find_owner)
    found, seen = host
    assert found.release("01000000", [], grace_s=10.0, timeout_s=10.0) is None
    assert [s for s in seen if s[0] == "signal"] == [("signal", 4646, agent.signal.SIGTERM)] * 3
    assert looks[0] == set() and all(4646 in among for among in looks[1:])
    assert len(looks) == 4  # the lock gone, it was looked for until its devices closed
