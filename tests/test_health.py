"""Health checks' logic without a cluster: whom a failed reach points at, the TPU start
in a child process (on a temporary simulated host root), the reach check over loopback
with an in-memory KV, and how verdicts read."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuslice._run import health
from tpuslice._run.health import HostVerdict, SliceHealth, reach_blame
from tpuslice._sim import faults
from tpuslice._sim.libtpu import HOST_ROOT_ENV
from tpuslice._sim.simulated import host_pythonpath


@pytest.mark.parametrize(
    ("unreached", "peers", "blamed"),
    [
        ([], 3, set()),
        ([2], 3, {2}),  # the others reached rank 0: the one that did not is at fault
        ([1, 2, 3], 3, {0}),  # nobody reached rank 0: its port is what they share
        ([1], 1, {0, 1}),  # one link: either end
    ],
)
def test_a_failed_reach_points_at_the_hosts_it_can(
    unreached: list[int], peers: int, blamed: set[int]
) -> None:
    assert set(reach_blame(unreached, peers)) == blamed


def test_the_two_host_case_says_it_cannot_tell_which_end() -> None:
    reasons = reach_blame([1], 1)
    assert reasons[0] == reasons[1] and "cannot be told with two hosts" in reasons[0]


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process's host root: a simulated host with 4 chips."""
    host = tmp_path / "v6e-8-a" / "0"
    (host / "dev").mkdir(parents=True)
    (host / "tmp").mkdir()
    for chip in range(4):
        (host / "dev" / f"accel{chip}").touch()
    monkeypatch.setenv(HOST_ROOT_ENV, str(host))
    monkeypatch.setenv("PYTHONPATH", host_pythonpath())  # JAX finds the host's TPU
    return host


def test_a_healthy_tpu_starts_in_a_child_that_leaves_it_free(root: Path) -> None:
    ok, found = health._start_backend(30.0)
    assert ok and found.startswith("started in ")
    ok, again = health._start_backend(30.0)  # the child kept nothing: free again
    assert ok, again


def test_a_wedged_tpu_fails_at_the_bound_and_its_child_is_gone(root: Path) -> None:
    started = time.monotonic()
    assert health._start_backend(60.0)[0]
    # Long enough for the child to reach the wedged chip and hold it (a start's time), so
    # that the last start proves the killed child's hold is gone.
    bound = max(1.5 * (time.monotonic() - started), 1.5)
    faults.set_fault(root, faults.TPU_HANGS)
    ok, found = health._start_backend(bound)
    assert not ok and found.startswith(f"did not start in {bound:g} s")
    faults.clear_faults(root)
    assert health._start_backend(30.0)[0]  # the killed child holds nothing


HOLD = textwrap.dedent(
    """
    import sys
    from tpuslice._sim.libtpu import open_tpu
    open_tpu()
    print("held", flush=True)
    sys.stdin.readline()
    """
)


@pytest.fixture
def holder(root: Path) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD],
        env={**os.environ, HOST_ROOT_ENV: str(root)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    yield proc
    proc.kill()
    proc.wait(timeout=30)


def test_a_tpu_owned_by_another_process_is_refused_with_libtpus_words(
    holder: subprocess.Popen[str],
) -> None:
    ok, found = health._start_backend(30.0)
    assert not ok
    assert found.startswith("refused: ") and f"in use by process with pid {holder.pid}" in found


class FakeKV:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.data: dict[str, bytes] = {}
        monkeypatch.setattr(health._ray, "kv_put", lambda k, v, ns: self.data.__setitem__(k, v))
        monkeypatch.setattr(health._ray, "kv_get", lambda k, ns: self.data.get(k))
        monkeypatch.setattr(health.ray.util, "get_node_ip_address", lambda: "127.0.0.1")


def test_peers_reach_rank_0_through_the_address_it_publishes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    FakeKV(monkeypatch)
    listener = health._Listener("health/x/s", 2, 5.0)
    answers: list[tuple[bool, str]] = []
    peers = [
        threading.Thread(target=lambda: answers.append(health._reach("health/x/s", 5.0)))
        for _ in range(2)
    ]
    for peer in peers:
        peer.start()
    try:
        ok, seen = listener.wait()
    finally:
        listener.close()
        for peer in peers:
            peer.join(10)
    assert ok and seen.startswith("2 of 2 peer(s) reached")
    assert [a[0] for a in answers] == [True, True]
    assert all(a[1].startswith("reached rank 0 in ") for a in answers)


def test_rank_0_with_no_peer_and_a_peer_with_no_rank_0_each_say_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    FakeKV(monkeypatch)
    listener = health._Listener("health/y/s", 1, 0.3)
    try:
        ok, seen = listener.wait()
    finally:
        listener.close()
    assert (not ok and seen == "0 of 1 peer(s) reached this coordinator port within 0.3 s") or (
        not ok and seen.startswith("0 of 1 peer(s) reached this coordinator port (port ")
    )
    assert health._reach("health/none/s", 0.2) == (
        False,
        "rank 0 published no address within 0.2 s",
    )


def test_a_slice_verdict_names_each_failed_host_and_why() -> None:
    good = HostVerdict(0, "n0", True, 0.4, "started in 0.30 s", "2 of 2 peer(s)", "", "")
    bad = HostVerdict(1, "n1", False, None, "-", "-", "", "did not answer in time")
    result = SliceHealth("v6e-16-a", (good, bad), 12.34)
    assert not result.ok and result.failed == (bad,)
    text = result.describe()
    assert text.splitlines()[0] == "v6e-16-a: 1 host(s) failed (checked in 12.3 s)"
    assert "host 1: FAILED: did not answer in time; answered -" in text
    assert "host 0: ok; answered 0.40 s; tpu started in 0.30 s" in text
    assert SliceHealth("v6e-16-a", (good,), 1.0).ok


def test_rank_0_listens_on_a_free_port_when_the_coordinators_is_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another process on the host holds the coordinator's port: rank 0 listens on a free
    one, publishes that one, and its verdict says why."""
    import contextlib
    import socket

    from tpuslice._tpu.compat import DEFAULT_COORDINATOR_PORT

    published: dict[str, bytes] = {}
    monkeypatch.setattr(
        health._ray, "kv_put", lambda key, value, ns: published.update({key: value})
    )
    monkeypatch.setattr(health.ray.util, "get_node_ip_address", lambda: "127.0.0.1")
    holder = socket.socket()
    try:
        with contextlib.suppress(OSError):  # someone else holds it: taken either way
            holder.bind(("", DEFAULT_COORDINATOR_PORT))
        listener = health._Listener("check/key", 0, 1.0)
        try:
            port = listener.sock.getsockname()[1]
            assert port != DEFAULT_COORDINATOR_PORT
            assert published == {"check/key": f"127.0.0.1:{port}".encode()}
            ok, seen = listener.wait()
        finally:
            listener.close()
    finally:
        holder.close()
    assert ok
    assert seen.endswith(f"(port {DEFAULT_COORDINATOR_PORT} taken here: a free one)")
