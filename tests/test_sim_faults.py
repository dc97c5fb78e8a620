"""Simulated faults that outlive a process (tpuslice._sim.faults): a TPU that hangs whoever
opens it, and a host its peers cannot reach. No Ray: real processes under a temporary
host root, with the environment Ray gives a job's workers."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuslice._host.tpu_lock import find_owner
from tpuslice._sim import faults
from tpuslice._sim.libtpu import HOST_ROOT_ENV

CONNECT = textwrap.dedent(
    """
    import socket, sys, time
    from pathlib import Path
    from tpuslice._sim.faults import install_network_faults
    print(install_network_faults(Path(sys.argv[1])), flush=True)
    for port in sys.argv[2:]:
        s = socket.socket()
        s.settimeout(0.3)
        started = time.monotonic()
        try:
            s.connect(("127.0.0.1", int(port)))
            print("connected", flush=True)
        except TimeoutError as exc:
            print(f"dropped {exc.errno} {time.monotonic() - started:.2f}", flush=True)
        finally:
            s.close()
    """
)

LISTEN = textwrap.dedent(
    """
    import socket, sys
    from pathlib import Path
    from tpuslice._sim.faults import install_network_faults
    install_network_faults(Path(sys.argv[1]))
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    print(s.getsockname()[1], flush=True)
    sys.stdin.readline()
    """
)


@pytest.fixture
def hosts(tmp_path: Path) -> list[Path]:
    """Two host roots of one simulator (``<root>/<slice>/<worker>``), 4 chips each."""
    roots = [tmp_path / "v6e-8-a" / str(worker) for worker in (0, 1)]
    for root in roots:
        (root / "dev").mkdir(parents=True)
        (root / "tmp").mkdir()
        for chip in range(4):
            (root / "dev" / f"accel{chip}").touch()
    return roots


@pytest.fixture
def server() -> Iterator[socket.socket]:
    """A listening socket in this process: a peer that answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s
    s.close()


def run(code: str, root: Path, *args: str, job: bool = True, **env: str) -> list[str]:
    environ = {k: v for k, v in os.environ.items() if k != faults.JOB_ENV}
    environ.update(
        {HOST_ROOT_ENV: str(root), **env, **({faults.JOB_ENV: "01000000"} if job else {})}
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(root), *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.split("\n")[:-1]


def test_faults_stand_until_cleared_and_unknown_ones_are_refused(hosts: list[Path]) -> None:
    faults.set_fault(hosts[0], faults.UNREACHABLE)
    assert faults.has_fault(hosts[0], faults.UNREACHABLE)
    assert not faults.has_fault(hosts[0], faults.TPU_HANGS)
    assert not faults.has_fault(hosts[1], faults.UNREACHABLE)
    faults.clear_faults(hosts[0])
    assert not faults.has_fault(hosts[0], faults.UNREACHABLE)
    with pytest.raises(ValueError, match="unknown fault 'slow'; known: tpu-hangs, unreachable"):
        faults.set_fault(hosts[0], "slow")


def test_work_on_an_unreachable_host_has_its_connections_dropped_after_its_timeout(
    hosts: list[Path], server: socket.socket
) -> None:
    port = str(server.getsockname()[1])
    assert run(CONNECT, hosts[0], port) == ["True", "connected"]
    faults.set_fault(hosts[0], faults.UNREACHABLE)
    installed, answer = run(CONNECT, hosts[0], port)
    word, code, waited = answer.split()
    assert (installed, word, int(code)) == ("True", "dropped", errno.ETIMEDOUT)
    assert 0.25 <= float(waited) < 5  # waited for its own timeout, as a dropped SYN does


def test_the_hosts_metadata_server_and_rays_own_processes_are_not_cut_off(
    hosts: list[Path], server: socket.socket
) -> None:
    faults.set_fault(hosts[0], faults.UNREACHABLE)
    port = server.getsockname()[1]
    metadata = {faults.METADATA_ENV: f"127.0.0.1:{port}"}
    assert run(CONNECT, hosts[0], str(port), **metadata) == ["True", "connected"]
    assert run(CONNECT, hosts[0], str(port), job=False) == ["False", "connected"]


def test_peers_cannot_reach_a_port_that_work_on_an_unreachable_host_bound(
    hosts: list[Path], server: socket.socket
) -> None:
    faults.set_fault(hosts[0], faults.UNREACHABLE)
    environ = {**os.environ, HOST_ROOT_ENV: str(hosts[0]), faults.JOB_ENV: "01000000"}
    listener = subprocess.Popen(
        [sys.executable, "-c", LISTEN, str(hosts[0])],
        env=environ,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert listener.stdout is not None
        bound = listener.stdout.readline().strip()
        other = str(server.getsockname()[1])
        answers = run(CONNECT, hosts[1], bound, other)
        assert answers[1].startswith("dropped") and answers[2] == "connected"
    finally:
        listener.kill()
        listener.wait(timeout=30)


HOLD = textwrap.dedent(
    """
    from tpuslice._sim.libtpu import open_tpu
    print("opening", flush=True)
    open_tpu()
    print("opened", flush=True)
    """
)


def test_a_wedged_tpu_is_owned_by_the_process_that_opened_it_which_then_hangs(
    hosts: list[Path],
) -> None:
    faults.set_fault(hosts[0], faults.TPU_HANGS)
    environ = {**os.environ, HOST_ROOT_ENV: str(hosts[0])}
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD], env=environ, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "opening"
        # Polled until the lock shows: a look that starts before the lock is taken can
        # find the devices opened just after, and so name the owner without its lock.
        deadline = time.monotonic() + 30
        while not ((owner := find_owner(hosts[0])) and owner.holds_lock):
            assert time.monotonic() < deadline, f"no lock taken; found {owner}"
            time.sleep(0.02)
        assert owner.pid == proc.pid
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=1.0)  # it owns the TPU and never gets on
    finally:
        proc.kill()
        proc.wait(timeout=30)
    faults.clear_faults(hosts[0])  # repaired: the next process opens it and goes on
    assert run(HOLD, hosts[0], job=False) == ["opening", "opened"]
