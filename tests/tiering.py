"""The suite's order and its quick failure, as a pytest plugin (loaded by conftest.py):
the tests that need no cluster run first, then those that start clusters of their own,
then those on the session's shared cluster. When a test of the first tier fails, the
run stops before any cluster starts, so a whole run reports a logic error within its
first minute and still reports every failure of the cluster tier otherwise.

A test whose whole work is one child process that starts a cluster of its own (marked
``early_process(command)``, and given the finished process by the ``early_process``
fixture) has that process started when the run starts, so that its cluster runs while
the first tier does, on the core that tier leaves idle. Every such process has ended
before the first cluster test starts, so no two clusters run at once."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest

# The network guard conftest.py put on the path and imported (tests/netguard).
import sitecustomize as netguard

SESSION_CLUSTER_FIXTURES = frozenset({"simulated_cluster", "tpu_cluster"})
PURE_FAILED = pytest.StashKey[str]()
EARLY_MARK = "early_process"
EARLY_TIMEOUT_S = 180.0
"""How long an early process may run from its start, as the tests that start one bound it."""


@dataclass
class Early:
    """A test's child process, started when the run started, in a session of its own (a
    Ctrl-C reaches it once, from :meth:`finish`); its output goes to files."""

    proc: subprocess.Popen[bytes]
    out: IO[bytes]
    err: IO[bytes]
    guard_log: Path
    deadline: float
    result: subprocess.CompletedProcess[str] | None = None
    timed_out: bool = False
    refused: str = ""
    """What the network guard refused the process (and its children)."""

    @classmethod
    def start(cls, command: Sequence[str]) -> Early:
        # Closed by finish(): the process outlives this call.
        out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()  # noqa: SIM115
        handle, guard_log = tempfile.mkstemp(prefix="tpuslice-netguard-early-", suffix=".log")
        os.close(handle)
        proc = subprocess.Popen(
            list(command),
            stdout=out,
            stderr=err,
            env=early_env(guard_log),
            start_new_session=True,
        )
        return cls(proc, out, err, Path(guard_log), time.monotonic() + EARLY_TIMEOUT_S)

    def finish(self, *, stop: bool = False) -> subprocess.CompletedProcess[str]:
        """Wait for the process until its deadline (``stop``: not at all), interrupt it
        as Ctrl-C would if it still runs (so it stops its cluster), and kill its whole
        session if that does not end it; its exit code and output. Idempotent."""
        if self.result is not None:
            return self.result
        try:
            self.proc.wait(timeout=0 if stop else max(0.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.timed_out = not stop
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.result = subprocess.CompletedProcess(
            self.proc.args, self.proc.returncode, _read(self.out), _read(self.err)
        )
        self.out.close()
        self.err.close()
        self.refused = self.guard_log.read_text(errors="replace")
        self.guard_log.unlink(missing_ok=True)
        return self.result


def _read(file: IO[bytes]) -> str:
    file.seek(0)
    return file.read().decode("utf-8", "replace")


EARLY = pytest.StashKey[dict[str, Early]]()


def early_env(guard_log: str) -> dict[str, str]:
    """The environment an early process gets: this one's, without a cluster's address, and
    with a network guard log of its own (a refusal is then its test's, not that of the
    test running meanwhile)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["COLUMNS"] = "80"
    env[netguard.LOG_ENV] = guard_log
    return env


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{EARLY_MARK}(command): the test's one child process, started when the run starts "
        "(while the tests that need no cluster run) and handed over by the "
        f"{EARLY_MARK} fixture",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    """Start the early processes, if tests of the first tier run meanwhile."""
    session.stash[EARLY] = {}
    if session.config.option.collectonly or not any(tier(i) == 0 for i in session.items):
        return
    for item in session.items:
        mark = item.get_closest_marker(EARLY_MARK)
        if mark is not None:
            session.stash[EARLY][item.nodeid] = Early.start(mark.args[0])


def pytest_sessionfinish(session: pytest.Session) -> None:
    """An early process whose test did not run (the run stopped) is stopped."""
    for early in session.stash.get(EARLY, {}).values():
        early.finish(stop=True)


@pytest.fixture
def early_process(request: pytest.FixtureRequest) -> subprocess.CompletedProcess[str]:
    """The test's ``early_process`` command, finished: started early if the run did so,
    else now."""
    mark = request.node.get_closest_marker(EARLY_MARK)
    assert mark is not None, f"{request.node.nodeid} has no {EARLY_MARK} mark"
    early = request.session.stash.get(EARLY, {}).pop(request.node.nodeid, None)
    if early is None:
        early = Early.start(mark.args[0])
    done = early.finish()
    assert not early.timed_out, f"{mark.args[0]} still ran after {EARLY_TIMEOUT_S:.0f} s"
    assert not early.refused, f"a connection off this machine was attempted:\n{early.refused}"
    return done


def tier(item: pytest.Item) -> int:
    """0: needs no cluster; 1: starts clusters of its own; 2: uses the session's."""
    if item.get_closest_marker("cluster") is None:
        return 0
    return 2 if SESSION_CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())) else 1


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The pure tier first, so its failures show within a minute; then the tests that
    start clusters of their own, before the session's cluster is up to share the 2 cores
    with them; then the rest, in order."""
    items.sort(key=tier)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    """Remember the first failing test of the pure tier."""
    report = yield
    if report.failed and tier(item) == 0 and PURE_FAILED not in item.session.stash:
        item.session.stash[PURE_FAILED] = item.nodeid
    return report


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Stop before the first cluster test if the pure tier failed: a logic error is
    reported at once, not after minutes of cluster tests that it may fail too. Otherwise
    let the early processes finish first, so that no two clusters run at once."""
    if tier(item) == 0:
        return
    failed = item.session.stash.get(PURE_FAILED, None)
    if failed is not None:
        item.session.shouldstop = (
            f"a test that needs no cluster failed ({failed}); fix it, then run the cluster "
            "tier (python -m pytest -m cluster) or the whole suite again"
        )
        pytest.skip("the run stops: a test that needs no cluster failed")
    for early in item.session.stash.get(EARLY, {}).values():
        early.finish()  # its test reads the outcome; stopped at its deadline at the latest
