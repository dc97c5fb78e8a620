"""``tpuslice goodput``: one run's account, and ``--cluster``'s slice-seconds by state, driven
through click's CliRunner with the connection and the store's reads replaced. No cluster
runs; the renderers are checked on accounts written out by hand."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from tpuslice.cli import goodput as cli_goodput
from tpuslice.cli import goodput_view
from tpuslice.cli.commands import main
from tpuslice.record import goodput, slice_seconds
from tpuslice.record.goodput import (
    CATEGORIES,
    LOST_CAUSES,
    Account,
    AttemptTimes,
    GangProgress,
    account_of,
)

BAR_GLYPHS = set(goodput_view.CATEGORY_GLYPHS.values())


def account(run_id: str, started_at: float = 1_750_000_000.0, **seconds: float) -> Account:
    """An account whose wall time is the sum of the given categories' seconds."""
    lost = {"preemption": seconds.get("lost", 0.0)}
    return Account(
        run_id=run_id,
        kind="resilient",
        what="2 x v6e 4x4",
        started_at=started_at,
        wall_s=sum(seconds.values()),
        seconds={c: seconds.get(c, 0.0) for c in CATEGORIES},
        lost={c: lost.get(c, 0.0) for c in LOST_CAUSES},
        attempts=2,
        outcome="success",
    )


class Store:
    """The store's reads and the connection, replaced; counts the connections asked for."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, accounts: list[Account]) -> None:
        self.accounts = accounts
        self.connections: list[str | None] = []
        self.windows: list[float] = []
        self.slice_seconds: dict[str, dict[str, float]] = {}
        monkeypatch.setattr(goodput, "read_accounts", self.read_accounts)
        monkeypatch.setattr(slice_seconds, "read_slice_seconds", self.read_slice_seconds)
        monkeypatch.setattr(cli_goodput, "connected", self.connected)

    def connected(self, address: str | None) -> AbstractContextManager[None]:
        self.connections.append(address)
        return nullcontext()

    def read_accounts(self, limit: int = goodput.MAX_ACCOUNTS) -> list[Account]:
        assert self.connections, "read before connecting"
        return self.accounts[-limit:]

    def read_slice_seconds(self, since_s: float) -> dict[str, dict[str, float]]:
        assert self.connections, "read before connecting"
        self.windows.append(since_s)
        return self.slice_seconds


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    older = account("0a1b2c3d4e5f", 1_749_990_000.0, productive=50.0, lost=50.0)
    newest = account("9f8e7d6c5b4a", productive=90.0, starting=10.0)
    yield Store(monkeypatch, [older, newest])


def invoke(*args: str, columns: int = 80) -> Result:
    return CliRunner(env={"COLUMNS": str(columns)}).invoke(main, ["goodput", *args])


def bar_line(output: str) -> str:
    """The line made only of bar glyphs."""
    found = [line for line in output.splitlines() if line and set(line) <= BAR_GLYPHS]
    assert len(found) == 1, output
    return found[0]


def row(output: str, label: str) -> list[str]:
    """The cells after ``label`` on the table row that has it as its label (a row ends in
    a share; the legend's lines do not)."""
    for line in output.splitlines():
        cells = line.split()
        if label in cells and cells[-1].endswith("%"):
            return cells[cells.index(label) + 1 :]
    raise AssertionError(f"no row {label!r} in:\n{output}")


# --- one run -----------------------------------------------------------------------------


def test_without_a_run_id_the_newest_account_is_shown(store: Store) -> None:
    result = invoke()
    assert result.exit_code == 0, result.output
    assert "run 9f8e7d6c5b4a: resilient, 2 x v6e 4x4, success after 2 attempt(s)" in result.output
    assert "0a1b2c3d4e5f" not in result.output
    assert "wall 1 min 40 s from " in result.output and "90% productive" in result.output
    assert store.connections == [None]


def test_the_table_has_every_category_its_share_and_the_lost_seconds_by_cause(
    store: Store,
) -> None:
    result = invoke("0a1b")
    assert result.exit_code == 0, result.output
    assert row(result.output, "productive")[-2:] == ["50.0", "50.0%"]
    assert row(result.output, "lost")[-2:] == ["50.0", "50.0%"]
    assert row(result.output, "preemption") == ["50.0", "50.0%"]
    assert row(result.output, "wall") == ["100.0", "100.0%"]
    for category in CATEGORIES:
        if category not in ("productive", "lost"):
            assert row(result.output, category)[-2:] == ["0.0", "0.0%"]
    lines = result.output.splitlines()
    below = lines[next(i for i, line in enumerate(lines) if " lost " in line) + 1]
    assert "preemption" in below  # the causes are right under lost
    assert "host_failure" not in result.output  # no seconds lost to it


def test_a_unique_prefix_or_a_whole_id_picks_the_run(store: Store) -> None:
    store.accounts.append(account("0a1b2c3d4e5f00", productive=1.0))
    picked = invoke("9f8")
    assert picked.exit_code == 0, picked.output
    assert "run 9f8e7d6c5b4a:" in picked.output
    exact = invoke("0a1b2c3d4e5f")  # also a prefix of the other id: the whole id wins
    assert exact.exit_code == 0, exact.output
    assert "run 0a1b2c3d4e5f:" in exact.output


def test_an_ambiguous_prefix_names_the_runs_it_matches(store: Store) -> None:
    store.accounts.append(account("0a1bffffffff", productive=1.0))
    result = invoke("0a1b")
    assert result.exit_code == 2, result.output
    assert "run id prefix '0a1b' matches 2 runs: 0a1bffffffff, 0a1b2c3d4e5f" in result.output
    assert "give more of the id" in result.output


def test_an_unknown_run_lists_the_newest_ids_and_how_to_see_the_newest(store: Store) -> None:
    store.accounts += [account(f"{n:012x}", productive=1.0) for n in range(1, 8)]
    result = invoke("zzz")
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    assert "no run 'zzz' among the 9 run(s) with a goodput account on this cluster" in message
    newest = ", ".join(f"{n:012x}" for n in (7, 6, 5, 4, 3))
    assert f"(newest first: {newest}, ...)" in message
    assert "`tpuslice goodput` with no argument shows the newest run" in message


@pytest.mark.parametrize("args", [[], ["9f8e"]])
def test_no_accounts_says_none_has_ended_and_when_runs_keep_one(
    store: Store, args: list[str]
) -> None:
    store.accounts.clear()
    result = invoke(*args)
    assert result.exit_code == 1, result.output
    message = " ".join(result.output.split())
    assert "no run has ended on this cluster yet" in message
    assert "runs keep an account when they end" in message


def test_json_is_the_accounts_own_dict(store: Store) -> None:
    noted = account("feedfacecafe", productive=3.5, lost=1.25, handing_back=0.25)
    store.accounts.append(
        Account(**{**noted.__dict__, "notes": ("no checkpoints marked",), "job": "02000000"})
    )
    result = invoke("--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == store.accounts[-1].to_dict()


def test_notes_say_what_the_account_could_not_see(store: Store) -> None:
    store.accounts.append(
        Account(**{**store.accounts[-1].__dict__, "notes": ("no heartbeats: see the docs",)})
    )
    result = invoke()
    assert "note: no heartbeats: see the docs" in result.output


# --- the bar -----------------------------------------------------------------------------


def test_a_half_and_half_run_is_two_equal_halves_of_the_bar(store: Store) -> None:
    result = invoke("0a1b")
    assert bar_line(result.output) == "p" * 30 + "x" * 30
    assert "p  productive" in result.output and "x  lost" in result.output  # the legend
    assert "q  queued" not in result.output.split("category")[0]  # no time, no legend entry


def test_a_tiny_category_still_gets_one_cell(store: Store) -> None:
    store.accounts.append(account("abcabcabcabc", productive=1000.0, handing_back=0.001))
    assert bar_line(invoke().output) == "p" * 59 + "h"


def test_the_bar_fits_a_narrow_console(store: Store) -> None:
    assert bar_line(invoke("0a1b", columns=40).output) == "p" * 20 + "x" * 20


@pytest.mark.parametrize(
    ("seconds", "width", "cells"),
    [
        ({"productive": 1.0, "lost": 1.0}, 60, [("productive", 30), ("lost", 30)]),
        ({"queued": 1.0, "productive": 2.0}, 60, [("queued", 20), ("productive", 40)]),
        (
            {"queued": 1.0, "starting": 1.0, "productive": 1.0},
            10,
            [("queued", 4), ("starting", 3), ("productive", 3)],
        ),
        (
            {"productive": 1e6, "lost": 1e-6, "recovering": 1e-6},
            60,
            [("productive", 58), ("lost", 1), ("recovering", 1)],
        ),
        ({c: 1e-3 for c in CATEGORIES} | {"productive": 1e9}, 8, [(c, 1) for c in CATEGORIES]),
        ({c: 1.0 for c in CATEGORIES}, 4, [(c, 1) for c in CATEGORIES]),  # widened to 8
        ({}, 60, []),
        ({"productive": 0.0}, 60, []),
    ],
)
def test_bar_cells_are_proportional_and_every_category_with_time_has_one(
    seconds: Mapping[str, float], width: int, cells: list[tuple[str, int]]
) -> None:
    assert goodput_view.bar_cells(seconds, width) == cells


def test_bar_cells_always_fill_the_width_in_category_order() -> None:
    for n in range(1, 200):
        seconds = {c: float((n * (i + 3)) % 17) for i, c in enumerate(CATEGORIES)}
        seconds["productive"] += 1.0  # some time, always
        found = goodput_view.bar_cells(seconds, 60)
        assert sum(cells for _, cells in found) == 60
        assert [c for c, _ in found] == [c for c in CATEGORIES if seconds[c] > 0]
        assert all(cells >= 1 for _, cells in found)


def test_wall_time_reads_as_people_write_it() -> None:
    assert goodput_view.wall_time(12.34) == "12.3 s"
    assert goodput_view.wall_time(245) == "4 min 05 s"
    assert goodput_view.wall_time(7380) == "2 h 03 min"


# --- the cluster -------------------------------------------------------------------------


def test_cluster_shows_a_table_per_pod_type_a_total_and_what_productive_means(
    store: Store,
) -> None:
    store.slice_seconds = {
        "v6e-16": {"productive": 900.0, "busy": 300.0, "idle": 1200.0, "broken": 0.0},
        "v4-16": {"idle": 600.0},
    }
    result = invoke("--cluster", columns=100)
    assert result.exit_code == 0, result.output
    assert store.windows == [3600.0] and store.connections == [None]
    assert "slice-seconds by state over the last 1h" in result.output
    tables = result.output.split("v6e-16")
    assert row(tables[0], "idle") == ["600", "100.0%"]  # v4-16 comes first
    assert row(tables[1], "productive") == ["900", "37.5%"]
    assert row(tables[1], "busy") == ["300", "12.5%"]
    assert row(tables[1], "notice") == ["0", "0.0%"]  # every state, even one not counted
    assert row(tables[1], "total") == ["2,400", "100.0%"]
    assert "total: 3,000 slice-seconds over 2 pod type(s), 30.0% productive" in result.output
    message = " ".join(result.output.split())
    assert "productive: busy with a gang that sent heartbeats in the last report" in message


def test_cluster_json_is_the_slice_seconds_and_the_window(store: Store) -> None:
    store.slice_seconds = {"v6e-16": {s: 60.0 for s in slice_seconds.TIME_USES}}
    result = invoke("--cluster", "--since", "15m", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {"since_s": 900.0, "slice_seconds": store.slice_seconds}


def test_cluster_with_nothing_counted_says_so(store: Store) -> None:
    result = invoke("--cluster", "--since", "30s")
    assert result.exit_code == 0, result.output
    assert "No slice-seconds counted on this cluster in the last 30s" in result.output


def test_a_window_longer_than_the_cluster_keeps_says_so(store: Store) -> None:
    store.slice_seconds = {"v6e-16": {"idle": 60.0}}
    result = invoke("--cluster", "--since", "2d", columns=120)
    assert store.windows == [172800.0]
    assert "the cluster keeps the last 1d of slice-seconds" in result.output


@pytest.mark.parametrize(
    ("since", "seconds"),
    [("30s", 30.0), ("15m", 900.0), ("1h", 3600.0), ("2d", 172800.0), ("90m", 5400.0)],
)
def test_since_takes_a_whole_number_and_a_unit(store: Store, since: str, seconds: float) -> None:
    result = invoke("--cluster", "--since", since)
    assert result.exit_code == 0, result.output
    assert store.windows == [seconds]
    assert goodput_view.since_label(seconds) == since


@pytest.mark.parametrize("since", ["1w", "0h", "1.5h", "h", "-1h", "1 h", "60", "1H", ""])
def test_any_other_window_is_refused_naming_the_forms_before_connecting(
    store: Store, since: str
) -> None:
    result = invoke("--cluster", "--since", since)
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    assert f"{since!r} is not a window; give a whole number and a unit: 30s, 15m, 1h or 2d" in (
        message
    )
    assert store.connections == []


def test_cluster_refuses_a_run_id_and_since_needs_cluster(store: Store) -> None:
    both = invoke("--cluster", "9f8e")
    assert both.exit_code == 2, both.output
    assert "--cluster shows the whole cluster, not one run: drop '9f8e' or drop --cluster" in (
        " ".join(both.output.split())
    )
    alone = invoke("--since", "1h")
    assert alone.exit_code == 2, alone.output
    assert "--since sets the window of --cluster" in alone.output
    assert store.connections == []


# --- the documentation -------------------------------------------------------------------

DOCS_CLI = Path(__file__).resolve().parent.parent / "docs" / "cli.md"


def documented_account() -> Account:
    """docs/cli.md's example run: queued, preempted after a checkpoint, run again."""
    at = 1_750_000_000.0
    first = AttemptTimes(
        asked=at,
        queued_s=41.0,
        held=at + 47.5,
        ended=at + 1912.0,
        hand_back=at + 1912.3,
        handed_back=at + 1914.0,
        outcome="preemption",
        progress=GangProgress(at + 102, checkpoint_at=at + 1800, checkpoint_s=36.0, checkpoints=3),
    )
    second = AttemptTimes(
        asked=at + 1930.0,
        held=at + 1975.0,
        ended=at + 4410.0,
        hand_back=at + 4410.0,
        handed_back=at + 4412.5,
        outcome="success",
        progress=GangProgress(at + 2031, checkpoint_at=at + 4300, checkpoint_s=48.0, checkpoints=4),
    )
    return account_of(
        "3f2a9c01b2e4",
        "resilient",
        [first, second],
        what="2 x v6e 4x4",
        slices=["v6e-16-c", "v6e-16-d"],
        job="02000000",
    )


DOCUMENTED_SLICE_SECONDS = {
    "v6e-16": {
        "productive": 9120.0,
        "busy": 1310.0,
        "idle": 3570.0,
        "broken": 0.0,
        "notice": 400.0,
    },
    "v4-16": {"productive": 0.0, "busy": 0.0, "idle": 7200.0, "broken": 0.0, "notice": 0.0},
}


def documented_block(first_line: str) -> list[str]:
    """The lines of docs/cli.md's ``text`` block that begins with ``first_line``."""
    lines = DOCS_CLI.read_text(encoding="utf-8").splitlines()
    start = lines.index(first_line)
    assert lines[start - 1] == "```text", f"{first_line!r} does not open a text block"
    return lines[start : lines.index("```", start)]


def shown(result: Result) -> list[str]:
    assert result.exit_code == 0, result.output
    return [line.rstrip() for line in result.output.rstrip("\n").splitlines()]


def test_the_pages_example_output_is_the_commands_own(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/cli.md shows what the command prints for these numbers (start times in UTC)."""
    monkeypatch.setattr(goodput_view.time, "localtime", time.gmtime)
    store.accounts.append(documented_account())
    store.slice_seconds = DOCUMENTED_SLICE_SECONDS
    run = shown(invoke("3f2a"))
    assert documented_block(run[0]) == run
    whole = shown(invoke("--cluster"))
    assert documented_block(whole[0]) == whole
