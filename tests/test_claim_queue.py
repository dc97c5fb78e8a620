"""The claiming loop with the cluster-wide queue, against an in-memory cluster. Pure.

A request that cannot be met at once, or finds others waiting for its kind, waits in the
queue holding nothing, and claims exactly what it is granted; it keeps its place through
a queue restart and a grant taken meanwhile; it leaves on timeout and Ctrl-C; with no
queue to reach it claims directly, as before, and says so once.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import pytest

from test_claim_pure import (
    HEAD,
    V6E,
    Placements,
    names,
    others_hosts,
    record_asks,
    reserver,
)
from tpuslice._reserve import claim
from tpuslice._reserve.queue.book import Granted, Waiting
from tpuslice._reserve.queue.service import REPROBE_S, QueueService, SliceKind, Ticket
from tpuslice._reserve.request import SliceRequest
from tpuslice._tpu.clock import Clock
from tpuslice._view.queue_record import RECORD_FRESH_S, QueueRecord
from tpuslice.errors import InsufficientSlicesError, QueueUnreachableError, ReservationTimeoutError
from tpuslice.testing.memory import InMemoryCluster, MemoryGroup


def free_later(cluster: InMemoryCluster, sleep: int, *groups: MemoryGroup) -> list[int]:
    """On the ``sleep``-th wait, note how many placed groups the reserver holds (pending
    autoscaler demand holds nothing), then free ``groups``; returns the notes."""
    held: list[int] = []

    def free() -> None:
        held.append(sum(1 for g in cluster.live_groups("reserver") if g.nodes))
        for group in groups:
            cluster.remove_group(group)

    cluster.script("sleep", sleep, free)
    return held


def queued_cluster(count: int = 2) -> InMemoryCluster:
    cluster = InMemoryCluster([("v6e", "4x4", count)], queue=True)
    assert cluster.queue is not None
    cluster.queue.book.lease_s = 1e9  # tickets enqueued by the test never poll
    return cluster


def queue_of(cluster: InMemoryCluster) -> QueueService:
    assert cluster.queue is not None
    return cluster.queue


def other(ticket: str, count: int = 1, priority: int = 0) -> Ticket:
    kind = SliceKind(SliceRequest(**V6E).plan.shape, 1)
    return Ticket(ticket, kind, (count, count), priority, f"driver {ticket}", "job")


def tickets(cluster: InMemoryCluster) -> list[str]:
    return [w.ticket for w, _, _ in queue_of(cluster).book.tickets()]


def test_an_uncontended_request_is_granted_in_its_first_call_and_reads_nothing_itself() -> None:
    """The queue's grant carries the slice's view: the driver reads no cluster."""
    cluster = queued_cluster()
    assert names(reserver(cluster).run()) == ["v6e-16-0"]
    assert cluster.calls["slice_queue"] == 1
    assert cluster.calls["snapshot"] == 0
    assert cluster.calls["sleep"] == 0


def test_a_request_short_of_slices_waits_holding_nothing_then_gets_all_at_once() -> None:
    """Two wanted, one idle: nothing is claimed while waiting (no hold-and-wait); when
    the other slice is given back, both are granted and claimed together."""
    cluster = queued_cluster()
    busy = cluster.take("v6e-16-1", 0, {"TPU": 4})
    held_while_waiting = free_later(cluster, 5, busy)
    reservation = reserver(cluster, num_slices=2).run()
    assert names(reservation) == ["v6e-16-0", "v6e-16-1"]
    assert held_while_waiting == [0]
    assert tickets(cluster) == []  # the ticket left once claimed


def test_a_newcomer_queues_behind_earlier_waiters_even_with_a_slice_idle() -> None:
    """An earlier request for two is blocked and keeps the idle slice for itself; a
    later one-slice request may not take it (no limit declared), and its timeout names
    its place and what is ahead."""
    cluster = queued_cluster()
    cluster.take("v6e-16-1", 0, {"TPU": 4})
    queue_of(cluster).enqueue(other("big", count=2))
    with pytest.raises(ReservationTimeoutError) as raised:
        reserver(cluster, head_reservation_timeout_s=1).run()
    message = str(raised.value)
    assert "position 2 in the cluster's queue" in message
    assert "2 x v6e-16 4x4 for driver big" in message
    assert "1 busy" in message and "1 idle" in message  # what the cluster holds
    assert tickets(cluster) == ["big"]  # ours left on timeout
    assert cluster.live_groups("reserver") == []


def test_a_host_dying_while_the_request_waits_is_named_in_its_timeout() -> None:
    """Two slices wanted, one idle (kept for the request while it waits in the queue); a
    host of that one dies meanwhile: the timeout names the broken slice and the place."""
    cluster = queued_cluster(3)
    cluster.take("v6e-16-1", 0, {"TPU": 4})
    cluster.take("v6e-16-2", 3, {"TPU": 4})
    queued_at_death: list[list[str]] = []

    def die() -> None:
        queued_at_death.append(tickets(cluster))
        cluster.kill_host("v6e-16-0", 1)

    cluster.script("sleep", 2, die)
    with pytest.raises(ReservationTimeoutError) as raised:
        reserver(cluster, num_slices=2, head_reservation_timeout_s=6).run()
    message = str(raised.value)
    assert [len(t) for t in queued_at_death] == [1]  # it died while we were queued
    assert "1 broken (v6e-16-0: host 1 dead)" in message
    assert "first in the cluster's queue" in message
    assert tickets(cluster) == []
    assert cluster.live_groups("reserver") == []


def test_a_higher_priority_request_is_served_first() -> None:
    cluster = queued_cluster(1)
    busy = cluster.take("v6e-16-0", 0, {"TPU": 4})
    queue_of(cluster).enqueue(other("early"))
    free_later(cluster, 3, busy)
    reservation = reserver(cluster, priority=5).run()
    assert names(reservation) == ["v6e-16-0"]
    assert tickets(cluster) == ["early"]


def test_the_queue_restarting_keeps_the_waiters_order(caplog: pytest.LogCaptureFixture) -> None:
    """The queue loses its book; a newcomer enqueues first in the new one; ours comes
    back with its arrival number and is still granted first."""
    cluster = queued_cluster(1)
    busy = cluster.take("v6e-16-0", 0, {"TPU": 4})
    queue = queue_of(cluster)
    stamp = queue.book.stamp

    def restart() -> None:  # the same handle, a fresh actor behind it
        QueueService.__init__(
            queue,
            queue._snapshot,
            clock=cluster.clock.now,
            stamp=stamp,
            wall=cluster.clock.now,
            decide_every_s=0.0,
        )
        queue.book.lease_s = 1e9
        queue.enqueue(other("newcomer"))

    cluster.script("sleep", 2, restart)
    cluster.script("sleep", 4, lambda: cluster.remove_group(busy))
    with caplog.at_level(logging.INFO, logger="tpuslice._reserve.queue.place"):
        assert names(reserver(cluster).run()) == ["v6e-16-0"]
    assert tickets(cluster) == ["newcomer"]
    assert any("lost ticket" in r.message for r in caplog.records)


def test_a_granted_slice_taken_meanwhile_requeues_in_the_same_place() -> None:
    """Someone who does not queue takes a host of the granted slice before it is
    claimed: the grant goes back, and the request waits again ahead of later ones."""
    cluster = queued_cluster(2)
    first = cluster.take("v6e-16-0", 0, {"TPU": 4})
    second = cluster.take("v6e-16-1", 0, {"TPU": 4})
    cluster.script("sleep", 2, lambda: cluster.remove_group(first))
    # The grant comes with the next ask; a non-queued user takes the slice before the
    # claim (the grant's view still shows it idle).
    cluster.script("create_group", 1, lambda: cluster.take("v6e-16-0", 2, {"TPU": 4}))
    cluster.script("sleep", 4, lambda: queue_of(cluster).enqueue(other("later")))
    cluster.script("sleep", 6, lambda: cluster.remove_group(second))
    assert names(reserver(cluster).run()) == ["v6e-16-1"]
    assert tickets(cluster) == ["later"]


def test_a_stale_record_that_lists_waiters_still_sends_a_reservation_to_the_queue() -> None:
    """Under load the queue may write its record less often than its freshness bound
    while others wait: a reservation that took the idle slice then would go ahead of
    them. It queues behind the earlier request, which is granted the slice."""
    cluster = queued_cluster(2)
    cluster.take("v6e-16-0", 0, {"TPU": 4})
    queue = queue_of(cluster)
    queue.enqueue(other("earlier"))
    current = queue.record

    def stale() -> QueueRecord:
        record = current()
        return replace(record, at=record.at - RECORD_FRESH_S)

    queue.record = stale  # type: ignore[method-assign]
    with pytest.raises(ReservationTimeoutError):
        reserver(cluster, head_reservation_timeout_s=5.0).run()
    assert queue.book.granted("earlier") == ("v6e-16-1",)
    assert cluster.live_groups("reserver") == []


def test_ctrl_c_while_queued_leaves_the_queue_and_holds_nothing() -> None:
    cluster = queued_cluster(1)
    cluster.take("v6e-16-0", 0, {"TPU": 4})

    def interrupt() -> None:
        raise KeyboardInterrupt

    cluster.script("sleep", 3, interrupt)
    with pytest.raises(KeyboardInterrupt):
        reserver(cluster).run()
    assert tickets(cluster) == []
    assert cluster.live_groups("reserver") == []


def test_an_impossible_request_fails_at_once_and_leaves_the_queue() -> None:
    cluster = queued_cluster(2)
    with pytest.raises(InsufficientSlicesError, match="asked for 3, the cluster has 2"):
        reserver(cluster, num_slices=3).run()
    assert tickets(cluster) == []  # told at once by the queue, and left it
    assert cluster.clock.t == 0


def test_waiting_position_is_kept_for_the_message() -> None:
    cluster = queued_cluster(1)
    cluster.take("v6e-16-0", 0, {"TPU": 4})
    queue_of(cluster).enqueue(other("ahead"))
    r = reserver(cluster, head_reservation_timeout_s=0.5)
    with pytest.raises(ReservationTimeoutError):
        r.run()
    assert r.place is None  # left
    assert isinstance(queue_of(cluster).book.poll("ahead"), Waiting)


class Flaky:
    """A queue that stops answering for a while (as while Ray restarts it)."""

    def __init__(self, queue: QueueService, down_from: float, down_until: float) -> None:
        self.queue, self.down = queue, (down_from, down_until)
        self.clock = queue.book.clock

    def __getattr__(self, name: str) -> Any:
        if self.down[0] <= self.clock() < self.down[1]:
            raise QueueUnreachableError("restarting")
        return getattr(self.queue, name)


def flaky_queue(
    cluster: InMemoryCluster, monkeypatch: pytest.MonkeyPatch, down_until: float
) -> Flaky:
    flaky = Flaky(queue_of(cluster), 0.0, down_until)
    monkeypatch.setattr(cluster, "slice_queue", lambda: flaky)
    return flaky


def test_a_queue_that_does_not_answer_is_waited_for_visibly_then_admits(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The queue is still starting: the reservation claims nothing meanwhile (the slice
    is idle), says every few seconds that it waits for the queue, and is admitted by it
    once it answers."""
    cluster = queued_cluster(1)
    flaky_queue(cluster, monkeypatch, down_until=12.0)
    with caplog.at_level(logging.WARNING, logger="tpuslice._reserve.claim"):
        reservation = reserver(cluster, head_reservation_timeout_s=30).run()
    assert names(reservation) == ["v6e-16-0"]
    assert cluster.clock.t >= 12.0
    said = [r.getMessage() for r in caplog.records if "waiting for the slice queue" in r.message]
    assert said[0].startswith("waiting for the slice queue to start: 0 s")
    assert 2 <= len(said) <= 12.0 / claim.PROGRESS_S + 1  # every few seconds, not a flood
    assert cluster.calls["create_group"] == 1  # nothing was claimed before the grant


def test_a_queue_that_never_answers_ends_in_a_timeout_that_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = queued_cluster(1)
    flaky_queue(cluster, monkeypatch, down_until=float("inf"))
    with pytest.raises(ReservationTimeoutError, match="the slice queue, which admits every"):
        reserver(cluster, head_reservation_timeout_s=5.0).run()
    assert 5.0 <= cluster.clock.t <= 5.0 + claim.POLL_S[1]
    assert cluster.calls["create_group"] == 0
    assert cluster.live_groups("reserver") == []


def test_reservations_that_waited_for_the_queue_are_served_in_the_order_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ours was asked for first; another driver's request, asked for a second later,
    reaches the queue first, as soon as it answers. The one idle slice is still ours."""
    cluster = queued_cluster(1)
    flaky_queue(cluster, monkeypatch, down_until=3.0)

    def another_driver_gets_there_first() -> None:
        asked_later = cluster.clock.stamp()
        cluster.clock.t = 3.0
        queue_of(cluster).enqueue(other("asked-later"), asked_later)

    cluster.script("sleep", 1, another_driver_gets_there_first)
    reservation = reserver(cluster, head_reservation_timeout_s=30).run()
    assert names(reservation) == ["v6e-16-0"]
    assert tickets(cluster) == ["asked-later"]


@pytest.mark.parametrize("outage", [3.0, 60.0])
def test_a_queue_that_stops_answering_while_a_request_waits_is_waited_for(
    outage: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restart, short or long: the reservation keeps waiting in its place (never
    claiming around the queue), and is granted the slice once it is handed back."""
    cluster = queued_cluster(1)
    busy = cluster.take("v6e-16-0", 0, {"TPU": 4})
    flaky = Flaky(queue_of(cluster), 1.0, 1.0 + outage)
    monkeypatch.setattr(cluster, "slice_queue", lambda: flaky)
    cluster.clock.on_sleep = None
    free_at = 2.0
    original_sleep = cluster.clock.sleep
    created: list[float] = []
    original_create = cluster.create_group

    def create(*args: Any, **kwargs: Any) -> Any:
        created.append(cluster.clock.t)
        return original_create(*args, **kwargs)

    def sleep(seconds: float) -> None:
        original_sleep(seconds)
        if cluster.clock.t >= free_at and not busy.removed:
            cluster.remove_group(busy)

    monkeypatch.setattr(cluster, "create_group", create)
    r = reserver(cluster, head_reservation_timeout_s=None)
    r.clock = Clock(cluster.clock.now, sleep, cluster.clock.stamp)
    assert names(r.run()) == ["v6e-16-0"]
    assert created and created[0] >= 1.0 + outage  # only once the queue answered again


# --- ranges of slices ----------------------------------------------------------------------


def test_a_range_takes_every_idle_slice_up_to_its_max() -> None:
    cluster = queued_cluster(3)
    cluster.take("v6e-16-2", 1, {"TPU": 4})
    reservation = reserver(cluster, num_slices=(1, 3)).run()
    assert names(reservation) == ["v6e-16-0", "v6e-16-1"]
    assert reservation.plan is not None and reservation.plan.num_slices == 2
    assert reservation.plan.num_bundles == 8  # two slices' hosts, not three


def test_a_range_below_its_min_waits_in_the_queue_then_takes_what_is_idle() -> None:
    """(2, 3) with one idle: it queues, holding nothing; when two more are freed it
    takes all three."""
    cluster = queued_cluster(3)
    first = cluster.take("v6e-16-1", 0, {"TPU": 4})
    second = cluster.take("v6e-16-2", 0, {"TPU": 4})
    held = free_later(cluster, 3, first, second)
    reservation = reserver(cluster, num_slices=(2, 3)).run()
    assert names(reservation) == ["v6e-16-0", "v6e-16-1", "v6e-16-2"]
    assert held == [0]
    assert tickets(cluster) == []


def test_a_range_whose_min_the_cluster_cannot_hold_fails_at_once() -> None:
    cluster = queued_cluster(2)
    with pytest.raises(InsufficientSlicesError, match="asked for 3, the cluster has 2"):
        reserver(cluster, num_slices=(3, 4)).run()
    assert names(reserver(cluster, num_slices=(1, 9)).run()) == ["v6e-16-0", "v6e-16-1"]


def test_without_a_queue_a_range_still_holds_nothing_while_short() -> None:
    cluster = InMemoryCluster([("v6e", "4x4", 3)])
    cluster.take("v6e-16-2", 0, {"TPU": 4})
    busy = cluster.take("v6e-16-1", 0, {"TPU": 4})
    held = free_later(cluster, 2, busy)
    assert names(reserver(cluster, num_slices=(2, 3)).run()) == ["v6e-16-0", "v6e-16-1"]
    assert held == [0]


def test_a_stale_owner_record_does_not_keep_a_queued_request_waiting() -> None:
    """The slice shows busy only because of a recorded TPU owner that has since exited:
    the queue asks those hosts again itself, the record clears, and it is granted."""
    cluster = queued_cluster(1)
    cluster.own_tpu("v6e-16-0", 1, "pid 4242 (python notebook.py)")
    with pytest.raises(ReservationTimeoutError, match="TPU held by pid 4242"):
        reserver(cluster, head_reservation_timeout_s=1.0).run()
    cluster.own_tpu("v6e-16-0", 1, None)  # it exits; its record stays
    start = cluster.clock.t
    assert names(reserver(cluster, head_reservation_timeout_s=30.0).run()) == ["v6e-16-0"]
    assert cluster.clock.t - start < REPROBE_S + 1.0


def test_granted_slices_are_placed_in_one_round() -> None:
    """Slices the queue granted are placed as one group (each slice's head in bundle 0
    of its block), created once and waited for once, from the grant's own view."""
    cluster = queued_cluster(2)
    busy = cluster.take("v6e-16-1", 0, {"TPU": 4})
    free_later(cluster, 2, busy)
    reservation = reserver(cluster, num_slices=2).run()
    assert names(reservation) == ["v6e-16-0", "v6e-16-1"]
    assert cluster.calls["create_group"] == 1
    assert cluster.calls["wait_placed"] == 1
    assert all(c.head_pg is None for c in reservation.claims)
    assert cluster.live_groups("reserver") == [reservation.combined_pg]


def test_a_grant_whose_head_was_taken_leaves_no_group_and_requeues(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Granted, then someone outside the queue takes the head before our group places:
    the group (which asks for the head in bundle 0) places nowhere and is removed, no
    bundle of ours ever sits on the slice, and the request waits again until another
    slice is granted."""
    cluster = queued_cluster(2)
    placements = Placements(cluster, monkeypatch)
    first = cluster.take("v6e-16-0", 0, {"TPU": 4})
    second = cluster.take("v6e-16-1", 0, {"TPU": 4})
    cluster.script("sleep", 2, lambda: cluster.remove_group(first))
    cluster.script("create_group", 1, lambda: cluster.take("v6e-16-0", 0, {HEAD: 1}))
    free_later(cluster, 8, second)
    reservation = reserver(cluster).run()
    assert names(reservation) == ["v6e-16-1"]
    assert placements.on("v6e-16-0") == set()
    assert placements.hosts() & others_hosts(cluster) == set()
    assert cluster.calls["create_group"] == 2  # the race happened: the lost grant, then the next
    assert cluster.live_groups("reserver") == [reservation.combined_pg]
    assert tickets(cluster) == []


def test_ctrl_c_while_the_queue_is_joined_leaves_no_ticket() -> None:
    """Interrupted right after enqueuing, while the claims made before are given back."""
    cluster = queued_cluster(2)
    cluster.take("v6e-16-1", 0, {"TPU": 4})
    cluster.script("create_group", 1, lambda: cluster.take("v6e-16-0", 0, {"TPU-v6e-16-head": 1}))

    def interrupt() -> None:
        raise KeyboardInterrupt

    cluster.script("slice_queue", 1, interrupt, after=True)
    with pytest.raises(KeyboardInterrupt):
        reserver(cluster, num_slices=2).run()
    assert tickets(cluster) == []
    assert cluster.live_groups("reserver") == []


def test_a_queued_request_lets_autoscaler_demand_go_rather_than_adopt_it() -> None:
    """Queued on a growing cluster: the slice its demand brings is not adopted out of
    the queue's order (it would be held while waiting for the rest); the queue grants
    it with the others."""
    cluster = InMemoryCluster([("v6e", "4x4", 2)], queue=True, can_grow=True)
    assert cluster.queue is not None
    cluster.queue.book.lease_s = 1e9
    busy = cluster.take("v6e-16-1", 0, {"TPU": 4})
    cluster.script("sleep", 3, lambda: cluster.add_slice("v6e", "4x4", "v6e-16-new"))
    r = reserver(cluster, num_slices=3, head_reservation_timeout_s=60)
    claimed_while_queued: list[int] = []

    def free_it() -> None:
        claimed_while_queued.append(len(r.claims))
        cluster.remove_group(busy)

    cluster.script("sleep", 60, free_it)  # after several looks at the grown cluster
    reservation = r.run()
    assert sorted(names(reservation)) == ["v6e-16-0", "v6e-16-1", "v6e-16-new"]
    assert claimed_while_queued == [0]  # the new slice was not adopted out of order


def test_a_slice_the_autoscaler_adds_is_granted_as_soon_as_the_demand_lands_on_it() -> None:
    """The demand group lands on the slice the autoscaler added, and is found there
    through Ray's table of groups, not by a wait of no time (which finds nothing placed,
    in Ray as in InMemoryCluster). The request lets its demand go and the queue grants
    the slice, at once: a demand group never found would hold the new slice itself until
    the deadline."""
    cluster = InMemoryCluster([("v6e", "4x4", 1)], can_grow=True)
    cluster.take("v6e-16-0", 0, {"TPU": 4})
    cluster.script("sleep", 3, lambda: cluster.add_slice("v6e", "4x4", "v6e-16-new"))
    started = cluster.clock.t
    reservation = reserver(cluster, head_reservation_timeout_s=60).run()
    assert names(reservation) == ["v6e-16-new"]
    assert cluster.clock.t - started < 10


def test_a_requeue_keeps_the_place_against_a_decision_between_its_calls() -> None:
    """The grant is given back while a later waiter polls between every call ours makes
    to the queue: the slice given back is granted to ours again, not to the later one."""
    from tpuslice._reserve.queue.place import QueuePlace

    cluster = queued_cluster(1)
    busy = cluster.take("v6e-16-0", 0, {"TPU": 4})
    queue = queue_of(cluster)

    class Interleaved:
        """Our handle to the queue; the later waiter polls after each of our calls."""

        def __getattr__(self, name: str) -> Any:
            call = getattr(queue, name)

            def interleaved(*args: Any) -> Any:
                result = call(*args)
                queue.wait("later")
                return result

            return interleaved

    place = QueuePlace(Interleaved(), other("ours").kind, (1, 1), 0)
    place.join(0.0)
    queue.enqueue(other("later"))
    cluster.remove_group(busy)
    assert place.wait(0.0) == Granted(("v6e-16-0",))
    place.requeue()
    assert isinstance(queue.wait("later"), Waiting)
    assert place.wait(0.0) == Granted(("v6e-16-0",))


def test_a_grant_is_judged_by_the_free_keys_listed_after_it_not_by_its_view() -> None:
    """The grant's view is the queue's read, in which every host was vouched free; a
    process took a TPU of the granted slice after that read. The claimant lists the
    agents' keys again, asks that host, finds it owned, and waits for the other slice."""
    cluster = queued_cluster(2)
    cluster.seen_free.update(n for hosts in cluster.slice_hosts.values() for n in hosts)
    first = cluster.take("v6e-16-0", 0, {"TPU": 4})
    second = cluster.take("v6e-16-1", 0, {"TPU": 4})
    cluster.script("sleep", 2, lambda: cluster.remove_group(first))
    cluster.script("create_group", 1, lambda: cluster.own_tpu("v6e-16-0", 3, "pid 8 (python x.py)"))
    cluster.script("sleep", 6, lambda: cluster.remove_group(second))
    asked = record_asks(cluster)
    reservation = reserver(cluster, head_reservation_timeout_s=30).run()
    assert names(reservation) == ["v6e-16-1"]
    assert asked[0] == ["v6e-16-0/3"]


def test_a_never_from_the_queue_that_the_cluster_contradicts_is_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The queue's read missed a slice (a host back since): the reservation reads the
    cluster, finds it can be served, and waits on rather than failing."""
    from tpuslice._reserve.queue.book import Never

    cluster = queued_cluster(1)
    busy = cluster.take("v6e-16-0", 0, {"TPU": 4})
    queue = queue_of(cluster)
    real_wait = queue.wait
    answers = iter([Never("needs 1 slice(s) of v6e-16 4x4; the cluster has 0")])

    def wait(ticket: str, timeout_s: float = 0.0) -> Any:
        return next(answers, None) or real_wait(ticket, timeout_s)

    monkeypatch.setattr(queue, "wait", wait)
    cluster.script("sleep", 2, lambda: cluster.remove_group(busy))
    assert names(reserver(cluster, head_reservation_timeout_s=30).run()) == ["v6e-16-0"]
