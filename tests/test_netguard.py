"""The network guard itself (tests/netguard): what it refuses, what it lets through, and
that it reaches child processes and the workers on simulated hosts."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
import ray
import sitecustomize as netguard

from conftest import NetGuardLog
from tpuslice.testing import SimulatedCluster

OFF_MACHINE = "10.0.0.1"  # a private address on no interface here; nothing is sent to it


class Expected:
    """What the guard logged since the test began (the test tripped it on purpose)."""

    def __init__(self, log: NetGuardLog) -> None:
        self.log = log
        self.start = log.size()

    def logged(self) -> str:
        return self.log.read_from(self.start)


@pytest.fixture
def expected(netguard_log: NetGuardLog) -> Iterator[Expected]:
    """Hands over what the test logs, then forgets it so the session check passes."""
    seen = Expected(netguard_log)
    yield seen
    netguard_log.forget_from(seen.start)


def listener(host: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.bind((host, 0))
    sock.listen()
    return sock


def test_tcp_off_the_machine_is_refused_and_logged(expected: Expected) -> None:
    with pytest.raises(ConnectionRefusedError, match="would leave this machine"):
        socket.create_connection((OFF_MACHINE, 6379), timeout=1)
    assert f"connect to {OFF_MACHINE}:6379" in expected.logged()


def test_name_lookup_of_another_host_is_refused(expected: Expected) -> None:
    with pytest.raises(ConnectionRefusedError):
        socket.getaddrinfo("metadata.google.internal", 80)
    assert "metadata.google.internal" in expected.logged()


def test_loopback_and_this_machines_own_address_are_allowed(netguard_log: NetGuardLog) -> None:
    before = netguard_log.size()
    own = sorted(a for a in netguard.own_addresses() if ":" not in a and a != "127.0.0.1")
    for host in ["127.0.0.1", "localhost", *own]:
        with listener("0.0.0.0") as server:
            port = server.getsockname()[1]
            socket.create_connection((host, port), timeout=2).close()
    assert netguard_log.size() == before


def test_udp_connect_sends_nothing_and_is_allowed_but_a_datagram_is_not(
    expected: Expected,
) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.connect((OFF_MACHINE, 53))  # what Ray does to learn its outward address
        assert expected.logged() == ""
        with pytest.raises(ConnectionRefusedError):
            udp.send(b"x")
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp,
        pytest.raises(ConnectionRefusedError),
    ):
        udp.sendto(b"x", (OFF_MACHINE, 53))


def test_a_child_python_process_is_guarded_too(expected: Expected) -> None:
    code = f"import socket; socket.create_connection(({OFF_MACHINE!r}, 80), timeout=1)"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert child.returncode != 0
    assert "NetGuardError" in child.stderr
    assert f"connect to {OFF_MACHINE}:80" in expected.logged()


@ray.remote(num_cpus=0)
def reach_out(host: str) -> str:
    try:
        socket.create_connection((host, 80), timeout=1).close()
    except OSError as exc:
        return type(exc).__name__
    return "connected"


@pytest.mark.cluster
def test_workers_on_simulated_hosts_are_guarded(
    tpu_cluster: SimulatedCluster, expected: Expected
) -> None:
    assert ray.get(reach_out.remote(OFF_MACHINE), timeout=60) == "NetGuardError"
    assert f"connect to {OFF_MACHINE}:80" in expected.logged()
