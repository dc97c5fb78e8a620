"""Run a shell command on every host of a reserved slice, like ``gcloud ... ssh --worker=all``:
output streamed back by line, exit codes collected per host. Each host runs it in its own
process group, with the slice context; cancelling the task kills the group."""

from __future__ import annotations

import os
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import ray

from tpuslice._host.context import MEGASCALE_VARS, HostContext
from tpuslice._reserve.reserve import SliceHandle, ranks, record_of
from tpuslice._run.run import call_env
from tpuslice._tpu.labels import CallEnv
from tpuslice.errors import first_line

KILLED = 128 + signal.SIGKILL
CANCEL_GRACE_S = 5.0
"""How long Ctrl-C waits for the hosts to kill their commands before giving up."""


@dataclass(frozen=True)
class HostResult:
    """How the command ended on one host: ``exit_code`` is 128 + signal number if a signal
    ended it, :data:`KILLED` if the task ended before reporting one (``error`` says why)."""

    context: HostContext
    exit_code: int
    seconds: float
    error: str = ""
    exception: BaseException | None = None


def command_on_host(env: CallEnv, command: str) -> Iterator[tuple[str, str | int]]:
    """Run on the host as a streaming task, with ``env`` set (None: unset) and stale
    ``MEGASCALE_*`` dropped; yield ``("line", text)`` per line of stdout and stderr, then
    ``("exit", code)``."""
    inherited = {k: v for k, v in os.environ.items() if k not in MEGASCALE_VARS}
    child_env = {k: v for k, v in {**inherited, **env}.items() if v is not None}
    proc = subprocess.Popen(
        command,
        shell=True,
        env=child_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,  # its own process group, killed as one below
    )
    guard = _guard(proc.pid)
    try:
        assert proc.stdout is not None
        for line in _lines(proc.stdout.fileno()):
            yield ("line", line)
        code = proc.wait()
        yield ("exit", 128 - code if code < 0 else code)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        guard.kill()
        guard.wait()


GUARD = """
import os, signal, sys, time
worker, group = int(sys.argv[1]), int(sys.argv[2])
while os.getppid() == worker:
    time.sleep(0.2)
try:
    os.killpg(group, signal.SIGKILL)
except ProcessLookupError:
    pass
"""
"""Kills the command's process group once the task's process is gone: Ray may SIGKILL it
before it handles a cancel, and the command, in its own session, would run on for ever."""


def _guard(group: int) -> subprocess.Popen[bytes]:
    """Start the :data:`GUARD` for ``group`` (its own session; no site packages)."""
    return subprocess.Popen(
        [sys.executable, "-S", "-c", GUARD, str(os.getpid()), str(group)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


READ_WAIT_S = 0.2
"""Longest ``select`` on the command's output: Ray's cancel raises ``KeyboardInterrupt``
only between bytecodes, which a task blocked in ``read()`` would never reach."""


def _lines(fd: int) -> Iterator[str]:
    """The lines read from ``fd`` until end of file, without newlines."""
    pending = b""
    while True:
        readable, _, _ = select.select([fd], [], [], READ_WAIT_S)
        if not readable:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        pieces = (pending + chunk).splitlines(keepends=True)
        pending = b""
        if not pieces[-1].endswith(b"\n"):  # unterminated, or a \r whose \n may follow
            pending = pieces.pop()
        for line in pieces:
            yield line.rstrip(b"\r\n").decode(errors="replace")
    if pending:
        yield pending.rstrip(b"\r\n").decode(errors="replace")


_command_on_host = ray.remote(num_returns="streaming")(command_on_host)


Printer = Callable[[HostContext, str], None]


def run_command(spg: SliceHandle, command: str, on_line: Printer) -> list[HostResult]:
    """Run ``command`` on every host of ``spg``, passing each output line to ``on_line``,
    and return one result per host in rank order. A lost host cancels the others' commands
    (an SPMD gang cannot go on without it); Ctrl-C cancels all, within :data:`CANCEL_GRACE_S`.
    """
    started = time.monotonic()
    streams = []
    for rank in ranks(record_of(spg)):
        task = _command_on_host.options(**rank.task_options())
        streams.append((rank.context, task.remote(call_env(spg, rank.context), command)))

    def cancel_all() -> None:
        for _, stream in streams:
            ray.cancel(stream, force=False)

    results: list[HostResult | None] = [None] * len(streams)
    threads = [
        threading.Thread(
            target=_follow,
            args=(rank, context, stream, on_line, results, started, cancel_all),
            name=f"tpuslice-run-{rank}",
            daemon=True,
        )
        for rank, (context, stream) in enumerate(streams)
    ]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            while thread.is_alive():
                thread.join(timeout=0.1)
    except KeyboardInterrupt:
        cancel_all()
        # Let each task kill its command; one still running is stopped outright (its guard
        # kills the command): removing the slice's groups ends no task outside them.
        deadline = time.monotonic() + CANCEL_GRACE_S
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        for (_, stream), thread in zip(streams, threads, strict=True):
            if thread.is_alive():
                ray.cancel(stream, force=True)
        raise
    return [r for r in results if r is not None]


def _follow(
    rank: int,
    context: HostContext,
    stream: Any,
    on_line: Printer,
    results: list[HostResult | None],
    started: float,
    on_lost: Callable[[], None],
) -> None:
    """Drain one host's stream into ``on_line``; record its exit code or error (a lost host
    calls ``on_lost``)."""
    code, error, lost = KILLED, "", None
    try:
        for ref in stream:
            kind, payload = ray.get(ref)
            if kind == "line":
                on_line(context, str(payload))
            else:
                code = int(payload)
    except ray.exceptions.RayError as exc:
        lost = exc
        error = f"{type(exc).__name__}: {first_line(exc)}"
    results[rank] = HostResult(context, code, time.monotonic() - started, error, lost)
    if lost is not None and not isinstance(lost, ray.exceptions.TaskCancelledError):
        on_lost()


def program_name(command: str) -> str:
    """The program a command line runs first (unquoted when it can be; ``""`` if blank): for
    logs, as arguments can hold secrets."""
    try:
        words = shlex.split(command)
    except ValueError:  # unbalanced quotes: the shell's error to report, not ours
        words = command.split()
    return words[0] if words else ""


def worst_exit_code(results: Sequence[HostResult]) -> int:
    """The exit code a ``--worker=all`` run reports: the largest, 0 only if all are 0."""
    return max((r.exit_code for r in results), default=0)
