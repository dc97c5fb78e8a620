"""`tpuslice run` and `tpuslice status` against the session's simulated cluster."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from clusterutil import wait_for
from tpuslice.cli.commands import main
from tpuslice.record import goodput
from tpuslice.testing import SimulatedCluster, live_placement_groups

pytestmark = pytest.mark.cluster


def invoke(*args: str) -> click.testing.Result:
    return CliRunner().invoke(main, list(args), env={"COLUMNS": "100"})


def test_run_prefixes_lines_and_exits_with_the_worst_code(tpu_cluster: SimulatedCluster) -> None:
    script = 'echo "rank=$TPUSLICE_RANK of $TPUSLICE_WORLD_SIZE"; exit $((TPUSLICE_RANK * 2))'
    result = invoke(
        "run", "--topology", "2x2x2", "--accelerator", "v4", "--slices", "2", "--", script
    )
    assert result.exit_code == 6, result.output
    lines = [line for line in result.output.splitlines() if "rank=" in line]
    assert len(lines) == 4
    for line in lines:
        prefix, _, text = line.partition(" ")
        assert re.fullmatch(r"\[v4-16-[a-d]/[01]\]", prefix)
        assert text.endswith("of 4")
    assert "exit codes" in result.output
    wait_for(lambda: not live_placement_groups(), timeout=30, what="slices released")


def test_run_with_argv_words_quotes_them(tpu_cluster: SimulatedCluster) -> None:
    result = invoke("run", "--topology", "2x2x2", "--accelerator", "v4", "--", "echo", "a b;c")
    assert result.exit_code == 0, result.output
    assert result.output.count("a b;c") == 2


def test_run_bad_topology_is_a_usage_error(tpu_cluster: SimulatedCluster) -> None:
    result = invoke("run", "--topology", "3x3", "--accelerator", "v6e", "--", "true")
    assert result.exit_code == 2
    assert "did you mean '4x4'" in result.output


def test_run_impossible_request_exits_1_with_the_reason(tpu_cluster: SimulatedCluster) -> None:
    result = invoke("run", "--topology", "4x8", "--accelerator", "v6e", "--", "true")
    assert result.exit_code == 1
    assert "no v6e-32 4x8 slice" in result.output


def test_status_json_on_the_live_cluster(tpu_cluster: SimulatedCluster) -> None:
    result = invoke("status", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    names = {s["name"] for s in data["slices"]}
    assert {"v4-16-a", "v6e-16-a", "v6e-8-a"} <= names


def test_run_retries_a_failed_gang_until_it_succeeds(
    tpu_cluster: SimulatedCluster, tmp_path: Path
) -> None:
    script = (
        f"if [ -e {tmp_path}/tried.$TPUSLICE_RANK ]; then echo second-try; "
        f"else touch {tmp_path}/tried.$TPUSLICE_RANK; exit 5; fi"
    )
    result = invoke(
        "run", "--topology", "2x2x2", "--accelerator", "v4", "--retries", "1", "--", script
    )
    assert result.exit_code == 0, result.output
    assert result.output.count("second-try") == 2
    assert "exit code 5" in result.output  # the failed attempt, as the event reported it
    # Its goodput account, the newest: a shell command sends no heartbeats, so the failed
    # attempt's whole time on its slice is lost, and the account says why.
    assert goodput.flush(timeout_s=10)
    shown = invoke("goodput", "--json")
    assert shown.exit_code == 0, shown.output
    account = json.loads(shown.output)
    assert (account["kind"], account["attempts"], account["outcome"]) == ("command", 2, "success")
    assert account["lost"]["failure"] > 0 and "no heartbeats" in account["notes"][0]
    assert sum(account["seconds"].values()) == pytest.approx(account["wall_s"], rel=0.01)


def test_run_retries_exhausted_reports_the_attempts(tpu_cluster: SimulatedCluster) -> None:
    result = invoke(
        "run", "--topology", "2x2x2", "--accelerator", "v4", "--retries", "1", "--", "exit 4"
    )
    assert result.exit_code == 4
    assert "gave up after 2 failed attempt(s)" in result.output
