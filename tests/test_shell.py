"""The host side of `tpuslice run`: one command's output, exit code and cancellation,
run here as a plain generator (no Ray)."""

from __future__ import annotations

import _thread
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from clusterutil import wait_for
from tpuslice._run.shell import command_on_host, program_name


def run(command: str, env: dict[str, str | None] | None = None) -> list[tuple[str, str | int]]:
    return list(command_on_host(env or {}, command))


def test_lines_then_the_exit_code() -> None:
    assert run("echo one; echo two >&2; exit 3") == [("line", "one"), ("line", "two"), ("exit", 3)]


def test_crlf_lone_cr_and_an_unterminated_last_line() -> None:
    events = run(r"printf 'a\r\nb\rc\n'; printf 'd\r'; sleep 0.3; printf '\ne'")
    assert events == [
        ("line", "a"),
        ("line", "b"),
        ("line", "c"),
        ("line", "d"),
        ("line", "e"),
        ("exit", 0),
    ]


def test_a_multibyte_character_split_across_reads_is_kept() -> None:
    events = run(r"printf '\303'; sleep 0.3; printf '\251t\n'")
    assert events == [("line", "\u00e9t"), ("exit", 0)]


def test_a_signal_death_is_128_plus_the_signal() -> None:
    assert run("kill -TERM $$")[-1] == ("exit", 128 + signal.SIGTERM)


def test_env_is_added_removed_and_stale_megascale_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEGASCALE_NUM_SLICES", "9")
    monkeypatch.setenv("GONE", "x")
    events = run(
        'echo "${MEGASCALE_NUM_SLICES:-unset} ${GONE:-unset} $ADDED"',
        {"ADDED": "yes", "GONE": None},
    )
    assert events[0] == ("line", "unset unset yes")


def test_an_interrupt_stops_a_silent_command_and_kills_its_group() -> None:
    # Ray cancels a running task (force=False) with _thread.interrupt_main(): no real signal
    # reaches a thread blocked in read(), so the task must come back to Python by itself.
    events = command_on_host({}, "echo $$; sleep 6175 & wait")
    kind, pid = next(events)
    assert kind == "line"
    group = int(pid)
    rescue = threading.Timer(20, os.killpg, (group, signal.SIGKILL))  # never hang the suite
    rescue.start()
    threading.Timer(0.5, _thread.interrupt_main).start()
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            next(events)
    finally:
        rescue.cancel()
    assert time.monotonic() - started < 5
    wait_for(lambda: not _alive(group), timeout=5, what="the shell and its child gone")


def _alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_command_dies_with_the_process_that_ran_it(tmp_path: Path) -> None:
    # A host task's process SIGKILLed (its placement group removed before it handled the
    # cancel): no finally runs there, yet its command must not outlive it.
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent.parent / "src")!r})
        from tpuslice._run.shell import command_on_host
        events = command_on_host({{}}, "echo $$; exec sleep 6176")
        print(next(events)[1], flush=True)
        import time; time.sleep(600)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    group = int(proc.stdout.readline())
    try:
        assert _alive(group)
        proc.kill()  # SIGKILL: as Ray ends a worker
        proc.wait(timeout=10)
        wait_for(lambda: not _alive(group), timeout=10, what="the command killed by its guard")
    finally:
        if _alive(group):
            os.killpg(group, signal.SIGKILL)


@pytest.mark.parametrize(
    ("line", "program"),
    [
        ("python train.py --token s3cret", "python"),
        ("'/opt/my app/run' -x", "/opt/my app/run"),
        ("echo 'unbalanced", "echo"),  # the shell rejects it; naming it must not raise
        ("   ", ""),
    ],
)
def test_only_the_program_is_named(line: str, program: str) -> None:
    assert program_name(line) == program
