"""Suspect hosts, pure: their records in Ray's KV store (a dict stands in for it), read in
the same listing as the other host records, the slice state they give, and how status and
the metrics show them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

from test_cluster_view import idle, killed, take, tpu_node, tpu_slice
from test_status import render
from tpuslice._host import suspects
from tpuslice._host.notices import Notice
from tpuslice._host.suspects import (
    DEFAULT_COOLDOWN_S,
    MAX_EVIDENCE_CHARS,
    Blame,
    Suspect,
    SuspectReason,
)
from tpuslice._tpu import _ray
from tpuslice._tpu.keys import NAMESPACE, SUSPECT_COOLDOWN_KEY, SUSPECT_KEY_PREFIX
from tpuslice._view import agents
from tpuslice._view.cluster import SliceState, build_snapshot
from tpuslice.cli import status
from tpuslice.errors import InvalidArgumentError
from tpuslice.record import metrics
from tpuslice.testing.memory import InMemoryCluster

HANG = SuspectReason.HANG


class Store:
    """Ray's KV store, in a dict, with the calls made to it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.data: dict[str, bytes] = {}
        self.calls: list[str] = []
        monkeypatch.setattr(_ray, "kv_put", self.put)
        monkeypatch.setattr(_ray, "kv_get", self.get)
        monkeypatch.setattr(_ray, "kv_list", self.list)
        monkeypatch.setattr(_ray, "kv_get_many", self.get_many)
        monkeypatch.setattr(_ray, "kv_delete", self.delete)

    def put(self, key: str, value: bytes, namespace: str | None) -> None:
        assert namespace == NAMESPACE
        self.calls.append("put")
        self.data[key] = value

    def get(self, key: str, namespace: str | None) -> bytes | None:
        self.calls.append("get")
        return self.data.get(key)

    def list(self, prefix: str, namespace: str | None) -> list[str]:
        self.calls.append("list")
        return sorted(k for k in self.data if k.startswith(prefix))

    def get_many(self, keys: list[str], namespace: str | None) -> dict[str, bytes]:
        self.calls.append("get_many")
        return {k: self.data[k] for k in keys if k in self.data}

    def delete(self, key: str, namespace: str | None, *, prefix: bool = False) -> None:
        self.calls.append("delete")
        self.data.pop(key, None)


def blame(node: str, slice_name: str = "v4-16-a", worker: int = 1, evidence: str = "") -> Blame:
    return Blame(node, slice_name, worker, HANG, evidence or f"rank {worker} silent")


# --- the records --------------------------------------------------------------------------


def test_a_record_reads_back_and_keeps_its_evidence_short() -> None:
    record = Suspect.of(blame("n1", evidence="x" * 1000), 1000.0, 600.0)
    assert len(record.evidence) == MAX_EVIDENCE_CHARS and record.evidence.endswith("…")
    assert Suspect.from_json(record.to_json()) == record
    assert (record.since, record.until, record.left(1100.0)) == (1000.0, 1600.0, 500.0)
    assert record.live(1599.0) and not record.live(1600.0)
    assert record.describe(1060.0) == "host 1 suspect (hang), 9 min left"
    assert record.describe(1540.0) == "host 1 suspect (hang), 60 s left"
    stored = json.loads(record.to_json())
    assert set(stored) == {
        "node_id",
        "slice_name",
        "worker_id",
        "reason",
        "evidence",
        "since",
        "until",
    }
    with pytest.raises(ValueError, match="not a suspect record"):
        Suspect.from_json(b'{"node_id": "n1"}')
    with pytest.raises(ValueError):
        Suspect.from_json(json.dumps({**stored, "reason": "bad luck"}).encode())


def test_marking_writes_one_record_per_host_for_the_clusters_cooldown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = Store(monkeypatch)
    written = suspects.mark([blame("n1"), blame("n2", worker=2)], now=1000.0)
    assert [r.until for r in written] == [1000.0 + DEFAULT_COOLDOWN_S] * 2
    suspects.set_cooldown(120)
    assert store.data[SUSPECT_COOLDOWN_KEY] == b"120.0"
    store.calls.clear()
    (again,) = suspects.mark([blame("n1")], now=2000.0)
    assert store.calls == ["get", "put"]  # one read of the cool-down, one write per host
    assert again.until == 2120.0
    assert Suspect.from_json(store.data[SUSPECT_KEY_PREFIX + "n1"]) == again


@pytest.mark.parametrize("seconds", [0, -5.0, float("inf"), float("nan"), "60", True])
def test_a_cooldown_must_be_finite_seconds(
    monkeypatch: pytest.MonkeyPatch, seconds: object
) -> None:
    store = Store(monkeypatch)
    with pytest.raises(InvalidArgumentError, match="suspect cool-down must be") as raised:
        suspects.set_cooldown(seconds)  # type: ignore[arg-type]
    assert isinstance(raised.value, ValueError)
    store.data[SUSPECT_COOLDOWN_KEY] = b"soon"  # written by hand: the default stands
    assert suspects.cooldown() == DEFAULT_COOLDOWN_S


def test_readers_ignore_and_delete_ended_records(monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(monkeypatch)
    suspects.mark([blame("old")], now=0.0)
    suspects.mark([blame("new")], now=1000.0)
    store.data[SUSPECT_KEY_PREFIX + "junk"] = b"not json at all"
    live, ended = suspects.live_suspects(store.data, now=1000.0)
    assert list(live) == ["new"]
    assert sorted(ended) == [SUSPECT_KEY_PREFIX + "junk", SUSPECT_KEY_PREFIX + "old"]
    assert suspects.clear_slice("elsewhere", now=1000.0) == []  # a reader deletes them
    assert sorted(store.data) == [SUSPECT_KEY_PREFIX + "new"]


def test_clearing_a_slice_deletes_only_its_hosts_records(monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(monkeypatch)
    suspects.mark([blame("a1", "a", 1), blame("a3", "a", 3), blame("b0", "b", 0)], now=10.0)
    cleared = suspects.clear_slice("a", now=20.0)
    assert [(r.slice_name, r.worker_id) for r in cleared] == [("a", 1), ("a", 3)]
    assert sorted(store.data) == [SUSPECT_KEY_PREFIX + "b0"]
    assert suspects.clear_slice("a", now=20.0) == []


def test_the_cluster_view_reads_suspects_in_the_listing_of_the_other_host_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One listing and one read for owners, notices and suspects: a snapshot costs no
    extra round trip."""
    store = Store(monkeypatch)
    notice = Notice("preemption", "TRUE", 990.0, 1020.0, "n2", "v4-16-a", 2)
    store.data["tpu-notice/n2"] = notice.to_json()
    (record,) = suspects.mark([blame("n1")], now=1000.0)
    store.calls.clear()
    notes = agents.recorded_notes(now=1001.0)
    assert store.calls == ["list", "get_many"]
    assert (notes.owners, notes.notices, notes.suspects) == ({}, {"n2": notice}, {"n1": record})
    assert agents.recorded_notes(now=record.until).suspects == {}
    assert SUSPECT_KEY_PREFIX + "n1" not in store.data  # the reader deleted the ended one


# --- the slice state ------------------------------------------------------------------------


def one_slice(count: int = 1) -> InMemoryCluster:
    return InMemoryCluster([("v6e", "4x4", count)])


def test_a_suspect_host_makes_its_slice_suspect_idle_or_busy() -> None:
    cluster = one_slice()
    record = cluster.suspect("v6e-16-0", 1, HANG, "rank 1 silent")
    info = cluster.snapshot(1).slices["v6e-16-0"]
    assert info.state is SliceState.SUSPECT and info.idle
    assert info.reason == "host 1 suspect (hang), 10 min left; every host free"
    assert info.suspects == [record] and info.hosts[1].suspect == record
    cluster.take("v6e-16-0", 2, {"TPU": 4})
    snapshot = cluster.snapshot(1)
    busy = snapshot.slices["v6e-16-0"]
    assert busy.state is SliceState.SUSPECT and not busy.idle
    assert busy.reason == "host 1 suspect (hang), 10 min left; 1/4 hosts in use"
    assert busy.shape is not None
    assert snapshot.ready(busy.shape) == snapshot.trusted(busy.shape) == []
    assert snapshot.idle_suspects(busy.shape) == [] and snapshot.whole(busy.shape) == [busy]


def test_broken_and_notice_come_before_suspect() -> None:
    nodes = tpu_slice("s", "v6e-16", "4x4", 4, 4)
    record = Suspect.of(blame(nodes[1]["NodeID"], "s", 1), 990.0, 600.0)
    notice = Notice("preemption", "TRUE", 990.0, 1020.0, nodes[2]["NodeID"], "s", 2)
    found = {nodes[1]["NodeID"]: record}
    warned = build_snapshot(
        nodes, idle(nodes), taken_at=1000.0, notices={notice.node_id: notice}, suspects=found
    )
    assert warned.slices["s"].state is SliceState.NOTICE
    nodes[3] = killed(nodes[3])
    broken = build_snapshot(nodes, idle(nodes), taken_at=1000.0, suspects=found)
    assert broken.slices["s"].state is SliceState.BROKEN


def test_an_ended_record_or_a_replaced_host_is_not_suspect() -> None:
    nodes = tpu_slice("s", "v6e-16", "4x4", 4, 4)
    record = Suspect.of(blame(nodes[1]["NodeID"], "s", 1), 0.0, 600.0)
    found = {record.node_id: record}
    available = idle(nodes)
    before = build_snapshot(nodes, available, taken_at=599.0, suspects=found)
    after = build_snapshot(nodes, available, taken_at=600.0, suspects=found)
    assert before.slices["s"].state is SliceState.SUSPECT
    assert after.slices["s"].state is SliceState.READY
    # The VM was replaced: a new node with the same slice name and worker id.
    replaced = [*nodes[:1], killed(nodes[1]), *nodes[2:]]
    replaced.append(tpu_node("v6e-16", "4x4", 1, 4, slice_name="s"))
    info = build_snapshot(replaced, idle(replaced), taken_at=10.0, suspects=found).slices["s"]
    assert info.state is SliceState.READY and info.suspects == []


def test_a_suspect_slice_with_a_host_in_use_is_not_idle() -> None:
    nodes = tpu_slice("s", "v6e-16", "4x4", 4, 4)
    available = idle(nodes)
    take(available, nodes[0], tpu=4)
    record = Suspect.of(blame(nodes[1]["NodeID"], "s", 1), 0.0, 600.0)
    info = build_snapshot(nodes, available, taken_at=1.0, suspects={record.node_id: record})
    assert info.slices["s"].busy_hosts == 1 and not info.slices["s"].idle


# --- shown everywhere ---------------------------------------------------------------------


def suspect_snapshot() -> Any:
    cluster = one_slice(2)
    cluster.suspect("v6e-16-1", 2, HANG, "rank 2 silent: 1 rank(s) silent for up to 70 s")
    cluster.take("v6e-16-1", 0, {"TPU": 4})
    cluster.clock.t = 60.0
    return cluster.snapshot(1)


def test_status_shows_the_suspect_host_why_and_the_time_left() -> None:
    snapshot = suspect_snapshot()
    out = render(status.render_status(snapshot, 200), 200)
    assert "2 TPU slice(s): 1 ready, 0 busy, 0 broken, 1 suspect" in out
    assert "host 2 suspect (hang), 9 min left; 1/4 hosts in use" in out
    assert "host 2 (node v6e-16-1/2) suspect: hang, 9 min left; rank 2 silent" in out
    assert " ! " in render(status.legend())
    assert status.host_state(snapshot.slices["v6e-16-1"].hosts[2]) == "suspect"


def test_status_json_has_the_suspect_records_and_whether_the_slice_is_idle() -> None:
    data = json.loads(json.dumps(status.status_dict(suspect_snapshot())))
    assert data["counts"]["suspect"] == 1
    entry = next(s for s in data["slices"] if s["name"] == "v6e-16-1")
    assert (entry["state"], entry["idle"]) == ("suspect", False)
    (record,) = entry["suspects"]
    assert record == {
        "node_id": "v6e-16-1/2",
        "slice_name": "v6e-16-1",
        "worker_id": 2,
        "reason": "hang",
        "evidence": "rank 2 silent: 1 rank(s) silent for up to 70 s",
        "since": 0.0,
        "until": 600.0,
        "left_s": 540.0,
    }
    assert entry["hosts"][2]["suspect"] == record and entry["hosts"][1]["suspect"] is None


def test_the_gauges_count_suspect_slices_and_hosts() -> None:
    found = metrics.cluster_values(suspect_snapshot())
    got: Mapping[tuple[str, str], float] = {
        (name, tags["state"]): value for name, value, tags in found if "state" in tags
    }
    assert got[("slices", "suspect")] == 1 and got[("slices", "ready")] == 1
    assert got[("hosts", "suspect")] == 1 and got[("hosts", "busy")] == 1
    assert got[("hosts", "free")] == 6


def test_tpuslice_health_cooldown_sets_the_clusters_and_says_what_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from contextlib import nullcontext

    from click.testing import CliRunner

    from tpuslice.cli import health as cli_health
    from tpuslice.cli.commands import main

    store = Store(monkeypatch)
    monkeypatch.setattr(cli_health, "connected", lambda address: nullcontext())
    result = CliRunner().invoke(main, ["health", "--cooldown", "1800"])
    assert result.exit_code == 0, result.output
    assert "stay suspect for 1800 s (was 600 s)" in result.output
    assert suspects.cooldown() == 1800.0 and store.data[SUSPECT_COOLDOWN_KEY] == b"1800.0"
    for bad in (["--cooldown", "0"], ["--cooldown", "inf"], ["v4-16-a", "--cooldown", "60"]):
        refused = CliRunner().invoke(main, ["health", *bad])
        assert refused.exit_code == 2, (bad, refused.output)
    assert suspects.cooldown() == 1800.0  # nothing refused was written


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([], "name the slices to check, or give --all (not both)"),
        (["v6e-16-0", "--all"], "name the slices to check, or give --all (not both)"),
        (["v6e-16-9"], "no slice 'v6e-16-9'; slices: v6e-16-0, v6e-16-1"),
        (["--all", "--clear"], "--clear needs the slices named, not --all"),
    ],
)
def test_tpuslice_health_refuses_slices_it_cannot_check_saying_what_there_is(
    monkeypatch: pytest.MonkeyPatch, args: list[str], says: str
) -> None:
    from contextlib import nullcontext

    from click.testing import CliRunner

    from tpuslice.cli import health as cli_health
    from tpuslice.cli.commands import main

    there = InMemoryCluster([("v6e", "4x4", 2)]).snapshot(1)
    monkeypatch.setattr(cli_health, "connected", lambda address: nullcontext())
    monkeypatch.setattr(cli_health.cluster, "read_snapshot", lambda: there)
    refused = CliRunner().invoke(main, ["health", *args], env={"COLUMNS": "200"})
    assert refused.exit_code == 2, refused.output
    assert says in refused.output
