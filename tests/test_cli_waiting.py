"""What `tpuslice run` shows while its reservation waits, and its messages in the command
line's terms. Pure: snapshots are built, and no cluster runs."""

from __future__ import annotations

import io
import os
from dataclasses import replace

import pytest
from rich.console import Console

from clusterutil import wait_for
from test_status import queued_snapshot
from tpuslice.cli import waiting
from tpuslice.cli.waiting import WaitLine, in_cli_terms, wait_line
from tpuslice.errors import ReservationTimeoutError

REASON = "wants 2 idle v6e-16 4x4 slices: 1 of 2 busy"


def ours(snapshot: object, pid: int) -> object:
    """The snapshot with its first waiting request made this process's."""
    record = snapshot.queue  # type: ignore[attr-defined]
    first, *rest = record.requests
    mine = replace(first, who=f"pid {pid} on host-a (job 01000000)", reason=REASON)
    return replace(snapshot, queue=replace(record, requests=(mine, *rest)))  # type: ignore[type-var]


def test_the_line_names_the_wait_the_place_and_the_queues_reason() -> None:
    snapshot = queued_snapshot()
    requests = [r for r in snapshot.queued() if not r.granted]
    assert requests, "the snapshot has waiting requests"
    first = min(requests, key=lambda r: r.position)
    mine = ours(snapshot, 4242)
    line = wait_line("1 x v6e 4x4", 3.4, 8.0, mine, 4242)  # type: ignore[arg-type]
    assert line.startswith("waiting 3 s of 8 s for 1 x v6e 4x4: ")
    if first.position == 1:
        assert "first in the cluster's queue" in line
    else:
        assert f"{first.position - 1} request(s) ahead" in line
    assert line.endswith(f"; {REASON}")
    assert "nothing" not in line


def test_a_request_not_in_the_queue_is_reserving_and_no_limit_shows_none() -> None:
    line = wait_line("2 x v4 2x2x2", 1.0, None, queued_snapshot(), pid=1)
    assert line == "waiting 1 s for 2 x v4 2x2x2: reserving"


def test_library_messages_name_the_commands_options() -> None:
    error = ReservationTimeoutError(
        "no idle v6e 4x4 slice within 8 s: ...; position 1 in the cluster's queue. Wait for "
        "work to finish, or pass a longer head_reservation_timeout_s"
    )
    assert str(in_cli_terms(str(error))).endswith("pass a longer --timeout")
    retry = "gave up ... Raise max_retries_failure / max_retries_preemption to retry more"
    assert in_cli_terms(retry).endswith("Raise --retries to retry more")
    assert in_cli_terms("behind 3 requests of higher priority") == (
        "behind 3 requests of higher priority"  # a word, not an option
    )


def test_the_line_is_redrawn_on_a_terminal_until_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(waiting, "REDRAW_S", 0.01)
    reads: list[int] = []

    def read() -> object:
        reads.append(1)
        return ours(queued_snapshot(), os.getpid())

    monkeypatch.setattr(waiting, "read_snapshot", read)

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200)
    with WaitLine(console, "1 x v6e 4x4", 8.0) as line:
        wait_for(lambda: len(reads) >= 3, 5, "three redraws")
        line.stop()
        drawn = len(reads)
    assert len(reads) == drawn  # no redraw after the stop
    assert "cluster's queue" in out.getvalue()


def test_nothing_is_drawn_where_no_terminal_reads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []
    monkeypatch.setattr(waiting, "read_snapshot", lambda: reads.append(1))
    out = io.StringIO()
    console = Console(file=out, force_terminal=False)
    with WaitLine(console, "1 x v6e 4x4", 8.0):
        pass
    assert reads == [] and out.getvalue() == ""


def test_run_says_which_option_to_change_when_its_reservation_times_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import click

    from tpuslice._reserve.request import SliceRequest
    from tpuslice.cli import jobs

    class TimesOut:
        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        def until_done(self) -> None:
            raise ReservationTimeoutError(
                "no idle v4 2x2x2 slice within 8 s. Wait for work to finish, or pass a "
                "longer head_reservation_timeout_s"
            )

    monkeypatch.setattr(jobs, "ResilientRun", TimesOut)
    request = SliceRequest.for_run("2x2x2", "v4", 1, None, 8.0, 0, None, False)
    with pytest.raises(click.ClickException) as info:
        jobs._run_everywhere(request, ("hostname",), retries=0)
    assert info.value.message.endswith("or pass a longer --timeout")


def test_the_line_fits_the_terminal_so_it_can_be_redrawn_in_place() -> None:
    console = Console(file=io.StringIO(), force_terminal=True, width=40)
    line = WaitLine(console, "1 x v6e 4x4", 8.0)
    long = line._fit("waiting 3 s of 8 s for 1 x v6e 4x4: " + "x" * 80)
    assert len(long.plain) == 37 and long.plain.endswith("…")
    assert line._fit("short").plain == "short"
