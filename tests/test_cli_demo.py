"""The CLI commands that start their own simulated cluster, run as a user would (a child
process). This file sorts before the cluster tests, so it normally runs before the
session's shared cluster starts; the demo starts with the run, while the tests that need
no cluster run (``tests/tiering.py``). (`tpuslice simulate` is shown by test_auth, whose
cluster it starts.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.cluster

TPUSLICE = [sys.executable, "-m", "tpuslice.cli"]


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["COLUMNS"] = "80"
    return env


@pytest.mark.early_process([*TPUSLICE, "demo"])
def test_demo_runs_end_to_end_and_gives_everything_back(
    early_process: subprocess.CompletedProcess[str],
) -> None:
    out = early_process
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert "2 TPU slice(s): 2 ready, 0 busy, 0 broken" in text
    assert "placement groups left: 0" in text
    assert re.search(r"done in \d+ s; cluster stopped", text)
    # rank order and the two-slice MEGASCALE ids, as printed
    assert re.search(r"│ 0\s+│ v4-16-\w\s+│ 0\s+│ v4-16-\w\s+│ 0", text)
    assert re.search(r"│ 3\s+│ v4-16-\w\s+│ 1\s+│ 2\s+│ 1\s", text)
    assert max(len(line) for line in text.splitlines()) <= 80


def test_status_without_a_cluster_says_how_to_start_one() -> None:
    env = clean_env()
    env["RAY_ADDRESS"] = "127.0.0.1:1"  # nothing listens there
    out = subprocess.run(
        [*TPUSLICE, "status"], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 1
    assert "tpuslice simulate" in out.stderr
    assert "Traceback" not in out.stderr
