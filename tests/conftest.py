"""Session-wide test set-up: the network guard (tests/netguard) in this process and in
every Python process the tests start, and a check after each test that none of them
tried to reach an address off this machine."""

from __future__ import annotations

import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

GUARD_DIR = Path(__file__).parent / "netguard"
sys.path.insert(0, str(GUARD_DIR))

import sitecustomize as netguard  # noqa: E402  (tests/netguard, found through the line above)

pytest_plugins = ["tiering"]  # the order of the tiers, and stopping when the pure one fails

# A suite started in the background by a non-interactive shell inherits SIGINT ignored,
# and so would every driver and CLI it starts: the tests of Ctrl-C would then send a
# signal nobody hears. Python's own handler is reset to the default in each child.
signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_configure(config: pytest.Config) -> None:
    """Before any test or cluster starts: children inherit the log path and the guard."""
    if os.environ.get(netguard.LOG_ENV):
        log = Path(os.environ[netguard.LOG_ENV])
    else:
        handle, name = tempfile.mkstemp(prefix="tpuslice-netguard-", suffix=".log")
        os.close(handle)
        log = Path(name)
        os.environ[netguard.LOG_ENV] = str(log)
    paths = [str(GUARD_DIR), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    netguard.install()


class NetGuardLog:
    """The shared log of refused connections; tests of the guard itself read and clear it."""

    def __init__(self) -> None:
        self.path = Path(os.environ[netguard.LOG_ENV])

    def size(self) -> int:
        return self.path.stat().st_size if self.path.exists() else 0

    def read_from(self, offset: int) -> str:
        if not self.path.exists():
            return ""
        with self.path.open(encoding="utf-8", errors="replace") as f:
            f.seek(offset)
            return f.read()

    def forget_from(self, offset: int) -> None:
        """Drop entries from ``offset`` on (expected ones, in the guard's own tests)."""
        if self.path.exists():
            with self.path.open("r+", encoding="utf-8") as f:
                f.truncate(offset)


@pytest.fixture(scope="session")
def netguard_log() -> NetGuardLog:
    return NetGuardLog()


@pytest.fixture(autouse=True)
def no_connection_off_this_machine(netguard_log: NetGuardLog) -> Iterator[None]:
    """Fail the test if anything (this process or a child) tried to leave the machine."""
    start = netguard_log.size()
    yield
    grown = netguard_log.read_from(start)
    if grown:
        netguard_log.forget_from(start)
        pytest.fail(f"a connection off this machine was attempted:\n{grown}", pytrace=False)


@pytest.fixture(autouse=True)
def a_connection_of_its_own(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that does not use the session's cluster gets a connection of its own, let
    go at its end: nothing it keeps (agent handles, layouts, ...) reaches the next test,
    and it writes no events into the cluster's timeline and keeps no goodput accounts
    (pure tests of resilient runs record attempts while this process is connected)."""
    if {"tpu_cluster", "simulated_cluster"} & set(request.fixturenames):
        yield
        return
    from tpuslice._tpu import _connection, _ray
    from tpuslice.record import events, goodput

    def dropped(*args: object) -> None:
        return None

    own = _connection.Connection(_ray.connection_identity())
    for kind in (events.EventWriter, goodput.AccountWriter):
        writer = own.part(kind)
        writer._put, writer._list, writer._delete = dropped, lambda prefix: [], dropped
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_connection, "_current", own)
        yield
    own.drop()


@pytest.fixture(autouse=True)
def no_cluster_in_the_pure_tier(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test outside the cluster tier must not connect to Ray: the pure tier runs
    without a cluster, and one left connected would hide that."""
    yield
    if request.node.get_closest_marker("cluster") is None and "ray" in sys.modules:
        import ray

        assert not ray.is_initialized(), "a test outside the cluster tier connected to Ray"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A refused connection logged after the last test's check still fails the run."""
    late = NetGuardLog().read_from(0) if os.environ.get(netguard.LOG_ENV) else ""
    if late:
        sys.stderr.write(f"\nnetguard: a connection off this machine was attempted:\n{late}\n")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
