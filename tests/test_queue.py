"""The cluster-wide queue on the simulator, with real driver processes: priority before
arrival, a blocked two-slice request keeping its slice and granted whole, a dead waiter
leaving at once, and the queue surviving its own death with its order. The policy
(all-or-nothing grants, order, leases) is the pure tier's: test_schedule,
test_queue_book, test_queue_service, test_queue_runner, test_claim_queue."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import pytest
import ray

import tpuslice
from clusterutil import hold_host, wait_for
from tpuslice._tpu.keys import NAMESPACE
from tpuslice._tpu.keys import QUEUE_ACTOR_NAME as QUEUE_NAME
from tpuslice._view.cluster import read_snapshot
from tpuslice._view.queue_record import QueuedRequest
from tpuslice.testing import SimulatedCluster, assert_no_placement_groups, live_placement_groups

pytestmark = pytest.mark.cluster

KIND = "v4-16 2x2x2"
V4_SLICES = ["v4-16-a", "v4-16-b"]

DRIVER = textwrap.dedent(
    """
    import json, logging, sys, time, ray, tpuslice
    logging.basicConfig(format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("tpuslice").setLevel(logging.INFO)
    address, label, count, priority, hold = sys.argv[1:6]
    ray.init(address=address, log_to_driver=False)
    print("connected", flush=True)
    with tpuslice.SlicePlacementGroup(
        "2x2x2", "v4", num_slices=int(count), priority=int(priority),
        head_reservation_timeout_s=120,
    ) as spg:
        start = time.time()
        time.sleep(float(hold))
        end = time.time()
        names = spg.slice_names
    print(json.dumps({"label": label, "slices": names, "start": start, "end": end}))
    """
)


def queued() -> list[QueuedRequest]:
    return [r for r in read_snapshot().queued() if r.kind == KIND]


def start_driver(
    address: str, label: str, count: int = 1, priority: int = 0, hold: float = 0.3
) -> subprocess.Popen[str]:
    """A driver process that reserves, holds, prints what it had; returns once it is
    queued (its ticket is in the queue's record)."""
    before = len(queued())
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, address, label, str(count), str(priority), str(hold)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: len(queued()) > before, 60, f"{label} to be queued")
    return proc


@dataclass(frozen=True)
class Ran:
    slices: list[str]
    start: float
    end: float
    log: str


def results(procs: list[subprocess.Popen[str]]) -> dict[str, Ran]:
    found = {}
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
        line = json.loads(out.strip().splitlines()[-1])
        found[line["label"]] = Ran(line["slices"], line["start"], line["end"], err)
    return found


@contextmanager
def busy(*slices: str) -> Iterator[dict[str, ExitStack]]:
    """Hold a host of each slice (as a user outside the queue); each can be let go."""
    stacks = {name: ExitStack() for name in slices}
    try:
        for name, stack in stacks.items():
            stack.enter_context(hold_host(name, 1))
        yield stacks
    finally:
        for stack in stacks.values():
            stack.close()


def nothing_left() -> None:
    wait_for(lambda: not queued(), 30, "the queue to empty")
    assert_no_placement_groups()


def quick_grants() -> int:
    """Grants the queue actor made from a hand-back's report, before reading again."""
    queue = ray.get_actor(QUEUE_NAME, namespace=NAMESPACE)
    return int(ray.get(queue.counts.remote(), timeout=30)["quick_grants"])


def test_priority_across_processes(tpu_cluster: SimulatedCluster) -> None:
    """Every v4 slice busy; two drivers queue for one: a, then c at a higher priority.
    One slice is freed: c, then a, hold it in turn (each after the last gave it back),
    though a has waited longer. c's hand-back reports the slice free, and the queue
    grants it to a from that report, before it reads the cluster again. (Arrival order
    across processes is shown by the queue's restart below; the policy is
    test_queue_runner's test_priority_then_arrival_order_is_kept_through_held_asks.)"""
    with busy(*V4_SLICES) as held:
        procs = [
            start_driver(tpu_cluster.address, "a"),
            start_driver(tpu_cluster.address, "c", priority=5),
        ]
        a, c = (str(p.pid) for p in procs)
        assert [r.who.split()[1] for r in queued()] == [c, a]
        assert [r.position for r in queued()] == [1, 2]
        before = quick_grants()
        held["v4-16-a"].close()
        ran = results(procs)
    assert sorted(ran, key=lambda label: ran[label].start) == ["c", "a"]
    assert ran["c"].end <= ran["a"].start
    assert {tuple(r.slices) for r in ran.values()} == {("v4-16-a",)}
    assert quick_grants() == before + 1  # a's grant; c's followed a host outside tpuslice
    nothing_left()


def test_a_waiter_whose_driver_dies_leaves_the_queue_at_once(
    tpu_cluster: SimulatedCluster,
) -> None:
    """Killed without a word: its ticket goes as soon as Ray marks its job dead, long
    before its lease would run out. (The next waiter moving up is the pure tier's:
    test_queue_runner::test_a_waiter_whose_driver_died_leaves_while_asking_and_the_next_is_granted.)"""
    from tpuslice._reserve.queue.book import LEASE_S

    with busy(*V4_SLICES):
        doomed = start_driver(tpu_cluster.address, "doomed")
        doomed.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        doomed.wait(timeout=10)
        wait_for(lambda: not queued(), LEASE_S, "the dead waiter to leave")
        assert time.monotonic() - killed < LEASE_S / 2
    nothing_left()


def test_the_queue_comes_back_after_its_own_death_with_the_order_kept(
    tpu_cluster: SimulatedCluster,
) -> None:
    """The queue actor is killed while two drivers wait: Ray restarts it, it keeps the
    places its last record lists, the waiters enqueue again with their arrival numbers,
    and are served in their first order, whichever of them is back first."""
    with busy(*V4_SLICES) as held:
        first = start_driver(tpu_cluster.address, "first")
        second = start_driver(tpu_cluster.address, "second")
        queue = ray.get_actor("tpuslice-queue", namespace="tpuslice")
        old_pid = ray.get(queue.pid.remote(), timeout=30)
        os.kill(old_pid, signal.SIGKILL)

        def new_pid() -> bool:
            try:
                return bool(ray.get(queue.pid.remote(), timeout=30) != old_pid)
            except ray.exceptions.RayError:  # still restarting
                return False

        wait_for(new_pid, 60, "a new queue")
        wait_for(lambda: len(queued()) == 2, 30, "both waiters to enqueue again")
        assert [r.who.split()[1] for r in queued()] == [str(first.pid), str(second.pid)]
        held["v4-16-b"].close()
        ran = results([first, second])
    assert ran["first"].start < ran["second"].start, (ran["first"].log, ran["second"].log)
    nothing_left()


def test_backfill_goes_around_a_blocked_request_but_not_onto_its_slices(
    tpu_cluster: SimulatedCluster,
) -> None:
    """A request for two v4 slices is blocked (one is idle) and keeps that one for itself:
    a later one-slice v4 request waits behind it (it declares no time limit, so lending
    could delay the first), while a later v6e request, which the first cannot use, starts
    at once."""
    with busy(*V4_SLICES[1:]) as held:
        blocked = start_driver(tpu_cluster.address, "pair", count=2)
        wait_for(lambda: "1 idle kept for it" in queued()[0].reason, 30, "its earmark")
        with pytest.raises(tpuslice.ReservationTimeoutError, match="position 2"):
            tpuslice.SlicePlacementGroup("2x2x2", "v4", head_reservation_timeout_s=1.0)
        with tpuslice.SlicePlacementGroup("4x4", "v6e", head_reservation_timeout_s=5) as other:
            assert other.slice_names == ["v6e-16-a"]
        held["v4-16-b"].close()
        ran = results([blocked])
    assert ran["pair"].slices == ["v4-16-a", "v4-16-b"]
    nothing_left()


def test_with_the_queue_stopped_reservations_wait_for_it_visibly_then_go_in_order(
    tpu_cluster: SimulatedCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """The queue's process is stopped (as on an overloaded head node): two reservations
    claim nothing while they wait for it, and each says so. Once it answers again they
    are admitted in the order they were asked for: the first wants both slices, so the
    second, though its call may reach the queue first, waits for the first's hand-back."""
    from tpuslice._reserve.queue.actor import slice_queue

    queue = slice_queue()
    pid = ray.get(queue.handle.pid.remote())
    held: dict[str, float] = {}
    errors: list[BaseException] = []

    def reserve(label: str, count: int) -> None:
        try:
            with tpuslice.SlicePlacementGroup(
                "2x2x2", "v4", num_slices=count, head_reservation_timeout_s=120
            ):
                held[label] = time.monotonic()
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    def told() -> int:
        return sum("waiting for the slice queue to start" in r.message for r in caplog.records)

    threads = [
        threading.Thread(target=reserve, args=("first", 2)),
        threading.Thread(target=reserve, args=("second", 1)),
    ]
    with caplog.at_level(logging.WARNING, logger="tpuslice._reserve.claim"):
        os.kill(pid, signal.SIGSTOP)
        try:
            threads[0].start()
            wait_for(lambda: told() >= 1, timeout=60, what="the first to say it waits")
            threads[1].start()
            wait_for(lambda: told() >= 2, timeout=60, what="the second to say it waits")
            assert live_placement_groups() == []  # nothing claimed around the queue
        finally:
            os.kill(pid, signal.SIGCONT)
        for thread in threads:
            thread.join(timeout=120)
    assert not errors, errors
    assert held["first"] < held["second"]
    assert_no_placement_groups()


def test_a_driver_whose_queue_was_killed_for_good_finds_a_new_one(
    tpu_cluster: SimulatedCluster,
) -> None:
    """The queue actor is killed with no restart: this driver's next call says the queue
    is gone, and the one after finds the cluster's queue again (a new one, started on the
    head), instead of failing on the dead handle for the rest of the process."""
    from tpuslice._reserve.queue import actor as queue_actor
    from tpuslice._reserve.queue.book import Unknown
    from tpuslice.errors import QueueUnreachableError

    queue = queue_actor.slice_queue()
    old_pid = ray.get(queue.handle.pid.remote())
    ray.kill(queue.handle, no_restart=True)
    with pytest.raises(QueueUnreachableError):
        wait_for(lambda: queue.wait("no-such-ticket", 0.0) and None, timeout=30, what="its death")
    again = queue_actor.slice_queue()
    assert isinstance(again.wait("no-such-ticket", 0.0), Unknown)
    assert ray.get(again.handle.pid.remote()) != old_pid
