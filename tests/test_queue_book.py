"""The queue's bookkeeping (tpuslice._reserve.queue.book): leases, grants, restarts. Pure."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tpuslice._reserve.queue.book import Granted, Never, QueueBook, Unknown, Waiting
from tpuslice._reserve.queue.schedule import Holding, Waiter
from tpuslice.errors import InvalidArgumentError

KIND = "v6e-16"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def want(ticket: str, count: int = 1) -> Waiter:
    return Waiter(ticket, KIND, (count, count))


@pytest.fixture
def clock() -> Clock:
    return Clock()


class Stamp:
    """Wall-clock nanoseconds, ticking one per call (shared by a queue and its restart)."""

    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        self.now += 1
        return self.now


@pytest.fixture
def book(clock: Clock) -> QueueBook:
    return QueueBook(clock, Stamp(), lease_s=3.0)


def test_first_come_first_granted_and_claimed_tickets_leave(book: QueueBook) -> None:
    book.enqueue(want("a"))
    book.enqueue(want("b"))
    assert book.decide({KIND: ["s1"]}, [Holding(KIND, 3)]) == {"a": ("s1",)}
    assert book.poll("a") == Granted(("s1",))
    waiting = book.poll("b")
    assert isinstance(waiting, Waiting) and waiting.position == 1 and waiting.ahead == ()
    assert "1 slice(s) of v6e-16" in waiting.reason
    book.claimed("a")
    assert book.poll("a") == Unknown()
    assert [w.ticket for w, _, _ in book.tickets()] == ["b"]


def test_a_granted_slice_is_not_granted_twice_while_it_still_shows_idle(
    book: QueueBook,
) -> None:
    book.enqueue(want("a"))
    book.enqueue(want("b"))
    assert book.decide({KIND: ["s1"]}, [Holding(KIND, 3)]) == {"a": ("s1",)}
    assert book.decide({KIND: ["s1"]}, [Holding(KIND, 3)]) == {}  # a has not claimed yet
    assert isinstance(book.poll("b"), Waiting)


def test_a_waiter_that_stops_polling_leaves_and_the_next_one_moves_up(
    book: QueueBook, clock: Clock
) -> None:
    book.enqueue(want("dead", 2))
    book.enqueue(want("alive"))
    assert book.decide({KIND: ["s1"]}, [Holding(KIND, 3)]) == {}  # s1 kept for "dead"
    clock.now = 2.0
    book.poll("alive")
    clock.now = 3.5  # "dead" last polled at 0: its lease ran out
    assert book.decide({KIND: ["s1"]}, [Holding(KIND, 3)]) == {"alive": ("s1",)}
    assert book.poll("dead") == Unknown()


def test_a_granted_driver_that_dies_loses_the_grant_to_the_next(
    book: QueueBook, clock: Clock
) -> None:
    book.enqueue(want("gone"))
    book.enqueue(want("next"))
    assert book.decide({KIND: ["s1"]}, [Holding(KIND, 3)]) == {"gone": ("s1",)}
    for t in (2.0, 3.5):  # only "next" keeps polling
        clock.now = t
        book.poll("next")
    assert book.decide({KIND: ["s1"]}, [Holding(KIND, 3)]) == {"next": ("s1",)}
    assert book.poll("gone") == Unknown()


def test_after_a_restart_the_old_order_is_kept(clock: Clock) -> None:
    """The queue restarts with an empty book; a newcomer enqueues first; the old waiters
    come back with their arrival numbers and are still served first."""
    stamp = Stamp()
    old = QueueBook(clock, stamp)
    first = old.enqueue(want("early"))
    second = old.enqueue(want("later"))
    new = QueueBook(clock, stamp)
    assert new.poll("early") == Unknown()
    new.enqueue(want("newcomer"))
    new.enqueue(want("later"), arrival=second)
    new.enqueue(want("early"), arrival=first)
    assert [w.ticket for w, _, _ in new.tickets()] == ["early", "later", "newcomer"]
    assert new.decide({KIND: ["s1", "s2"]}) == {"early": ("s1",), "later": ("s2",)}
    assert new.enqueue(want("after")) > max(first, second)


def test_a_restarted_queue_keeps_the_old_places_until_their_drivers_are_back(
    clock: Clock,
) -> None:
    """Told what the old queue held, the new one does not let the first driver back
    take what an earlier one would have had: the earlier one's place (and the grant it
    got meanwhile) waits for it; its poll says Unknown so it enqueues again."""
    stamp = Stamp()
    old = QueueBook(clock, stamp)
    first = old.enqueue(want("early"))
    second = old.enqueue(want("later"))
    new = QueueBook(clock, stamp)
    new.expect(replace(want("early"), arrival=first), "pid 1")
    new.expect(replace(want("later"), arrival=second), "pid 2")
    assert new.poll("early") == Unknown()
    new.enqueue(want("later"), arrival=second)  # "later" is back first
    assert new.decide({KIND: ["s1"]}) == {"early": ("s1",)}
    assert new.poll("early") == Unknown()  # still a placeholder, granted or not
    assert isinstance(new.poll("later"), Waiting)
    new.enqueue(want("early"), arrival=first)
    assert new.poll("early") == Granted(("s1",))  # taken over, grant and all


def test_a_place_kept_after_a_restart_goes_if_its_driver_is_not_back(clock: Clock) -> None:
    """Polling the placeholder (which answers Unknown) does not renew it."""
    new = QueueBook(clock, Stamp())
    new.expect(replace(want("gone"), arrival=5), "pid 1", rejoin_s=2.0)
    new.enqueue(want("here"))
    assert new.decide({KIND: ["s1"]}) == {"gone": ("s1",)}
    clock.now = 1.9
    new.poll("gone")
    new.poll("here")
    assert new.decide({KIND: ["s1"]}) == {}
    clock.now = 2.1
    new.poll("here")
    assert new.decide({KIND: ["s1"]}) == {"here": ("s1",)}
    assert new.poll("gone") == Unknown()
    assert [w.ticket for w, _, _ in new.tickets()] == ["here"]


def test_a_request_the_cluster_can_never_hold_is_told_so(book: QueueBook) -> None:
    book.enqueue(want("huge", 5))
    book.decide({KIND: ["s1", "s2"]}, [Holding(KIND, 2)])
    answer = book.poll("huge")
    assert isinstance(answer, Never) and "the cluster has 4" in answer.reason


def test_a_ticket_joined_again_is_queued_once_in_its_first_place(book: QueueBook) -> None:
    """A driver sends its join again while the queue is slow: the copy changes nothing."""
    first = book.enqueue(want("a"))
    book.enqueue(want("b"))
    assert book.enqueue(want("a"), arrival=first + 100) == first
    assert [w.ticket for w, _, _ in book.tickets()] == ["a", "b"]


@pytest.mark.parametrize("end", ["leave", "claimed"])
def test_a_late_copy_of_a_join_does_not_queue_an_ended_ticket_again(
    book: QueueBook, end: str
) -> None:
    """The driver gave up (or claimed) before a copy of its join reached the queue."""
    book.enqueue(want("a"))
    getattr(book, end)("a")
    with pytest.raises(InvalidArgumentError, match="has left the queue"):
        book.enqueue(want("a"))
    assert book.tickets() == []


def test_tickets_queue_in_the_order_their_drivers_stamped_not_the_order_they_arrived(
    book: QueueBook,
) -> None:
    """Drivers that started together reach a queue that was still starting in any order;
    each ticket carries when its reservation was asked for."""
    book.enqueue(want("asked-second"), arrival=2_000)
    book.enqueue(want("asked-first"), arrival=1_500)
    assert [w.ticket for w, _, _ in book.tickets()] == ["asked-first", "asked-second"]
    assert book.decide({KIND: ["s1"]}) == {"asked-first": ("s1",)}


def test_a_driver_back_without_its_number_takes_over_its_kept_place(clock: Clock) -> None:
    """Its first join never answered (the queue died meanwhile), so it has no number of
    its own: the place the restarted queue kept for its ticket is its place."""
    stamp = Stamp()
    new = QueueBook(clock, stamp)
    new.expect(replace(want("kept"), arrival=500), "pid 1")
    new.enqueue(want("later"))
    assert new.enqueue(want("kept")) == 500
    assert [w.ticket for w, _, _ in new.tickets()] == ["kept", "later"]


def test_leaving_gives_the_grant_back(book: QueueBook) -> None:
    book.enqueue(want("a"))
    book.enqueue(want("b"))
    book.decide({KIND: ["s1"]}, [Holding(KIND, 3)])
    book.leave("a")
    assert book.decide({KIND: ["s1"]}, [Holding(KIND, 3)]) == {"b": ("s1",)}


def test_a_claimed_slice_that_still_shows_idle_is_not_granted_again(
    book: QueueBook, clock: Clock
) -> None:
    """The resource view lags the claim: until the slice shows in use (or SETTLE_S), the
    next waiter is not granted it; once it has shown in use, idle again means idle."""
    book.enqueue(want("a"))
    book.enqueue(want("b"))
    assert book.decide({KIND: ["s1"]}, [Holding(KIND, 3)]) == {"a": ("s1",)}
    book.claimed("a")
    assert book.decide({KIND: ["s1"]}, [Holding(KIND, 3)]) == {}
    answer = book.poll("b")
    assert isinstance(answer, Waiting) and answer.position == 1
    assert book.decide({KIND: []}, [Holding(KIND, 4)]) == {}  # now shown in use
    assert book.decide({KIND: ["s1"]}, [Holding(KIND, 3)]) == {"b": ("s1",)}


def test_a_claimed_slice_is_offered_again_after_the_settling_time(
    book: QueueBook, clock: Clock
) -> None:
    book.enqueue(want("a"))
    book.enqueue(want("b"))
    book.decide({KIND: ["s1"]}, [Holding(KIND, 3)])
    book.claimed("a")
    clock.now = book.settle_s + 0.1
    book.poll("b")
    assert book.decide({KIND: ["s1"]}, [Holding(KIND, 3)]) == {"b": ("s1",)}


def test_a_claimed_slice_waits_for_a_holder_record_only_from_work_that_writes_one(
    book: QueueBook,
) -> None:
    """Work that may be preempted records whose its slices are: until that record is
    read, its claimed slice counts as its own, not as no one's. Other work records
    nothing, so once its slice has shown in use, idle again means idle, at once."""
    from dataclasses import replace

    book.enqueue(replace(want("fixed"), preemptible=False))
    book.enqueue(want("next"))
    assert book.decide({KIND: ["s1"]}, [Holding(KIND, 3)], recorded=()) == {"fixed": ("s1",)}
    book.claimed("fixed")
    assert book.decide({KIND: []}, [Holding(KIND, 4)], recorded=()) == {}  # shown in use
    assert book.decide({KIND: ["s1"]}, [Holding(KIND, 3)], recorded=()) == {"next": ("s1",)}

    book.enqueue(replace(want("flexible"), preemptible=True))
    book.enqueue(want("last"))
    book.claimed("next")
    assert book.decide({KIND: ["s2"]}, [Holding(KIND, 3)], recorded=()) == {"flexible": ("s2",)}
    book.claimed("flexible")
    assert book.settle(set(), recorded=()) == {"s2"}  # s1: shown in use, no record due
    assert book.decide({KIND: ["s2"]}, [Holding(KIND, 3)], recorded=()) == {}  # no record yet
    assert book.decide({KIND: ["s2"]}, [Holding(KIND, 3)], recorded={"s2"}) == {}  # shown idle
    assert book.decide({KIND: []}, [Holding(KIND, 4)], recorded={"s2"}) == {}
    assert book.decide({KIND: ["s2"]}, [Holding(KIND, 3)], recorded={"s2"}) == {"last": ("s2",)}
