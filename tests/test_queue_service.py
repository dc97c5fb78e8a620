"""The queue service (what the queue actor runs), on an in-memory cluster. Pure.

It reads the cluster itself (busy slices are running work, so nothing needs rebuilding
after a restart), drops waiters whose drivers' jobs are dead as soon as they fall quiet,
publishes a record for status, and keeps kinds apart.
"""

from __future__ import annotations

from collections.abc import Collection

from tpuslice._reserve.queue.book import Granted, Never, Waiting
from tpuslice._reserve.queue.service import QueueService, SliceKind, Ticket
from tpuslice._reserve.request import SliceRequest
from tpuslice._view.queue_record import QueuedRequest, QueueRecord
from tpuslice.testing.memory import InMemoryCluster


def kind(topology: str = "4x4") -> SliceKind:
    return SliceKind(SliceRequest(topology=topology, accelerator_version="v6e").plan.shape, 1)


def ticket(name: str, count: int = 1, *, topology: str = "4x4", job: str = "j1") -> Ticket:
    return Ticket(name, kind(topology), (count, count), 0, f"pid {name}", job)


class World:
    def __init__(self, cluster: InMemoryCluster) -> None:
        self.cluster = cluster
        self.dead: set[str] = set()
        self.records: list[QueueRecord] = []
        stamps = iter(range(10**9, 10**10, 10**9))  # one second apart
        self.service = QueueService(
            cluster.snapshot,
            publish=self.records.append,
            dead_jobs=self.dead_of,
            clock=cluster.clock.now,
            stamp=lambda: next(stamps),
            wall=cluster.clock.now,
            decide_every_s=0.0,
        )

    def dead_of(self, jobs: Collection[str]) -> set[str]:
        return set(jobs) & self.dead


def test_a_waiter_whose_job_died_leaves_as_soon_as_it_falls_quiet() -> None:
    cluster = InMemoryCluster([("v6e", "4x4", 1)])
    busy = cluster.take("v6e-16-0", 0, {"TPU": 4})
    world = World(cluster)
    world.service.enqueue(ticket("gone", job="dead-job"))
    world.service.enqueue(ticket("alive", job="live-job"))
    world.dead.add("dead-job")
    cluster.clock.t = 0.5  # "gone" has not polled for 0.5 s: far less than its lease
    cluster.remove_group(busy)
    assert world.service.wait("alive") == Granted(("v6e-16-0",))
    assert [r.ticket for r in world.records[-1].requests] == ["alive"]


def test_a_quiet_waiter_of_a_live_job_keeps_its_place() -> None:
    cluster = InMemoryCluster([("v6e", "4x4", 1)])
    busy = cluster.take("v6e-16-0", 0, {"TPU": 4})
    world = World(cluster)
    world.service.enqueue(ticket("slow"))
    world.service.enqueue(ticket("next", job="j2"))
    cluster.clock.t = 2.0
    cluster.remove_group(busy)
    assert isinstance(world.service.wait("next"), Waiting)
    assert world.service.book.granted("slow") == ("v6e-16-0",)


def test_kinds_are_granted_apart_and_the_record_says_who_waits_for_what() -> None:
    cluster = InMemoryCluster([("v6e", "4x4", 1), ("v6e", "2x4", 1)])
    big = cluster.take("v6e-16-0", 0, {"TPU": 4})
    world = World(cluster)
    world.service.enqueue(ticket("a"))
    world.service.enqueue(ticket("b", topology="2x4"))
    assert world.service.wait("b") == Granted(("v6e-8-1",))  # another kind: not held up
    assert isinstance(world.service.wait("a"), Waiting)
    record = world.records[-1]
    assert [(r.ticket, r.kind, r.wanted, r.position) for r in record.requests] == [
        ("a", "v6e-16 4x4", "1", 1),
        ("b", "v6e-8 2x4 (8 chips/host)", "1", 2),
    ]
    assert record.requests[1].granted == ("v6e-8-1",)
    assert record.requests[0].since == 1.0  # its arrival, in wall-clock seconds
    assert "1 more when running work gives them back" in record.requests[0].reason
    assert QueueRecord.from_json(record.to_json()) == record
    cluster.remove_group(big)
    world.service.claimed("b")
    assert world.service.wait("a") == Granted(("v6e-16-0",))


def test_a_request_larger_than_its_kind_is_told_never() -> None:
    cluster = InMemoryCluster([("v6e", "4x4", 2)])
    world = World(cluster)
    world.service.enqueue(ticket("huge", 3))
    answer = world.service.wait("huge")
    assert isinstance(answer, Never) and "the cluster has 2" in answer.reason


def test_a_stale_record_describes_no_queue() -> None:
    cluster = InMemoryCluster([("v6e", "4x4", 1)])
    cluster.take("v6e-16-0", 0, {"TPU": 4})
    world = World(cluster)
    world.service.enqueue(ticket("a"))
    world.service.decide()
    record = world.records[-1]
    assert [r.ticket for r in record.requests] == ["a"]
    assert record.fresh(1.0)
    assert not record.fresh(100.0)


def test_a_restarted_service_keeps_the_places_of_its_last_record() -> None:
    """The queue dies with two waiters; the new one, given the old record, grants the
    slice freed before the first waiter is back to that waiter, not to the second one
    who came back sooner."""
    cluster = InMemoryCluster([("v6e", "4x4", 1)])
    busy = cluster.take("v6e-16-0", 0, {"TPU": 4})
    old = World(cluster)
    first = old.service.enqueue(ticket("first"))
    second = old.service.enqueue(ticket("second", job="j2"))
    old.service.decide()
    last = QueueRecord.from_json(old.records[-1].to_json())  # as read back from the KV
    new = World(cluster)
    new.service.expect(last.requests)
    assert [(r.ticket, r.who) for r in new.service.record().requests] == [
        ("first", "pid first"),
        ("second", "pid second"),
    ]
    new.service.enqueue(ticket("second", job="j2"), second)
    cluster.remove_group(busy)
    assert isinstance(new.service.wait("second"), Waiting)
    new.service.enqueue(ticket("first"), first)
    assert new.service.wait("first") == Granted(("v6e-16-0",))


def test_a_request_that_arrives_during_a_read_of_no_kinds_waits_for_the_next_one() -> None:
    """The read began with no one waiting, so it covers no slices: the first request of
    its kind, which arrived meanwhile, is neither granted nor told it can never be, and
    the next decision (due at once) reads its slices and grants it."""
    cluster = InMemoryCluster([("v6e", "4x4", 1)])
    service = World(cluster).service
    read = service.reader()
    service.enqueue(ticket("first"))
    service.apply(read())
    answer = service.answer("first")
    assert isinstance(answer, Waiting) and "reads the v6e-16 4x4 slices next" in answer.reason
    assert service.due()
    assert service.decide() == {"first": ("v6e-16-0",)}


def test_a_driver_back_after_a_restart_is_not_told_never_by_a_read_of_no_kinds() -> None:
    """A restarted queue keeps the places of the waiters its last record lists; its first
    read covers no slices (no driver is back yet). The driver that takes its place over
    is told where it stands by a decision that read its slices, not that it can never be
    served."""

    cluster = InMemoryCluster([("v6e", "4x4", 1)])
    busy = cluster.take("v6e-16-0", 0, {"TPU": 4})
    service = World(cluster).service
    request = QueuedRequest(
        ticket="back",
        kind=kind().key,
        count=(1, 1),
        priority=0,
        who="pid back",
        since=1.0,
        position=1,
        arrival=10**9,
    )
    service.expect([request])
    service.decide()  # no driver back yet: nothing read
    service.enqueue(ticket("back"), 10**9)
    assert not isinstance(service.answer("back"), Never)
    service.decide()
    assert isinstance(service.answer("back"), Waiting)
    cluster.remove_group(busy)
    service.decide()
    assert service.answer("back") == Granted(("v6e-16-0",))
