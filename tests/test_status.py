"""``tpuslice status``: the pure renderers (``tpuslice.cli.status``) on synthetic snapshots, and
the command through CliRunner with Ray's connection and reads replaced. No cluster runs."""

from __future__ import annotations

import io
import json
import socket
from typing import Any

import click
import pytest
import ray
from click.testing import CliRunner, Result
from rich.console import Console
from rich.text import Text

from test_cluster_view import cpu_node, idle, killed, take, tpu_node, tpu_slice
from tpuslice._host.notices import Notice
from tpuslice._host.suspects import Blame, Suspect, SuspectReason
from tpuslice._tpu import _ray
from tpuslice._tpu.topology import slice_shape
from tpuslice._view import cluster
from tpuslice._view.cluster import ClusterSnapshot, SliceState, build_snapshot
from tpuslice.cli import commands as cli
from tpuslice.cli import connect as cli_connect
from tpuslice.cli import status
from tpuslice.cli.jobs import _offer_simulator
from tpuslice.testing import SliceSpec

LONG_NAME = "tpu-v6e-128-training-pool-europe-west4-a-0001"


def mixed_snapshot() -> ClusterSnapshot:
    """Ready, busy, broken (dead + missing), invalid labels, single-host, a long name, under
    notice, and suspect."""
    ready = tpu_slice("v6e-16-a", "v6e-16", "4x4", 4, 4)
    busy = tpu_slice("v6e-16-b", "v6e-16", "4x4", 4, 4)
    broken = tpu_slice("v5p-32-a", "v5p-32", "2x2x4", 4, 4)
    broken[2] = killed(broken[2])
    del broken[3]
    odd = [tpu_node("v6e-17", "4x4", w, 4, slice_name="odd-labels") for w in range(2)]
    single = tpu_slice("v6e-8-a", "v6e-8", "2x4", 1, 8)
    big = tpu_slice(LONG_NAME, "v6e-128", "8x16", 32, 4)
    big[9] = killed(big[9])
    warned = tpu_slice("v6e-16-c", "v6e-16", "4x4", 4, 4)
    failed = tpu_slice("v6e-16-d", "v6e-16", "4x4", 4, 4)
    nodes = [cpu_node(), *ready, *busy, *broken, *odd, *single, *big, *warned, *failed]
    available = idle(nodes)
    take(available, busy[1], tpu=4)
    take(available, big[5], tpu=2)
    notice = Notice("preemption", "TRUE", 994.0, 1024.0, warned[1]["NodeID"], "v6e-16-c", 1)
    notices = {warned[1]["NodeID"]: notice}
    hung = Blame(failed[2]["NodeID"], "v6e-16-d", 2, SuspectReason.HANG, "rank 2 silent")
    suspects = {hung.node_id: Suspect.of(hung, 990.0, 600.0)}
    return build_snapshot(nodes, available, taken_at=1000.0, notices=notices, suspects=suspects)


def render(renderable: Any, width: int = 80) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def cell_styles(text: Text) -> dict[int, str]:
    """Worker id -> style of its cell in a numbered host grid."""
    return {int(text.plain[s.start : s.end].rstrip("*x? ")): str(s.style) for s in text.spans}


# --- table -------------------------------------------------------------------------------


def test_table_has_one_row_per_slice_with_state_hosts_and_tpu() -> None:
    snapshot = mixed_snapshot()
    out = render(status.slice_table(snapshot), width=200)
    rows = {line.split()[0]: " ".join(line.split()) for line in out.splitlines() if line.strip()}
    assert rows["v6e-16-a"] == "v6e-16-a v6e 4x4 ready 4/4 16/16"
    assert rows["v6e-16-b"] == "v6e-16-b v6e 4x4 busy 1/4 hosts in use 4/4 12/16"
    assert rows["v5p-32-a"] == "v5p-32-a v5p 2x2x4 broken host 2 dead, host 3 missing 2/4 8/8"
    assert rows["odd-labels"].startswith("odd-labels v6e-17 4x4 broken labels do not name")
    assert rows["v6e-8-a"] == "v6e-8-a v6e 2x4 ready 1/1 8/8"
    assert "8 TPU slice(s): 2 ready, 1 busy, 3 broken, 1 notice, 1 suspect" in out
    assert rows["v6e-16-c"] == (
        "v6e-16-c v6e 4x4 PREEMPTING preemption notice on v6e-16-c host 1 "
        "(instance/preempted=TRUE), 24 s left 4/4 16/16"
    )


def test_state_column_is_coloured_by_state() -> None:
    table = status.slice_table(mixed_snapshot())
    states = [cell for cell in table.columns[2].cells if isinstance(cell, Text)]
    styles = {cell.plain: str(cell.style) for cell in states}
    assert styles == {
        "ready": "bold green",
        "busy": "bold yellow",
        "broken": "bold red",
        "PREEMPTING": "bold magenta",
        "suspect": "bold dark_orange",
    }


# --- host grid ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("accelerator", "topology", "rows"),
    [
        ("v6e", "4x4", [[0, 1], [2, 3]]),
        ("v5p", "2x2x4", [[0, 1, 2, 3]]),
        ("v4", "2x2x2", [[0, 1]]),
        ("v5p", "4x4x4", [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]),
        ("v6e", "8x16", [list(range(r * 8, r * 8 + 8)) for r in range(4)]),
    ],
)
def test_grid_rows_follow_worker_coordinates(
    accelerator: str, topology: str, rows: list[list[int]]
) -> None:
    shape = slice_shape(topology, accelerator)
    nodes = tpu_slice("s", shape.pod_type, topology, shape.num_hosts, shape.chips_per_host)
    info = build_snapshot(nodes, idle(nodes)).slices["s"]
    assert status.grid_rows(info) == rows
    leading = shape.worker_grid[:-1]
    for r, row in enumerate(rows):
        for c, worker in enumerate(row):
            coords = shape.worker_coords(worker)
            flat = 0
            for side, coord in zip(leading, coords[:-1], strict=True):
                flat = flat * side + coord
            assert (flat, coords[-1]) == (r, c)


def test_a_known_layout_draws_hosts_where_their_chips_are_and_counts_free_sub_slices() -> None:
    """v6e 4x4 with workers scrambled (worker 2 at position 0, ...): the grid shows each
    worker at its physical place, so a held 2x4 half is one row; the summary counts the
    sub-slices whose hosts are all free."""
    nodes = tpu_slice("s", "v6e-16", "4x4", 4, 4)
    available = idle(nodes)
    physical = {0: 2, 1: 0, 2: 3, 3: 1}  # worker -> position
    take(available, nodes[1], tpu=4)  # worker 1, at position 0: in 2x4 half 0
    info = build_snapshot(nodes, available).slices["s"]
    assert status.grid_rows(info, physical) == [[1, 3], [0, 2]]
    assert status.grid_rows(info) == [[0, 1], [2, 3]]
    assert status.subslice_summary(info, physical) == "sub-slices: 2x2 3/4 free, 2x4 1/2 free"
    assert status.grid_rows(info, {0: 0, 1: 0, 2: 1, 3: 2}) == [[0, 1], [2, 3]]  # not a layout
    data = json.loads(
        json.dumps(status.status_dict(build_snapshot(nodes, available), {"s": physical}))
    )
    assert data["slices"][0]["subslices"]["physical"] == {"0": 2, "1": 0, "2": 3, "3": 1}
    assert data["slices"][0]["subslices"]["topologies"]["2x4"] == {
        "members": {"0": [1, 3], "1": [0, 2]},
        "free": [1],
    }
    assert "subslices" not in status.status_dict(build_snapshot(nodes, available))["slices"][0]


def test_slice_without_a_shape_is_one_row_of_its_workers() -> None:
    info = mixed_snapshot().slices["odd-labels"]
    assert status.grid_rows(info) == [[0, 1]]


def test_host_cells_are_coloured_by_host_state() -> None:
    nodes = tpu_slice("s", "v6e-16", "4x4", 4, 4)
    nodes[2] = killed(nodes[2])
    del nodes[3]
    available = idle(nodes)
    take(available, nodes[1], tpu=1)
    info = build_snapshot(nodes, available).slices["s"]
    grid = status.host_grid(info, 80)
    assert grid.plain.splitlines() == ["   0   1*", "   2x  3?"]  # readable without colour
    assert cell_styles(grid) == {
        0: status.HOST_STYLES["free"],
        1: status.HOST_STYLES["busy"],
        2: status.HOST_STYLES["dead"],
        3: status.HOST_STYLES["missing"],
    }


def test_wide_grid_uses_one_glyph_per_host() -> None:
    shape = slice_shape("8x8x16", "v7x")  # 256 hosts, 16 per row: too wide when numbered
    nodes = tpu_slice("wide", shape.pod_type, "8x8x16", shape.num_hosts, 4)
    nodes[3] = killed(nodes[3])
    info = build_snapshot(nodes, idle(nodes)).slices["wide"]
    lines = status.host_grid(info, 80).plain.splitlines()
    assert len(lines) == 16
    assert lines[0] == "  o o o x " + " ".join("o" * 12)
    assert all(len(line) <= 80 for line in lines)


def test_huge_grid_becomes_a_tally() -> None:
    shape = slice_shape("16x16x24", "v5p")
    nodes = tpu_slice("huge", shape.pod_type, "16x16x24", shape.num_hosts, 4)
    available = idle(nodes)
    for node in nodes[:100]:
        take(available, node, tpu=1)
    info = build_snapshot(nodes, available).slices["huge"]
    assert status.host_grid(info, 80).plain == "  1436 free, 100 busy (too many hosts to draw)"


def test_whole_screen_fits_80_columns_without_eliding() -> None:
    snapshot = mixed_snapshot()
    out = render(status.render_status(snapshot, 80), width=80)
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in out
    assert LONG_NAME in out  # whole on its grid heading
    for word in ("ready", "busy", "broken", "dead", "missing", "hosts:", "free"):
        assert word in out
    for name in snapshot.slices:
        assert any(line.startswith(name) for line in lines), name


@pytest.mark.parametrize("width", [60, 80, 120])
def test_grids_fit_any_reasonable_width(width: int) -> None:
    out = render(status.render_status(mixed_snapshot(), width), width=width)
    assert max(len(line) for line in out.splitlines()) <= width
    assert "…" not in out


def test_empty_cluster_says_so() -> None:
    out = render(status.render_status(build_snapshot([cpu_node()], {})))
    assert out.strip() == "No TPU slices in this cluster (no node has TPU labels or resources)."


# --- JSON ----------------------------------------------------------------------------------


def test_json_has_every_slice_state_reason_and_host() -> None:
    snapshot = mixed_snapshot()
    data = status.status_dict(snapshot)
    assert json.loads(json.dumps(data)) == data
    assert data["taken_at"] == 1000.0
    assert data["counts"] == {"ready": 2, "busy": 1, "broken": 3, "notice": 1, "suspect": 1}
    names = [s["name"] for s in data["slices"]]
    assert names == sorted(snapshot.slices)
    warned = next(s for s in data["slices"] if s["name"] == "v6e-16-c")
    assert (warned["state"], warned["shown_state"]) == ("notice", "PREEMPTING")
    assert warned["hosts"][1]["notice"]["kind"] == "preemption"
    assert warned["hosts"][1]["notice"]["deadline"] == 1024.0
    assert warned["hosts"][0]["notice"] is None
    broken = next(s for s in data["slices"] if s["name"] == "v5p-32-a")
    assert broken["state"] == "broken"
    assert broken["reason"] == "host 2 dead, host 3 missing"
    assert broken["missing_workers"] == [3]
    assert (broken["expected_hosts"], broken["alive_hosts"]) == (4, 2)
    assert (broken["generation"], broken["pod_type"], broken["topology"]) == (
        "v5p",
        "v5p-32",
        "2x2x4",
    )
    assert (broken["chips_per_host"], broken["worker_grid"]) == (4, [1, 1, 4])
    info = snapshot.slices["v5p-32-a"]
    assert broken["hosts"][0] == {
        "worker_id": 0,
        "node_id": info.hosts[0].node_id,
        "address": info.hosts[0].address,
        "alive": True,
        "state": "free",
        "tpu_total": 4.0,
        "tpu_available": 4.0,
        "head_free": True,
        "tpu_owner": None,
        "notice": None,
        "suspect": None,
    }
    assert [h["state"] for h in broken["hosts"]] == ["free", "free", "dead"]
    odd = next(s for s in data["slices"] if s["name"] == "odd-labels")
    assert (odd["generation"], odd["chips_per_host"], odd["worker_grid"]) == (None, None, None)


# --- the command ---------------------------------------------------------------------------


class FakeRay:
    """Stands in for ``ray.init`` / ``ray.shutdown`` / ``ray.is_initialized``."""

    def __init__(
        self,
        error: Exception | None = None,
        initialized: bool = False,
        recorded: str | None = None,
    ) -> None:
        self.error = error
        self.initialized = initialized
        self.recorded = recorded  # the address Ray recorded for the last local cluster
        self.init_calls: list[dict[str, Any]] = []
        self.shutdowns = 0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeRay:
        monkeypatch.setattr(ray, "init", self.init)
        monkeypatch.setattr(ray, "shutdown", self.shutdown)
        monkeypatch.setattr(ray, "is_initialized", lambda: self.initialized)
        monkeypatch.setattr(_ray, "recorded_cluster_address", lambda: self.recorded)
        # The token check before joining asks Ray too: a cluster that needs no token.
        monkeypatch.setattr(_ray, "reload_auth_settings", lambda: None)
        monkeypatch.setattr(_ray, "enable_token_auth_if_token_found", lambda: None)
        monkeypatch.setattr(_ray, "gcs_token_refusal", lambda address: None)
        return self

    def init(self, **kwargs: Any) -> None:
        self.init_calls.append(kwargs)
        if self.error is not None:
            raise self.error
        self.initialized = True

    def shutdown(self) -> None:
        self.shutdowns += 1
        self.initialized = False


@pytest.fixture
def snapshot(monkeypatch: pytest.MonkeyPatch) -> ClusterSnapshot:
    """The mixed snapshot, served by a fake ``read_snapshot``; no connection made."""
    snap = mixed_snapshot()
    monkeypatch.setattr(cluster, "read_snapshot", lambda per_chip=None: snap)
    monkeypatch.setattr(cli_connect, "connect", lambda address: False)
    return snap


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner(env={"COLUMNS": "80", **(env or {})}).invoke(cli.main, ["status", *args])


def test_status_prints_the_screen(snapshot: ClusterSnapshot) -> None:
    result = invoke()
    assert result.exit_code == 0, result.output
    assert "8 TPU slice(s): 2 ready, 1 busy, 3 broken, 1 notice, 1 suspect" in result.output
    assert max(len(line) for line in result.output.splitlines()) <= 80
    for name in snapshot.slices:
        assert name in result.output


def test_status_json(snapshot: ClusterSnapshot) -> None:
    result = invoke("--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == status.status_dict(snapshot)


def test_status_passes_tpu_resource_per_chip(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[int | None] = []

    def read(per_chip: int | None = None) -> ClusterSnapshot:
        asked.append(per_chip)
        return build_snapshot([], {})

    monkeypatch.setattr(cluster, "read_snapshot", read)
    monkeypatch.setattr(cli_connect, "connect", lambda address: False)
    assert invoke("--tpu-resource-per-chip", "2").exit_code == 0
    assert invoke().exit_code == 0
    assert asked == [2, None]


def test_watch_refreshes_until_ctrl_c(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []
    pauses: list[float] = []

    def read(per_chip: int | None = None) -> ClusterSnapshot:
        reads.append(1)
        return mixed_snapshot()

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 3:
            raise KeyboardInterrupt

    fake = FakeRay().install(monkeypatch)
    monkeypatch.setattr(cluster, "read_snapshot", read)
    monkeypatch.setattr(cli, "pause", pause)
    result = invoke("--watch", "0.5")
    assert result.exit_code == 0, result.output
    assert (len(reads), pauses) == (3, [0.5, 0.5, 0.5])
    assert "8 TPU slice(s)" in result.output
    assert fake.shutdowns == 1


def test_watch_json_prints_one_object_per_refresh(
    snapshot: ClusterSnapshot, monkeypatch: pytest.MonkeyPatch
) -> None:
    pauses: list[float] = []

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(cli, "pause", pause)
    result = invoke("--json", "--watch")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert [json.loads(line) for line in lines] == [status.status_dict(snapshot)] * 2
    assert pauses == [2.0, 2.0]


NO_CLUSTER = ConnectionError(
    "Could not find any running Ray instance. Please specify the one to connect to by "
    "setting `--address` flag or `RAY_ADDRESS` environment variable."
)


def test_no_cluster_is_one_line_and_exit_1(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    fake = FakeRay(error=NO_CLUSTER).install(monkeypatch)
    result = invoke()
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        "Error: no running Ray cluster on this machine; start one with `tpuslice simulate`, "
        "or pass --address HOST:PORT"
    ]
    assert "Traceback" not in result.output
    assert fake.init_calls == [{"address": "auto", "log_to_driver": False, "logging_level": 30}]
    assert fake.shutdowns == 0


def test_unreachable_address_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Something listens (the probe passes) but Ray cannot join it."""
    fake = FakeRay(error=ConnectionError("Failed to connect to Ray cluster")).install(monkeypatch)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        result = invoke("--address", address)
    assert result.exit_code == 1
    assert f"no running Ray cluster at {address}; start one with" in result.output
    assert fake.init_calls[0]["address"] == address


def test_ray_address_env_nobody_answers_fails_fast_without_ray(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeRay(error=NO_CLUSTER).install(monkeypatch)
    result = invoke(env={"RAY_ADDRESS": "127.0.0.1:1"})  # loopback, nothing listens
    assert result.exit_code == 1
    assert "no running Ray cluster at 127.0.0.1:1" in result.output
    assert "tpuslice simulate" in result.output
    assert fake.init_calls == []  # the probe answered before Ray's minutes of retries


@pytest.mark.parametrize("args", [["--address", "local"], []])
def test_address_local_is_refused_before_ray_starts_anything(
    args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeRay().install(monkeypatch)
    result = invoke(*args, env={"RAY_ADDRESS": "local"})
    assert result.exit_code == 2
    assert "would start a new Ray cluster" in result.output
    assert fake.init_calls == []


def test_malformed_address_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeRay(error=ValueError("Invalid address format: nope")).install(monkeypatch)
    result = invoke("--address", "nope")
    assert result.exit_code == 2
    assert "Ray address 'nope' is not valid: expected HOST:PORT" in result.output
    assert fake.init_calls == []


def test_disconnects_after_connecting_even_on_error(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeRay().install(monkeypatch)

    def broken_read(per_chip: int | None = None) -> ClusterSnapshot:
        raise RuntimeError("GCS went away")

    monkeypatch.setattr(cluster, "read_snapshot", broken_read)
    result = invoke()
    assert isinstance(result.exception, RuntimeError)
    assert fake.shutdowns == 1
    monkeypatch.setattr(cluster, "read_snapshot", lambda per_chip=None: mixed_snapshot())
    assert invoke().exit_code == 0
    assert fake.shutdowns == 2


def test_already_connected_process_is_left_connected(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeRay(initialized=True).install(monkeypatch)
    assert cli_connect.connect(None) is False
    with cli_connect.connected("127.0.0.1:1"):  # never probed: already connected
        pass
    assert fake.init_calls == []
    assert fake.shutdowns == 0


def test_connect_returns_true_when_it_connected(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe reaches a loopback listener this test starts; then Ray (faked) joins."""
    fake = FakeRay().install(monkeypatch)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        assert cli_connect.connect(address) is True
    assert fake.init_calls == [{"address": address, "log_to_driver": False, "logging_level": 30}]


def test_states_in_json_are_the_enum_values() -> None:
    data = status.status_dict(mixed_snapshot())
    assert {s["state"] for s in data["slices"]} == {s.value for s in SliceState}


def test_a_recorded_cluster_that_is_gone_fails_fast_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No --address, no RAY_ADDRESS: Ray would join the cluster it recorded as last
    started here, and retry it for minutes if it is gone; we probe it first."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    fake = FakeRay(recorded="127.0.0.1:1").install(monkeypatch)  # loopback; nothing listens
    result = invoke()
    assert result.exit_code == 1
    assert "the last one started here (127.0.0.1:1, recorded by Ray) does not answer" in (
        result.output
    )
    assert fake.init_calls == []


def test_a_recorded_cluster_that_answers_is_joined(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        recorded = f"127.0.0.1:{listener.getsockname()[1]}"
        fake = FakeRay(recorded=recorded).install(monkeypatch)
        assert cli_connect.connect(None) is True
    assert fake.init_calls == [{"address": "auto", "log_to_driver": False, "logging_level": 30}]


def test_a_recorded_tpu_owner_makes_an_idle_host_busy_and_is_shown() -> None:
    """Ray's resources say every host is free; an agent saw a process owning host 2's
    TPU. The slice is busy with the owner named, in the table, the JSON and the owners
    view."""
    nodes = tpu_slice("v6e-16-a", "v6e-16", "4x4", 4, 4.0)
    owner = "pid 4242 (python notebook.py)"
    snapshot = build_snapshot(nodes, {}, tpu_owners={nodes[2]["NodeID"]: owner})
    info = snapshot.slices["v6e-16-a"]
    assert info.state is SliceState.BUSY
    assert info.reason == f"1/4 hosts in use; host 2: TPU held by {owner}"
    data = status.status_dict(snapshot)
    assert data["slices"][0]["hosts"][2]["tpu_owner"] == owner
    assert data["slices"][0]["hosts"][2]["state"] == "busy"
    console = Console(width=120, record=True)
    console.print(status.owners_table(snapshot))
    shown = console.export_text()
    assert "v6e-16-a" in shown and owner in shown


# --- the queue ---------------------------------------------------------------------------


def queued_snapshot(written_at: float = 999.0) -> ClusterSnapshot:
    from dataclasses import replace

    from tpuslice._view.queue_record import QueuedRequest, QueueRecord

    requests = (
        QueuedRequest("t1", "v6e-16 4x4", (2, 2), 5, "pid 11 on host-a", 940.0, 1),
        QueuedRequest(
            "t2", "v6e-16 4x4", (1, 3), 0, "pid 22 on host-b", 990.0, 2, reason="behind 1"
        ),
        QueuedRequest("t3", "v6e-8 2x4", (1, 1), 0, "pid 33 on host-c", 999.0, 3, ("v6e-8-a",)),
    )
    return replace(mixed_snapshot(), queue=QueueRecord(written_at, requests))


def test_the_queue_is_shown_in_serving_order_with_wait_priority_and_driver() -> None:
    out = render(status.render_status(queued_snapshot(), 160), width=160)
    assert "queue: 3 request(s) waiting" in out
    rows = [line.split() for line in out.splitlines() if "pid " in line]
    assert [row[:3] for row in rows] == [["1", "5", "2"], ["2", "0", "1..3"], ["3", "0", "1"]]
    assert [row[6] for row in rows] == ["60", "10", "1"]  # seconds waited, at 1000
    assert "granted v6e-8-a" in out and "behind 1" in out
    narrow = render(status.render_status(queued_snapshot(), 80), width=80)
    assert max(len(line) for line in narrow.splitlines()) <= 80
    assert "…" not in narrow


def test_a_stale_queue_record_is_not_shown() -> None:
    snapshot = queued_snapshot(written_at=900.0)  # 100 s before the snapshot
    assert "queue:" not in render(status.render_status(snapshot, 80))
    assert status.status_dict(snapshot)["queue"] == []


def test_json_has_the_queue() -> None:
    queue = json.loads(json.dumps(status.status_dict(queued_snapshot())))["queue"]
    assert [(q["ticket"], q["position"], q["count"], q["waited_s"]) for q in queue] == [
        ("t1", 1, [2, 2], 60.0),
        ("t2", 2, [1, 3], 10.0),
        ("t3", 3, [1, 1], 1.0),
    ]
    assert queue[0]["who"] == "pid 11 on host-a" and queue[0]["priority"] == 5


def test_run_without_a_cluster_and_no_tty_says_how_to_get_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO())  # not a terminal: nobody to ask
    with pytest.raises(click.ClickException, match="--simulate"):
        _offer_simulator(SliceSpec("v6e", "4x4"), simulate=False)
