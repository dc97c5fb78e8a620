"""``tpuslice queue start``: a cluster's set-up step that starts the slice queue and waits
for it. CliRunner with the connection and the queue replaced. No cluster."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from tpuslice.cli import commands
from tpuslice.errors import QueueUnreachableError


@contextlib.contextmanager
def nowhere(address: str | None) -> Iterator[None]:
    yield


def test_queue_start_waits_for_the_queue_and_says_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    waited: list[float] = []
    monkeypatch.setattr(commands, "connected", nowhere)
    monkeypatch.setattr(commands.queue_actor, "start_queue", waited.append)
    result = CliRunner().invoke(commands.main, ["queue", "start", "--timeout", "7"])
    assert result.exit_code == 0, result.output
    assert "the slice queue is running" in result.output
    assert waited == [7.0]


def test_queue_start_that_gets_no_answer_fails_saying_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def silent(timeout_s: float) -> None:
        raise QueueUnreachableError("the slice queue did not answer: timed out")

    monkeypatch.setattr(commands, "connected", nowhere)
    monkeypatch.setattr(commands.queue_actor, "start_queue", silent)
    result = CliRunner().invoke(commands.main, ["queue", "start"])
    assert result.exit_code == 1
    assert "did not answer" in result.output
