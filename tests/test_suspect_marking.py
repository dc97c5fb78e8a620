"""Marking hosts suspect, pure: the hosts a failed resilient attempt blames (a hang, a host
lost with no notice, a crashed worker), the retry that goes elsewhere, and the log and
timeline of marking and clearing."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pytest
from ray import exceptions as rex

from test_suspects import Store, blame
from tpuslice._host.heartbeats import BEAT_ENV
from tpuslice._host.notices import Notice
from tpuslice._host.suspects import DEFAULT_COOLDOWN_S, Blame, SuspectReason
from tpuslice._reserve import claim
from tpuslice._reserve import suspects as marking
from tpuslice._reserve.request import SliceRequest
from tpuslice._run.observe import Outcome
from tpuslice._run.resilient import (
    GangBrokenError,
    ResilientRun,
    RetryPolicy,
    judged,
    pinned_on_host,
    watched,
)
from tpuslice._run.watchdog import CHECK_S, AttemptWatch, WatchConfig
from tpuslice._tpu.clock import Clock
from tpuslice._view.cluster import HostInfo, SliceState
from tpuslice.record import events
from tpuslice.testing.memory import InMemoryCluster

HANG, HOST_FAILURE = SuspectReason.HANG, SuspectReason.HOST_FAILURE


def test_marking_logs_and_records_each_host_and_never_raises(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    recorded: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(events, "record", lambda kind, **f: recorded.append((kind, f)))
    with caplog.at_level(logging.WARNING, logger="tpuslice._reserve.suspects"):
        assert marking.mark_suspects([blame("n1")]) == []  # Ray is not connected
    assert "could not mark v4-16-a host 1 suspect (hang)" in caplog.text
    assert recorded == []
    store = Store(monkeypatch)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tpuslice._reserve.suspects"):
        (record,) = marking.mark_suspects([blame("node-1", evidence="rank 1 silent: 60 s")])
    assert "v4-16-a host 1 (node node-1) is suspect for 10 min, after a hang" in caplog.text
    kind, fields = recorded[-1]
    assert kind == "suspect" and fields["slices"] == ("v4-16-a",)
    assert fields["outcome"] == "hang" and fields["seconds"] == DEFAULT_COOLDOWN_S
    assert fields["detail"] == "host 1 (node node-1): rank 1 silent: 60 s"
    assert marking.clear_slice("v4-16-a", "health check passed") == [record]
    assert recorded[-1] == (
        "cleared",
        {"slices": ("v4-16-a",), "detail": "host(s) 1 trusted again: health check passed"},
    )
    assert store.data == {}


def test_the_timeline_has_kinds_for_marking_and_clearing() -> None:
    assert {"suspect", "cleared"} <= set(events.KINDS)
    event = events.SliceEvent(
        0.0, "suspect", ("v4-16-a",), seconds=600.0, outcome="hang", detail="host 1"
    )
    assert event.describe() == "suspect v4-16-a for 600.0 s: hang; host 1"


# --- blame from a resilient attempt -------------------------------------------------------


def hosts_of(cluster: InMemoryCluster, slice_name: str) -> list[HostInfo]:
    return list(cluster.snapshot(1).slices[slice_name].hosts.values())


class Beats:
    """The KV store as a gang's watch reads it: heartbeats, no notices, a wall clock."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.beats: dict[str, bytes] = {}
        self.dead: set[str] = set()
        self.notices: dict[str, Notice] = {}

    def watch(self, hosts: Sequence[HostInfo], config: WatchConfig) -> AttemptWatch:
        return AttemptWatch(
            config,
            [h.node_id for h in hosts],
            [f"rank {r} ({h.slice_name} host {h.worker_id})" for r, h in enumerate(hosts)],
            lambda notice: None,
            read_notices=lambda nodes: {n: self.notices[n] for n in nodes if n in self.notices},
            read_beats=lambda keys: {k: self.beats[k] for k in keys if k in self.beats},
            forget=lambda prefix: None,
            clock=lambda: self.now,
            hosts=hosts,
            read_dead=lambda nodes: self.dead & set(nodes),
        )

    def beat(self, watch: AttemptWatch, ranks: Sequence[int], at: float) -> None:
        for rank in ranks:
            self.beats[watch.rank_env(rank)[BEAT_ENV]] = str(at).encode()


def test_a_hang_blames_the_silent_hosts_once_each() -> None:
    cluster = InMemoryCluster([("v4", "2x2x2", 1)])
    world = Beats()
    hosts = hosts_of(cluster, "v4-16-0")
    watch = world.watch(hosts, WatchConfig(heartbeat_timeout_s=5.0))
    world.beat(watch, [0, 1], 1000.0)
    world.now += 10
    world.beat(watch, [0], 1009.0)
    with pytest.raises(GangBrokenError) as raised:
        watched(watch)
    (blamed,) = raised.value.blamed
    assert (blamed.node_id, blamed.slice_name, blamed.worker_id, blamed.reason) == (
        hosts[1].node_id,
        "v4-16-0",
        1,
        HANG,
    )
    assert blamed.evidence.startswith("rank 1 (v4-16-0 host 1) silent: 1 rank(s) silent")
    assert [b.worker_id for b in watch.blame([0, 0, 1], HANG, "x")] == [0, 1]


def test_a_host_lost_without_notice_is_blamed_on_the_hosts_ray_sees_dead() -> None:
    cluster = InMemoryCluster([("v4", "2x2x2", 1)])
    world = Beats()
    hosts = hosts_of(cluster, "v4-16-0")
    watch = world.watch(hosts, WatchConfig())
    lost = GangBrokenError(Outcome.HOST_FAILURE, "rank 0 (v4-16-0 host 0): ActorDiedError")
    assert judged(lost, watch).blamed == ()  # nobody dead yet: nobody to blame
    world.dead = {hosts[1].node_id}
    (blamed,) = judged(lost, watch).blamed
    assert (blamed.worker_id, blamed.reason) == (1, HOST_FAILURE)
    assert blamed.evidence == (
        "rank 1 (v4-16-0 host 1) died with no notice: rank 0 (v4-16-0 host 0): ActorDiedError"
    )
    world.notices = {hosts[1].node_id: Notice("preemption", "TRUE", 990.0, 1020.0)}
    preempted = judged(lost, watch)
    assert preempted.outcome is Outcome.PREEMPTION and preempted.blamed == ()


def test_a_failure_pinned_on_a_host_keeps_its_blame_unless_a_notice_explains_it() -> None:
    cluster = InMemoryCluster([("v4", "2x2x2", 1)])
    world = Beats()
    hosts = hosts_of(cluster, "v4-16-0")
    watch = world.watch(hosts, WatchConfig())
    crash = Blame(hosts[0].node_id, "v4-16-0", 0, SuspectReason.WORKER_CRASH, "crashed")
    broken = GangBrokenError(Outcome.HOST_FAILURE, "crashed", blamed=(crash,))
    world.dead = {hosts[1].node_id}  # pinned by the error: the dead list is not needed
    assert judged(broken, watch).blamed == (crash,)


def test_only_a_tasks_own_crash_or_node_death_pins_its_host() -> None:
    assert pinned_on_host(rex.WorkerCrashedError()) is SuspectReason.WORKER_CRASH
    assert pinned_on_host(rex.NodeDiedError("node 1a2b died")) is HOST_FAILURE
    # A gang's task is sent to its rank's host: Ray cannot schedule it once that node died.
    assert pinned_on_host(rex.TaskUnschedulableError("node 1a2b is dead")) is HOST_FAILURE
    wrapped = rex.RayTaskError("f", "tb", rex.WorkerCrashedError(), "ray::f", 1, "10.0.0.1")
    for exc in (rex.TaskCancelledError(), rex.ActorDiedError(), wrapped, ValueError("x")):
        assert pinned_on_host(exc) is None


class Held:
    """A reservation of an in-memory cluster as the loop holds it, its hosts known."""

    def __init__(self, cluster: InMemoryCluster, request: SliceRequest, log: list[str]) -> None:
        clock = Clock(cluster.clock.now, cluster.clock.sleep, cluster.clock.stamp)
        reservation = claim.Reserver(request, clock=clock, ops=cluster).run()
        self.cluster, self.log = cluster, log
        self.slice_names = [c.slice_name for c in reservation.claims]
        self.hosts = [h for c in reservation.claims for h in c.target.hosts.values()]
        self.num_hosts = len(self.hosts)

    def __enter__(self) -> Held:
        self.log.append(f"hold {self.slice_names[0]}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.log.append(f"release {self.slice_names[0]}")
        for group in self.cluster.live_groups("reserver"):
            self.cluster.remove_group(group)


def test_a_retry_after_a_hang_goes_to_another_slice() -> None:
    """Attempt 1 hangs on host 1 of the first slice: that host is marked suspect before
    the slice is given back, and attempt 2 runs on the other slice, though the first is
    idle again."""
    cluster = InMemoryCluster([("v4", "2x2x2", 2)])
    world = Beats()
    log: list[str] = []

    def body(spg: Held, watch: AttemptWatch) -> list[str]:
        log.append(f"run {spg.slice_names[0]}")
        if len(cluster.suspects) == 0:
            world.beat(watch, [0, 1], world.now)
            world.now += 10 + CHECK_S
            world.beat(watch, [0], world.now)
            watched(watch)
        return ["ok"]

    def mark(blames: Sequence[Blame]) -> object:
        log.append("mark " + ", ".join(f"{b.slice_name}/{b.worker_id}" for b in blames))
        return cluster.mark_suspects(blames)

    run = ResilientRun(
        body,  # type: ignore[arg-type]
        SliceRequest(topology="2x2x2", accelerator_version="v4"),
        RetryPolicy(max_retries_hang=1),
        clock=Clock(cluster.clock.now, cluster.clock.sleep, cluster.clock.stamp),
        reserve=lambda r: Held(cluster, r, log),  # type: ignore[arg-type,return-value]
        watching=WatchConfig(heartbeat_timeout_s=5.0),
        make_watch=lambda config, spg, event: world.watch(spg.hosts, config),  # type: ignore[attr-defined]
        mark=mark,
    )
    assert run.until_done() == ["ok"]
    assert log == [
        "hold v4-16-0", "run v4-16-0", "mark v4-16-0/1", "release v4-16-0",
        "hold v4-16-1", "run v4-16-1", "release v4-16-1",
    ]  # fmt: skip
    assert run.history[0].outcome == Outcome.HANG
    assert cluster.snapshot(1).slices["v4-16-0"].state is SliceState.SUSPECT
