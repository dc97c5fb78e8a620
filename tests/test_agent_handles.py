"""The driver's handles to the host agents (``Agents``): looked up at once, one per host.
Pure: Ray's named-actor lookup is replaced by a fake that records its callers."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tpuslice._reserve.queue import agents as agent


class FakeLookups:
    """``ray.get_actor`` for agents that exist: each lookup waits at a barrier, so lookups
    made one after another would never meet there."""

    def __init__(self, meet: int) -> None:
        self.barrier = threading.Barrier(meet, timeout=10)
        self.looked_up: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, name: str, namespace: str) -> Any:
        with self.lock:
            self.looked_up.append(name)
        self.barrier.wait()
        return f"handle of {name}"


def test_the_hosts_of_a_reservation_are_looked_up_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nodes = [f"node{i}" for i in range(3)]
    lookups = FakeLookups(meet=3)  # breaks (and the test fails) unless all three wait at once
    monkeypatch.setattr(agent.ray, "get_actor", lookups)
    found = agent.Agents().handles(nodes)
    assert found == {n: f"handle of {agent.NAME_PREFIX}{n}" for n in nodes}
    assert sorted(lookups.looked_up) == sorted(agent.NAME_PREFIX + n for n in nodes)


def test_callers_at_once_share_one_lookup_per_host_and_later_calls_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lookups = FakeLookups(meet=2)
    monkeypatch.setattr(agent.ray, "get_actor", lookups)
    agents = agent.Agents()
    results: list[dict[str, Any]] = []
    callers = [
        threading.Thread(target=lambda: results.append(agents.handles(["a", "b", "a"])))
        for _ in range(4)
    ]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(timeout=30)
    assert len(results) == 4 and all(r == results[0] for r in results)
    assert sorted(lookups.looked_up) == [agent.NAME_PREFIX + "a", agent.NAME_PREFIX + "b"]
    assert agents.handles(["b"]) == {"b": results[0]["b"]}
    assert len(lookups.looked_up) == 2  # cached: no new lookup
    agents.forget("b")
    lookups.barrier = threading.Barrier(1)
    agents.handles(["b"])
    assert lookups.looked_up.count(agent.NAME_PREFIX + "b") == 2  # forgotten: found again


def test_at_exit_the_lookups_run_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """At interpreter exit Python's executors take no work: a hand-back then still finds
    its hosts' agents, one after another."""

    class Stopped(agent.ThreadPoolExecutor):
        def submit(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("cannot schedule new futures after interpreter shutdown")

    monkeypatch.setattr(agent, "ThreadPoolExecutor", Stopped)
    monkeypatch.setattr(agent.ray, "get_actor", lambda name, namespace: f"handle of {name}")
    found = agent.Agents().handles(["a", "b"])
    assert found == {n: f"handle of {agent.NAME_PREFIX}{n}" for n in ("a", "b")}
