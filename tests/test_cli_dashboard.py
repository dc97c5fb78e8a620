"""``tpuslice dashboard`` without a cluster: ``state_dict`` on in-memory snapshots (every
slice and host with its label, holders, the queue, teams, runs and the timeline, all
JSON-ready), the ``Picture`` cache on a fake clock (one read per interval and per crowd of
askers, a failed or hung read served as disconnected and retried), the page's filter check,
and every route through aiohttp's test client with a fake read."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import socket
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import psutil
import pytest
from aiohttp.test_utils import TestClient, TestServer

from tpuslice._host.notices import Notice
from tpuslice._view.cluster import ClusterSnapshot
from tpuslice._view.holders import Holder
from tpuslice._view.queue_record import QueuedRequest, QueueRecord
from tpuslice._view.quotas import Quotas, TenantQuota
from tpuslice.cli import dashboard
from tpuslice.cli.dashboard import (
    Picture,
    check_filters,
    dashboard_command,
    make_app,
    serve,
    state_dict,
)
from tpuslice.record import goodput
from tpuslice.record.events import SliceEvent
from tpuslice.record.goodput import CATEGORIES, LOST_CAUSES, Account
from tpuslice.testing.memory import InMemoryCluster

T = TypeVar("T")
NOW = 1_750_000_000.0
"""The in-memory cluster's clock when it is read (wall-clock seconds, as a real read)."""
INDEX_HTML = "<!doctype html><title>cluster</title>"
RUN_HTML = "<!doctype html><title>run</title>"


# --- helpers -----------------------------------------------------------------------------


def memory_cluster(count: int = 3) -> InMemoryCluster:
    """``count`` idle v6e 4x4 slices (4 hosts each), named v6e-16-0, -1, ..., at NOW."""
    cluster = InMemoryCluster([("v6e", "4x4", count)], queue=False)
    cluster.clock.t = NOW
    return cluster


def state_of(
    snapshot: ClusterSnapshot,
    *,
    physical: dict[str, dict[int, int]] | None = None,
    holders: dict[str, Holder] | None = None,
    quotas: Quotas | None = None,
    usage: dict[str, float] | None = None,
    accounts: list[Account] | None = None,
    history: list[SliceEvent] | None = None,
) -> dict[str, Any]:
    return state_dict(
        dataclasses.replace(snapshot, quotas=quotas or Quotas()),
        physical or {},
        holders or {},
        usage or {},
        accounts or [],
        history or [],
    )


def slice_of(state: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [s for s in state["slices"] if s["name"] == name]
    return found


def cells(entry: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Worker id -> its cell, over the slice's whole grid."""
    return {cell["worker_id"]: cell for row in entry["grid"] for cell in row}


def holder(slice_name: str, tenant: str, since: float = NOW - 90.0) -> Holder:
    return Holder("h-" + tenant, slice_name, tenant, 1, True, since, "pid 7 on host-a", job="02")


def request(position: int, tenant: str, **fields: Any) -> QueuedRequest:
    defaults: dict[str, Any] = {
        "ticket": f"t{position}",
        "kind": "v6e-16 4x4",
        "count": (1, 1),
        "priority": 0,
        "who": f"pid {position} on host-a",
        "since": NOW - 30.0,
        "position": position,
        "tenant": tenant,
    }
    return QueuedRequest(**{**defaults, **fields})


def account(run_id: str, started_at: float) -> Account:
    return Account(
        run_id=run_id,
        kind="resilient",
        what="1 x v6e 4x4",
        started_at=started_at,
        wall_s=10.0,
        seconds={c: (10.0 if c == "productive" else 0.0) for c in CATEGORIES},
        lost=dict.fromkeys(LOST_CAUSES, 0.0),
        attempts=1,
        outcome="success",
    )


class FakeClock:
    """Monotonic time that moves only when a test moves it."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class CountingRead:
    """A fake cluster read: answers ``{"connected": true, "n": <call number>}``, or raises
    the next of ``errors`` while any are left."""

    def __init__(self, *errors: Exception) -> None:
        self.calls = 0
        self.errors = list(errors)

    def __call__(self) -> dict[str, Any]:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return {"connected": True, "n": self.calls}


@pytest.fixture
def web(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The pages the server serves, as small stand-ins (the real ones are the browser
    test's concern)."""
    (tmp_path / "index.html").write_text(INDEX_HTML)
    (tmp_path / "run.html").write_text(RUN_HTML)
    monkeypatch.setattr(dashboard, "WEB", tmp_path)
    return tmp_path


async def serving(picture: Picture, host: str) -> tuple[asyncio.Task[None], str]:
    """``serve`` (the command's server) for ``picture`` on a free port of ``host``, as a
    task; once it listens (bounded), the task and its URL; serve's own error if it failed."""
    listening = asyncio.Event()
    urls: list[str] = []

    def ready(url: str) -> None:
        urls.append(url)
        listening.set()

    task = asyncio.create_task(serve(make_app(picture), host, 0, ready))
    done, _ = await asyncio.wait(
        [task, asyncio.create_task(listening.wait())],
        timeout=10.0,
        return_when=asyncio.FIRST_COMPLETED,
    )
    if task in done:
        task.result()  # it failed: its error, not an IndexError below
    assert urls, "serve did not listen within 10 s"
    return task, urls[0]


def with_client(picture: Picture, ask: Callable[[TestClient], Awaitable[T]]) -> T:
    """Serve ``make_app(picture)`` on a local port and run ``ask`` against it."""

    async def go() -> T:
        async with TestClient(TestServer(make_app(picture))) as client:
            return await ask(client)

    return asyncio.run(go())


# --- state_dict --------------------------------------------------------------------------


def test_every_slice_and_host_of_an_idle_cluster_is_ready() -> None:
    state = state_of(memory_cluster(3).snapshot(1))
    assert state["connected"] is True and state["error"] is None
    assert state["read_at"] == NOW
    assert [s["name"] for s in state["slices"]] == ["v6e-16-0", "v6e-16-1", "v6e-16-2"]
    assert state["counts"] == {"READY": 3}
    for entry in state["slices"]:
        assert entry["label"] == "READY" and entry["shape"] == "v6e 4x4"
        assert entry["hosts_text"] == "4/4" and entry["tpu_text"] == "16/16"
        assert entry["grid"] == [
            [cells(entry)[0], cells(entry)[1]],
            [cells(entry)[2], cells(entry)[3]],
        ]
        assert {w: c["label"] for w, c in cells(entry).items()} == dict.fromkeys(range(4), "READY")
        assert cells(entry)[2]["node"] == f"{entry['name']}/2"
        assert entry["holder"] is None and entry["subslices"] == []


def test_a_held_slice_is_busy_and_shows_its_holders_tenant_and_time_held() -> None:
    cluster = memory_cluster(2)
    for worker in range(4):
        cluster.take("v6e-16-1", worker, {"TPU": 4})
    held = holder("v6e-16-1", "team-b", since=NOW - 90.0)
    state = state_of(cluster.snapshot(1), holders={"v6e-16-1": held})
    busy = slice_of(state, "v6e-16-1")
    assert busy["label"] == "BUSY" and busy["tpu_text"] == "0/16"
    assert busy["holder"] == {
        "tenant": "team-b",
        "who": "pid 7 on host-a",
        "job": "02",
        "priority": 1,
        "preemptible": True,
        "held_s": 90.0,
    }
    assert {c["label"] for c in cells(busy).values()} == {"BUSY"}
    assert slice_of(state, "v6e-16-0")["holder"] is None
    assert state["counts"] == {"READY": 1, "BUSY": 1}


def test_a_holder_since_after_the_read_has_held_for_no_time() -> None:
    cluster = memory_cluster(1)
    state = state_of(cluster.snapshot(1), holders={"v6e-16-0": holder("v6e-16-0", "a", NOW + 5)})
    assert slice_of(state, "v6e-16-0")["holder"]["held_s"] == 0.0


def test_a_process_owning_a_tpu_makes_its_host_busy_and_is_named() -> None:
    cluster = memory_cluster(1)
    cluster.own_tpu("v6e-16-0", 3, "pid 99 (python train.py)")
    cluster.start_owner_probe(["v6e-16-0/3"])  # its agent records the owner
    cell = cells(slice_of(state_of(cluster.snapshot(1)), "v6e-16-0"))[3]
    assert (cell["label"], cell["reason"]) == ("BUSY", "pid 99 (python train.py)")


def test_a_dead_host_is_broken_and_a_missing_one_broken_as_missing() -> None:
    cluster = memory_cluster(2)
    cluster.kill_host("v6e-16-0", 1)
    snapshot = cluster.snapshot(1)
    info = snapshot.slices["v6e-16-1"]
    gone = dataclasses.replace(info, hosts={w: h for w, h in info.hosts.items() if w != 2})
    snapshot = dataclasses.replace(snapshot, slices={**snapshot.slices, "v6e-16-1": gone})
    state = state_of(snapshot)
    dead = slice_of(state, "v6e-16-0")
    assert dead["label"] == "BROKEN" and dead["hosts_text"] == "3/4"
    assert cells(dead)[1] == {
        "worker_id": 1,
        "label": "BROKEN",
        "reason": "dead",
        "node": "v6e-16-0/1",
    }
    assert cells(dead)[0]["label"] == "READY"
    missing = cells(slice_of(state, "v6e-16-1"))
    assert sorted(missing) == [0, 1, 2, 3]  # the grid keeps the missing worker's place
    assert missing[2] == {"worker_id": 2, "label": "BROKEN", "reason": "missing", "node": ""}


def test_a_suspect_host_is_suspect_with_its_reason_and_evidence() -> None:
    cluster = memory_cluster(1)
    cluster.suspect("v6e-16-0", 3, evidence="rank 3 silent")
    entry = slice_of(state_of(cluster.snapshot(1)), "v6e-16-0")
    assert entry["label"] == "SUSPECT" and "host 3 suspect" in entry["reason"]
    assert cells(entry)[3]["label"] == "SUSPECT"
    assert cells(entry)[3]["reason"] == "hang: rank 3 silent"
    assert [cells(entry)[w]["label"] for w in range(3)] == ["READY"] * 3


def test_a_host_under_notice_shows_the_notices_state_and_event() -> None:
    cluster = memory_cluster(1)
    cluster.notices["v6e-16-0/2"] = Notice(
        "preemption", "TRUE", NOW - 5, NOW + 25, "v6e-16-0/2", "v6e-16-0", 2
    )
    entry = slice_of(state_of(cluster.snapshot(1)), "v6e-16-0")
    assert entry["label"] == "PREEMPTING"
    assert (cells(entry)[2]["label"], cells(entry)[2]["reason"]) == ("PREEMPTING", "TRUE")


def test_busy_subslices_of_an_unheld_slice_are_listed_and_a_held_slice_lists_none() -> None:
    cluster = memory_cluster(1)
    cluster.take("v6e-16-0", 0, {"TPU": 4})
    cluster.take("v6e-16-0", 1, {"TPU": 4})
    snapshot = cluster.snapshot(1)
    physical = {"v6e-16-0": {0: 0, 1: 1, 2: 2, 3: 3}}
    entry = slice_of(state_of(snapshot, physical=physical), "v6e-16-0")
    assert entry["subslices"] == [
        {"topology": "2x2", "index": 0, "workers": [0]},
        {"topology": "2x2", "index": 1, "workers": [1]},
        {"topology": "2x4", "index": 0, "workers": [0, 1]},
    ]
    assert slice_of(state_of(snapshot), "v6e-16-0")["subslices"] == []  # layout unknown
    held = state_of(snapshot, physical=physical, holders={"v6e-16-0": holder("v6e-16-0", "a")})
    assert slice_of(held, "v6e-16-0")["subslices"] == []


def test_fresh_queue_requests_show_tenant_wants_position_and_reason_or_grant() -> None:
    waiting = request(2, "team-a", count=(1, 3), priority=5, reason="no idle v6e-16 4x4")
    granted = request(1, "team-b", granted=("v6e-16-0", "v6e-16-1"), preemptible=True)
    snapshot = memory_cluster(2).snapshot(1)
    snapshot = dataclasses.replace(snapshot, queue=QueueRecord(NOW - 1.0, (granted, waiting)))
    queue = state_of(snapshot)["queue"]
    assert queue == [
        {
            "position": 1,
            "tenant": "team-b",
            "wants": "1 x v6e-16 4x4",
            "priority": 0,
            "waited_s": 30.0,
            "who": "pid 1 on host-a",
            "reason": "granted v6e-16-0, v6e-16-1",
            "preemptible": True,
        },
        {
            "position": 2,
            "tenant": "team-a",
            "wants": "1..3 x v6e-16 4x4",
            "priority": 5,
            "waited_s": 30.0,
            "who": "pid 2 on host-a",
            "reason": "no idle v6e-16 4x4",
            "preemptible": False,
        },
    ]


def test_a_stale_queue_record_shows_no_requests() -> None:
    snapshot = memory_cluster(1).snapshot(1)
    stale = QueueRecord(NOW - 60.0, (request(1, "team-a", reason="waiting"),))
    state = state_of(dataclasses.replace(snapshot, queue=stale))
    assert state["queue"] == []
    assert "team-a" not in state["tenants"]


def test_teams_list_quota_tenants_and_holders_with_their_preemptions() -> None:
    quotas = Quotas({"team-a": TenantQuota({"v6e-16": 2}, borrow_limit=1, weight=2.0)})
    holders = {"v6e-16-0": holder("v6e-16-0", "team-b"), "v6e-16-1": holder("v6e-16-1", "team-b")}
    history = [
        SliceEvent(NOW - 50, "preempted", ("v6e-16-0",), tenant="team-b", seconds=30.0),
        SliceEvent(NOW - 40, "reserved", ("v6e-16-1",), tenant="team-a"),
        SliceEvent(NOW - 30, "preempted", ("v6e-16-1",), tenant="team-b", seconds=30.0),
        SliceEvent(NOW - 20, "preempted", ("v6e-16-2",), tenant="team-a", seconds=30.0),
    ]
    state = state_of(
        memory_cluster(3).snapshot(1),
        holders=holders,
        quotas=quotas,
        usage={"team-b": 3600.0},
        history=history,
    )
    teams = state["teams"]
    assert teams["configured"] is True and teams["half_life_s"] == quotas.half_life_s
    rows = {row["tenant"]: row for row in teams["tenants"]}
    assert list(rows) == ["team-a", "team-b"]
    assert rows["team-a"]["quota"] == {
        "slices": {"v6e-16": 2},
        "borrow_limit": 1,
        "weight": 2.0,
        "grace_s": 30.0,
    }
    assert (rows["team-a"]["slices"], rows["team-a"]["borrow"]) == ("v6e-16=2", "1")
    assert (rows["team-a"]["held"], rows["team-a"]["preemptions"]) == (0, 1)
    assert rows["team-a"]["usage"] == 0.0
    assert rows["team-b"]["quota"] is None and rows["team-b"]["slices"] == "none"
    assert (rows["team-b"]["held"], rows["team-b"]["preemptions"]) == (2, 2)
    assert rows["team-b"]["usage"] == 3600.0


def test_a_team_borrows_what_it_holds_beyond_its_quota_of_a_kind() -> None:
    quotas = Quotas({"team-a": TenantQuota({"v6e-16": 1})})
    holders = {
        "v6e-16-0": holder("v6e-16-0", "team-a"),
        "v6e-16-1": holder("v6e-16-1", "team-a"),
        "v6e-16-2": holder("v6e-16-2", "team-b"),  # no quota: all it holds is borrowed
    }
    state = state_of(memory_cluster(3).snapshot(1), holders=holders, quotas=quotas)
    rows = {row["tenant"]: row for row in state["teams"]["tenants"]}
    assert (rows["team-a"]["held"], rows["team-a"]["borrowed"]) == (2, 1)
    assert (rows["team-b"]["held"], rows["team-b"]["borrowed"]) == (1, 1)


def test_without_quotas_or_holders_teams_are_unconfigured_and_empty() -> None:
    teams = state_of(memory_cluster(1).snapshot(1))["teams"]
    assert teams == {"configured": False, "half_life_s": Quotas().half_life_s, "tenants": []}


def test_runs_are_newest_first_and_capped() -> None:
    accounts = [account(f"run-{i:02d}", NOW - 1000 + i) for i in range(dashboard.RUNS_SHOWN + 5)]
    runs = state_of(memory_cluster(1).snapshot(1), accounts=accounts)["runs"]
    assert len(runs) == dashboard.RUNS_SHOWN
    newest = list(reversed(accounts))[: dashboard.RUNS_SHOWN]
    assert runs == [a.to_dict() for a in newest]
    assert runs[0]["run_id"] == f"run-{dashboard.RUNS_SHOWN + 4:02d}"
    assert "run-04" not in {r["run_id"] for r in runs}  # the oldest five are left out


def test_events_read_as_describe_and_keep_the_newest() -> None:
    history = [
        SliceEvent(NOW - 1000 + i, "reserved", (f"s-{i}",), what="1 x v6e 4x4", seconds=0.5)
        for i in range(dashboard.EVENTS_SHOWN + 10)
    ]
    shown = state_of(memory_cluster(1).snapshot(1), history=history)["events"]
    assert len(shown) == dashboard.EVENTS_SHOWN
    kept = history[-dashboard.EVENTS_SHOWN :]
    assert [e["slices"] for e in shown] == [list(e.slices) for e in kept]  # oldest first
    assert shown[-1]["slices"] == [f"s-{dashboard.EVENTS_SHOWN + 9}"]
    for event, entry in zip(kept, shown, strict=True):
        assert entry == {**event.to_dict(), "text": event.describe()}
    assert shown[0]["text"].startswith("reserved s-10 (1 x v6e 4x4) after 0.5 s")


def test_tenants_and_slice_names_list_everyone_once_in_order() -> None:
    snapshot = memory_cluster(2).snapshot(1)
    queued = QueueRecord(NOW, (request(1, "team-q"), request(2, "")))
    history = [
        SliceEvent(NOW - 9, "preempted", tenant="team-p"),
        SliceEvent(NOW - 8, "released", tenant="team-e"),
        SliceEvent(NOW - 7, "released", tenant=""),
    ]
    state = state_of(
        dataclasses.replace(snapshot, queue=queued),
        holders={"v6e-16-1": holder("v6e-16-1", "team-h")},
        quotas=Quotas({"team-a": TenantQuota({"v6e-16": 1})}),
        history=history,
    )
    assert state["tenants"] == ["team-a", "team-e", "team-h", "team-p", "team-q"]
    assert state["slice_names"] == ["v6e-16-0", "v6e-16-1"]


def test_the_whole_state_is_json_and_reads_back_unchanged() -> None:
    cluster = memory_cluster(3)
    cluster.take("v6e-16-0", 0, {"TPU": 4})
    cluster.kill_host("v6e-16-1", 3)
    cluster.suspect("v6e-16-2", 1, evidence="exit 134")
    snapshot = dataclasses.replace(
        cluster.snapshot(1), queue=QueueRecord(NOW, (request(1, "team-a", granted=("x",)),))
    )
    state = state_of(
        snapshot,
        physical={"v6e-16-0": {0: 0, 1: 1, 2: 2, 3: 3}},
        holders={"v6e-16-2": holder("v6e-16-2", "team-b")},
        quotas=Quotas({"team-a": TenantQuota({"v6e-16 4x4": 1})}),
        usage={"team-a": 12.5},
        accounts=[account("run-1", NOW - 100)],
        history=[SliceEvent(NOW - 5, "suspect", ("v6e-16-2",), seconds=600.0, tenant="team-b")],
    )
    assert json.loads(json.dumps(state, allow_nan=False)) == state
    assert state["counts"] == {"BUSY": 1, "BROKEN": 1, "SUSPECT": 1}


# --- Picture -----------------------------------------------------------------------------


def test_asks_within_every_s_share_one_read_and_a_due_ask_reads_again() -> None:
    read, clock = CountingRead(), FakeClock()
    picture = Picture(read, every_s=1.0, clock=clock)

    async def go() -> list[dict[str, Any]]:
        seen = [json.loads(await picture.current())]
        clock.t = 0.5
        assert picture.due_in() == 0.5
        seen.append(json.loads(await picture.current()))
        clock.t = 1.0
        assert picture.due_in() == 0.0
        seen.append(json.loads(await picture.current()))
        return seen

    seen = asyncio.run(go())
    assert [s["n"] for s in seen] == [1, 1, 2]
    assert read.calls == 2


def test_concurrent_askers_share_one_read() -> None:
    read = CountingRead()
    picture = Picture(read, clock=FakeClock())

    async def go() -> list[bytes]:
        return list(await asyncio.gather(*(picture.current() for _ in range(8))))

    answers = asyncio.run(go())
    assert read.calls == 1
    assert set(answers) == {json.dumps({"connected": True, "n": 1}).encode()}


def test_a_failed_read_is_served_disconnected_and_the_next_due_ask_recovers() -> None:
    read, clock = (
        CountingRead(RuntimeError("GCS at 10.0.0.1:6379 unreachable\nTraceback...")),
        FakeClock(),
    )
    picture = Picture(read, every_s=1.0, clock=clock)

    async def go() -> list[dict[str, Any]]:
        seen = [json.loads(await picture.current())]
        clock.t = 0.5
        seen.append(json.loads(await picture.current()))  # not due: no retry yet
        clock.t = 1.0
        seen.append(json.loads(await picture.current()))
        return seen

    failed, still, recovered = asyncio.run(go())
    assert failed["connected"] is False
    assert failed["error"] == "GCS at 10.0.0.1:6379 unreachable"
    assert isinstance(failed["read_at"], float)
    assert still == failed
    assert recovered == {"connected": True, "n": 2}
    assert read.calls == 2


def test_a_failed_read_with_no_message_is_named_by_its_class() -> None:
    picture = Picture(CountingRead(ConnectionError()), clock=FakeClock())
    state = json.loads(asyncio.run(picture.current()))
    assert (state["connected"], state["error"]) == (False, "ConnectionError")


def test_a_read_that_raises_a_timeout_error_is_a_failed_read_and_the_next_ask_recovers() -> None:
    # Ray's GetTimeoutError (and socket.timeout) are TimeoutErrors: a read that fails with
    # one is a failed read, like any other, not a read still running past its bound.
    read, clock = CountingRead(TimeoutError("GCS call timed out")), FakeClock()
    picture = Picture(read, every_s=1.0, clock=clock)

    async def go() -> list[dict[str, Any]]:
        seen = [json.loads(await picture.current())]
        clock.t = 1.0
        seen.append(json.loads(await picture.current()))
        return seen

    failed, recovered = asyncio.run(go())
    assert recovered == {"connected": True, "n": 2}
    assert read.calls == 2
    assert (failed["connected"], failed["error"]) == (False, "GCS call timed out")


def test_a_read_past_its_bound_is_disconnected_and_not_started_twice() -> None:
    release, calls = threading.Event(), []

    def hung_read() -> dict[str, Any]:
        calls.append(1)
        release.wait(10.0)  # released below; the bound keeps a broken test from hanging
        return {"connected": True, "n": len(calls)}

    clock = FakeClock()
    picture = Picture(hung_read, every_s=1.0, bound_s=0.05, clock=clock)

    async def go() -> list[dict[str, Any]]:
        try:
            seen = [json.loads(await picture.current())]
            clock.t = 1.0  # due again while the first read still hangs
            seen.append(json.loads(await picture.current()))
        finally:
            release.set()
        clock.t = 2.0
        seen.append(json.loads(await picture.current()))  # the first read's answer
        return seen

    first, second, answered = asyncio.run(go())
    for hung in (first, second):
        assert hung["connected"] is False
        assert hung["error"] == "the cluster did not answer in 0.05 s"
    assert answered == {"connected": True, "n": 1}
    assert len(calls) == 1  # one read started, though two asks timed out


# --- check_filters -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "query",
    [
        {},
        {"slice": "v6e-16-a"},
        {"tenant": "team-a"},
        {"slice": "v6e-16-a", "tenant": "team a@x"},
        {"slice": "x" * dashboard.MAX_FILTER_CHARS},
    ],
)
def test_filters_accept_slice_and_tenant(query: dict[str, str]) -> None:
    assert check_filters(query) is None


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ({"bogus": "1"}, "'bogus'"),
        ({"slice": "v6e-16-a", "Slice": "x"}, "'Slice'"),
        ({"slice": "x" * (dashboard.MAX_FILTER_CHARS + 1)}, "'slice'"),
        ({"tenant": "team\na"}, "'tenant'"),
        ({"tenant": "team\x00a"}, "'tenant'"),
    ],
)
def test_filters_refuse_unknown_overlong_or_unprintable_naming_the_parameter(
    query: dict[str, str], named: str
) -> None:
    problem = check_filters(query)
    assert problem is not None and named in problem


# --- routes ------------------------------------------------------------------------------


def test_api_state_serves_the_pictures_json(web: Path) -> None:
    async def ask(client: TestClient) -> tuple[int, str, Any]:
        resp = await client.get("/api/state")
        return resp.status, resp.content_type, await resp.json()

    assert with_client(Picture(CountingRead(), clock=FakeClock()), ask) == (
        200,
        "application/json",
        {"connected": True, "n": 1},
    )


def test_api_state_serves_a_failed_read_as_disconnected(web: Path) -> None:
    async def ask(client: TestClient) -> tuple[int, Any]:
        resp = await client.get("/api/state")
        return resp.status, await resp.json()

    picture = Picture(CountingRead(ConnectionError("no GCS")), clock=FakeClock())
    status, body = with_client(picture, ask)
    assert status == 200 and body["connected"] is False and body["error"] == "no GCS"


@pytest.mark.parametrize("path", ["/api/state?x=1", "/api/stream?x=1"])
def test_api_routes_refuse_parameters_with_a_json_message(web: Path, path: str) -> None:
    async def ask(client: TestClient) -> tuple[int, str, str]:
        resp = await client.get(path)
        return resp.status, resp.content_type, await resp.text()

    read = CountingRead()
    status, content_type, text = with_client(Picture(read, clock=FakeClock()), ask)
    assert (status, content_type) == (400, "application/json")
    assert json.loads(text) == {"error": f"{path.split('?')[0]} takes no parameters"}
    assert "Traceback" not in text
    assert read.calls == 0


def test_the_page_refuses_unknown_filters_and_serves_known_ones(web: Path) -> None:
    async def ask(client: TestClient) -> list[tuple[int, str]]:
        found = []
        for path in ("/?bogus=1", "/?slice=v6e-16-a", "/?slice=v6e-16-a&tenant=team-a", "/"):
            resp = await client.get(path)
            found.append((resp.status, await resp.text()))
        return found

    bogus, one, both, bare = with_client(Picture(CountingRead(), clock=FakeClock()), ask)
    assert bogus[0] == 400 and "'bogus'" in bogus[1] and "Traceback" not in bogus[1]
    assert one == both == bare == (200, INDEX_HTML)


def test_a_run_page_refuses_a_bad_id_and_serves_a_good_one(web: Path) -> None:
    async def ask(client: TestClient) -> list[tuple[int, str]]:
        found = []
        for path in ("/runs/bad%20id%21", "/runs/" + "a" * 81, "/runs/run-1.a_b"):
            resp = await client.get(path)
            found.append((resp.status, await resp.text()))
        return found

    bad, long, good = with_client(Picture(CountingRead(), clock=FakeClock()), ask)
    assert bad[0] == 400 and "not a run id" in bad[1]
    assert long[0] == 400
    assert good == (200, RUN_HTML)


def test_api_runs_answers_the_newest_account_of_an_id_or_404(
    web: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    older, other, newer = (
        account("run-1", NOW - 500),
        account("run-2", NOW - 400),
        account("run-1", NOW - 300),
    )
    monkeypatch.setattr(goodput, "read_accounts", lambda limit=100: [older, other, newer])

    async def ask(client: TestClient) -> list[tuple[int, Any]]:
        found = []
        for path in (
            "/api/runs/run-1",
            "/api/runs/run-2",
            "/api/runs/run-9",
            "/api/runs/bad%20id%21",
        ):
            resp = await client.get(path)
            found.append((resp.status, await resp.json()))
        return found

    one, two, unknown, bad = with_client(Picture(CountingRead(), clock=FakeClock()), ask)
    assert one == (200, {"run": newer.to_dict()})
    assert two == (200, {"run": other.to_dict()})
    assert unknown == (404, {"error": "no run 'run-9' has an account"})
    assert bad[0] == 400 and "'bad id!'" in bad[1]["error"]


def test_the_stream_sends_the_state_as_its_first_event(web: Path) -> None:
    async def ask(client: TestClient) -> tuple[int, str, str, bytes]:
        resp = await client.get("/api/stream")
        try:
            line = await asyncio.wait_for(resp.content.readline(), 5.0)
        finally:
            resp.close()
        return resp.status, resp.content_type, resp.headers["Cache-Control"], line

    status, content_type, cache, line = with_client(Picture(CountingRead(), clock=FakeClock()), ask)
    assert (status, content_type, cache) == (200, "text/event-stream", "no-cache")
    assert line.startswith(b"data: ") and line.endswith(b"\n")
    assert json.loads(line[len(b"data: ") :]) == {"connected": True, "n": 1}


@pytest.mark.parametrize("path", ["/", "/api/state", "/api/runs/run-1"])
def test_routes_answer_only_get(web: Path, path: str) -> None:
    async def ask(client: TestClient) -> int:
        return (await client.post(path, data=b"x")).status

    read = CountingRead()
    assert with_client(Picture(read, clock=FakeClock()), ask) == 405
    assert read.calls == 0


def test_serve_ends_at_once_with_a_page_open_and_a_read_that_hangs(web: Path) -> None:
    """Ctrl-C (serve cancelled) while a page holds its stream open and a cluster read
    hangs: the streams end and serve returns, and no thread of the read holds the exit
    (a read runs in a daemon thread, not the loop's executor, which asyncio.run joins)."""
    release = threading.Event()
    clock = FakeClock()

    hung: list[threading.Thread] = []

    def read() -> dict[str, Any]:
        if clock.t > 0:  # every read after the first hangs until the test ends
            hung.append(threading.current_thread())
            release.wait(30)
        return {"connected": True, "t": clock.t}

    picture = Picture(read, clock=clock, bound_s=0.05)

    async def go() -> tuple[bytes, dict[str, Any], bytes]:
        task, url = await serving(picture, "127.0.0.1")
        async with aiohttp.ClientSession() as session:
            resp = await session.get(url + "api/stream")
            first = await resp.content.readline()
            clock.t = 5.0  # due again: this read hangs, and is served late
            late = json.loads(await picture.current())
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 5.0)
            rest = await asyncio.wait_for(resp.content.read(), 5.0)
        return first, late, rest

    try:
        first, late, rest = asyncio.run(asyncio.wait_for(go(), 20.0))
        assert hung and hung[0].is_alive()  # the run ended with the read still hanging
    finally:
        release.set()
    assert first.startswith(b"data: ")
    assert late == {
        "connected": False,
        "error": "the cluster did not answer in 0.05 s",
        "read_at": late["read_at"],
    }
    assert rest == b"\n"  # the first event's end, then the stream closed


def test_by_default_it_listens_on_loopback_only_so_other_addresses_are_refused(web: Path) -> None:
    """With no ``--host``, the page answers on 127.0.0.1 and every other address of this
    machine refuses the connection."""
    default = next(p for p in dashboard_command.params if p.name == "host").default
    others = [
        a.address
        for found in psutil.net_if_addrs().values()
        for a in found
        if a.family == socket.AF_INET and not a.address.startswith("127.")
    ]
    if not others:
        pytest.skip("this machine has no address but loopback to try")

    async def go() -> tuple[int, list[str]]:
        task, url = await serving(Picture(CountingRead(), clock=FakeClock()), default)
        port = url.rstrip("/").rsplit(":", 1)[1]
        refused = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            async with session.get(url + "api/state") as response:
                status = response.status
            for address in others:
                try:
                    async with session.get(f"http://{address}:{port}/api/state"):
                        pass
                except aiohttp.ClientConnectorError:
                    refused.append(address)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return status, refused

    status, refused = asyncio.run(go())
    assert default == "127.0.0.1"
    assert status == 200 and refused == others
