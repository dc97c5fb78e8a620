"""A slice handed back free changes hands before the queue reads the cluster again. Pure.

The hand-back saw Ray's view show the slice free, so the queue grants it from its last
read with only that slice changed, and the full decision still follows. Anything besides
its work that kept the slice from being ready (a dead host, a TPU owner, a host's own
notice, a suspect host) keeps it from being granted that way, as does a read made before a
lull (no one waited, so no one read) and a hand-back that did not see the slice free.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from test_queue_runner import BOUND_S, Slices, run, ticket
from tpuslice._host.notices import Notice
from tpuslice._reserve.queue.book import Granted, Waiting
from tpuslice._reserve.queue.service import QueueService, SliceKind, Ticket
from tpuslice._tpu import _ray
from tpuslice._tpu.topology import slice_shape
from tpuslice._view.cluster import ClusterSnapshot, SliceInfo, SliceState, as_freed, wait_freed
from tpuslice._view.holders import QUEUE_SOURCE, Holder
from tpuslice.testing.memory import InMemoryCluster, MemoryGroup

KIND = SliceKind(slice_shape("4x4", "v6e"), 1)


def wait_ticket(name: str) -> Ticket:
    return Ticket(name, KIND, (1, 1), 0, f"pid {name}", "job")


def urgent_ticket(name: str) -> Ticket:
    return Ticket(name, KIND, (1, 1), 5, f"pid {name}", "job")


class Held:
    """Two v6e 4x4 slices, both held by other work, and a queue service that counts its
    reads of the cluster (decisions happen only when a test applies one)."""

    def __init__(self) -> None:
        self.cluster = InMemoryCluster([("v6e", "4x4", 2)])
        self.names = sorted(self.cluster.slice_hosts)
        self.groups: dict[str, MemoryGroup] = {
            name: self.cluster.take(name, 0, {"TPU": 4}) for name in self.names
        }
        self.reads = 0
        self.holders: dict[str, Holder] = {}
        self.service = QueueService(
            self._snapshot,
            holders=lambda: dict(self.holders),
            clock=self.cluster.clock.now,
            wall=self.cluster.clock.now,
            decide_every_s=60.0,
        )

    def _snapshot(self, per_chip: int) -> ClusterSnapshot:
        self.reads += 1
        return self.cluster.snapshot(per_chip)

    def hand_back(self, name: str, *, freed: bool = True) -> None:
        """The work on ``name`` ends: its groups and holder record go, and the queue is
        told."""
        self.cluster.remove_group(self.groups.pop(name))
        self.holders.pop(name, None)
        self.service.released([name], freed=freed)

    def record(self, name: str, *, preemptible: bool) -> None:
        """The work on ``name`` recorded itself as its holder."""
        self.holders[name] = Holder(
            f"holder-{name}", name, "team", 0, preemptible, self.cluster.clock.now(), "pid 1"
        )

    def notice(self, name: str, *, source: str = "") -> None:
        """A notice on worker 0 of ``name``: a metadata server's, or ``source``'s."""
        node = self.cluster.slice_hosts[name][0]
        now = self.cluster.clock.now()
        self.cluster.notices[node] = Notice(
            "preemption", "TRUE", now, now + 30, node, name, 0, source=source
        )

    def quick(self) -> dict[str, tuple[str, ...]] | None:
        """A decision on the quick reading, if there is one."""
        reading = self.service.quick_reading()
        return None if reading is None else self.service.apply(reading)


def held_info(world: Held, name: str) -> SliceInfo:
    return world.cluster.snapshot(1).slices[name]


def test_a_freed_slice_is_granted_from_the_last_read_without_reading_again() -> None:
    world = Held()
    world.service.enqueue(wait_ticket("w"))
    assert world.service.apply(world.service.read()) == {}
    world.hand_back(world.names[0])
    assert world.quick() == {"w": (world.names[0],)}
    assert world.reads == 1
    answer = world.service.answer("w")
    assert isinstance(answer, Granted)
    (view,) = answer.view
    assert view.state is SliceState.READY
    assert all(h.tpu_available == h.tpu_total for h in view.hosts.values())
    assert world.service.due()  # the full decision still follows the quick one


def test_only_the_slices_handed_back_change_in_the_quick_reading() -> None:
    world = Held()
    first, second = world.names
    world.service.enqueue(wait_ticket("w1"))
    world.service.enqueue(wait_ticket("w2"))
    world.service.apply(world.service.read())
    world.cluster.remove_group(world.groups.pop(second))  # ended, but not reported
    world.hand_back(first)
    assert world.quick() == {"w1": (first,)}
    assert world.service.apply(world.service.read()) == {"w2": (second,)}


def test_a_read_that_began_before_a_hand_back_does_not_count_its_slice_twice() -> None:
    """The slice was granted from the hand-back's report while a read was under way; that
    read still shows the work that left. Counted as that work's and as the grant's, it
    would offer the preemptible work that left as a victim to the next urgent request."""
    world = Held()
    first = world.names[0]
    world.service.enqueue(urgent_ticket("u1"))
    world.service.apply(world.service.read())
    world.record(first, preemptible=True)
    world.service.enqueue(urgent_ticket("u2"))
    reading = world.service.reader()()  # a read under way before the hand-back below
    world.hand_back(first)
    assert world.quick() == {"u1": (first,)}
    assert world.service.apply(reading) == {}
    assert not world.service.take_orders().notices
    answer = world.service.answer("u1")
    assert isinstance(answer, Granted) and answer.slices == (first,)
    assert isinstance(world.service.answer("u2"), Waiting)


def test_a_slice_granted_quickly_and_claimed_is_never_granted_again() -> None:
    """Two hand-backs while one read is under way, the first slice claimed in between:
    the second quick decision and the read must both leave the claimed slice to its
    claimant."""
    world = Held()
    first, second = world.names
    for name in ("w1", "w2", "w3"):
        world.service.enqueue(wait_ticket(name))
    world.service.apply(world.service.read())
    reading = world.service.reader()()  # a read under way before both hand-backs
    world.hand_back(first)
    assert world.quick() == {"w1": (first,)}
    world.groups[first] = world.cluster.take(first, 0, {"TPU": 4})
    world.service.claimed("w1")
    world.hand_back(second)
    assert world.quick() == {"w2": (second,)}
    assert world.service.apply(reading) == {}
    assert isinstance(world.service.answer("w3"), Waiting)


def test_a_quick_decision_grants_only_the_slices_just_handed_back() -> None:
    """The first slice was idle at the last read and taken since by someone outside the
    queue; only a new read can show that, so a quick decision must not grant it."""
    world = Held()
    first, second = world.names
    world.cluster.remove_group(world.groups.pop(first))
    world.service.enqueue(wait_ticket("gone"))
    world.service.enqueue(wait_ticket("w"))
    assert world.service.apply(world.service.read()) == {"gone": (first,)}
    world.service.leave("gone")
    world.groups[first] = world.cluster.take(first, 0, {"TPU": 4})
    world.hand_back(second)
    assert world.quick() == {"w": (second,)}


def test_a_freed_slice_without_its_holder_record_is_no_ones() -> None:
    """The holder record of the work that left is dropped with it: the slice, idle, is
    not that work's to be preempted or charged for."""
    world = Held()
    first, _ = world.names
    world.record(first, preemptible=True)
    world.service.enqueue(wait_ticket("w"))
    world.service.apply(world.service.read())
    world.cluster.remove_group(world.groups.pop(first))
    world.service.released([first], freed=True)  # its record not deleted yet
    reading = world.service.quick_reading()
    assert reading is not None
    assert first not in reading.holders


def test_a_hand_back_that_did_not_see_the_slice_free_waits_for_the_read() -> None:
    world = Held()
    world.service.enqueue(wait_ticket("w"))
    world.service.apply(world.service.read())
    world.hand_back(world.names[0], freed=False)
    assert world.service.quick_reading() is None
    assert world.service.apply(world.service.read()) == {"w": (world.names[0],)}


def test_no_quick_grant_from_a_read_made_before_a_lull() -> None:
    world = Held()
    world.service.enqueue(wait_ticket("w"))
    world.service.apply(world.service.read())
    world.service.leave("w")  # no one waits: no one reads
    world.service.enqueue(wait_ticket("w2"))
    world.hand_back(world.names[0])
    assert world.service.quick_reading() is None
    assert world.service.apply(world.service.read()) == {"w2": (world.names[0],)}


def test_a_read_slowed_by_load_still_grants_the_freed_slice_at_once() -> None:
    """While someone waits the reads follow one another, however long each takes."""
    world = Held()
    world.service.enqueue(wait_ticket("w"))
    world.service.apply(world.service.read())
    world.cluster.clock.t += 10.0  # the next read is slow to come back
    world.service.book.touch(["w"])
    world.hand_back(world.names[0])
    assert world.quick() == {"w": (world.names[0],)}
    assert world.reads == 1


def test_no_quick_reading_before_any_read() -> None:
    world = Held()
    world.service.enqueue(wait_ticket("w"))
    world.hand_back(world.names[0])
    assert world.service.quick_reading() is None


@pytest.mark.parametrize(
    "trouble",
    ["suspect host", "metadata notice", "tpu owner", "dead host"],
)
def test_a_slice_kept_from_ready_by_more_than_its_work_is_not_granted_quickly(
    trouble: str,
) -> None:
    world = Held()
    name = world.names[0]
    if trouble == "suspect host":
        world.cluster.suspect(name, 1)
    elif trouble == "metadata notice":
        world.notice(name)
    elif trouble == "tpu owner":
        node = world.cluster.slice_hosts[name][1]
        world.cluster.recorded_owners[node] = "pid 4242 (python train.py)"
    else:
        world.cluster.kill_host(name, 1)
    world.service.enqueue(wait_ticket("w"))
    world.service.apply(world.service.read())
    world.hand_back(name)
    assert world.service.quick_reading() is None
    assert isinstance(world.service.answer("w"), Waiting)


def test_the_queues_own_notice_does_not_keep_a_freed_slice_from_the_next_waiter() -> None:
    world = Held()
    name = world.names[0]
    world.notice(name, source=QUEUE_SOURCE)  # its work was told to leave, and now has
    world.service.enqueue(wait_ticket("w"))
    world.service.apply(world.service.read())
    world.hand_back(name)
    assert world.quick() == {"w": (name,)}


def test_as_freed_frees_every_host_and_keeps_the_rest_of_the_slice() -> None:
    world = Held()
    name = world.names[0]
    before = held_info(world, name)
    assert before.state is SliceState.BUSY
    after = as_freed(before)
    assert after is not None
    assert after.state is SliceState.READY and after.reason == ""
    assert after.idle
    assert [h.node_id for h in after.hosts.values()] == [h.node_id for h in before.hosts.values()]
    assert after.hosts[0].head_free is True


def test_as_freed_keeps_a_metadata_notice_and_drops_the_queues() -> None:
    world = Held()
    first, second = world.names
    world.notice(first)
    world.notice(second, source=QUEUE_SOURCE)
    assert as_freed(held_info(world, first)) is None
    freed = as_freed(held_info(world, second))
    assert freed is not None and freed.notice is None


# --- through the runner --------------------------------------------------------------


class Gate:
    """A cluster read that can be held shut, to show what is answered without one."""

    def __init__(self, slices_of: list[Slices]) -> None:
        self.open = threading.Event()
        self.open.set()
        self.entered = threading.Event()
        self._slices_of = slices_of

    def snapshot(self, per_chip: int) -> ClusterSnapshot:
        self.entered.set()
        assert self.open.wait(4 * BOUND_S), "the test never opened the gate"
        return self._slices_of[0].cluster.snapshot(per_chip)


def test_the_runner_answers_a_freed_slices_waiter_while_the_next_read_is_held() -> None:
    async def scenario() -> None:
        holder: list[Slices] = []
        gate = Gate(holder)
        slices = Slices(1, snapshot=gate.snapshot)
        holder.append(slices)
        name = slices.names[0]
        await slices.enqueue(ticket("a"))
        ask = asyncio.ensure_future(slices.ask("a"))
        await slices.settled()
        gate.open.clear()
        gate.entered.clear()
        slices.cluster.remove_group(slices.held.pop(name))
        await slices.runner.released([name], freed=True)
        try:
            answer = await asyncio.wait_for(asyncio.shield(ask), BOUND_S)
            assert isinstance(answer, Granted) and answer.slices == (name,)
            assert slices.runner.quick_grants == 1
            # The full decision began, and is held at its read: the grant came first.
            assert await asyncio.to_thread(gate.entered.wait, BOUND_S)
        finally:
            gate.open.set()
        await slices.settled()

    run(scenario)


def test_a_hand_back_that_no_longer_sees_a_host_does_not_report_its_slice_free(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A host gone from Ray's view stops the wait for it, but the slice is not whole:
    the hand-back must not vouch for it."""
    world = Held()
    hosts = list(held_info(world, world.names[0]).hosts.values())
    every = {h.node_id: {"TPU": h.tpu_total} for h in hosts}
    monkeypatch.setattr(_ray, "available_resources_per_node", lambda: every)
    assert wait_freed(hosts, None)
    gone = {n: free for n, free in every.items() if n != hosts[1].node_id}
    monkeypatch.setattr(_ray, "available_resources_per_node", lambda: gone)
    assert not wait_freed(hosts, None)


def test_a_quick_decision_never_says_a_request_can_never_be_served() -> None:
    """The quick decision offers only the slice just handed back: it cannot count the one
    kept idle for the request since the last full read, so it must not judge that the
    cluster is too small for it. The full decision then grants both."""
    world = Held()
    world.service.enqueue(Ticket("pair", KIND, (2, 2), 0, "pid pair", "job"))
    world.hand_back(world.names[0], freed=False)
    assert world.service.apply(world.service.read()) == {}  # the first kept idle for it
    world.hand_back(world.names[1])
    assert world.quick() == {}
    assert isinstance(world.service.answer("pair"), Waiting)
    assert world.service.apply(world.service.read()) == {"pair": tuple(world.names)}
