"""The cluster-wide queue's policy (tpuslice._reserve.queue.schedule): order, all-or-nothing
grants, earmarks, other kinds served past a blocked request, ranges; and a replay of a contention
scenario on the policy alone. Pure."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import pytest

from tpuslice._reserve.queue.schedule import Decision, Holding, Waiter, decide, queue_order
from tpuslice.errors import InvalidArgumentError

V6E = "v6e-16"
SLICES = ["a", "b", "c", "d"]


def waiter(ticket: str, low: int, high: int | None = None, **kw: object) -> Waiter:
    return Waiter(ticket, str(kw.pop("kind", V6E)), (low, high or low), **kw)  # type: ignore[arg-type]


def test_priority_first_then_arrival() -> None:
    queue = [
        waiter("late-high", 1, priority=5, arrival=9),
        waiter("first", 1, arrival=1),
        waiter("second", 1, arrival=2),
        waiter("early-high", 1, priority=5, arrival=3),
    ]
    assert [w.ticket for w in queue_order(queue)] == ["early-high", "late-high", "first", "second"]
    got = decide(queue, {V6E: ["a", "b"]})
    assert got.grants == {"early-high": ("a",), "late-high": ("b",)}
    assert got.order == ["early-high", "late-high", "first", "second"]


def test_all_or_nothing_and_no_slice_held_while_waiting() -> None:
    """Three 2-slice requests, three idle slices: one is granted two, the next keeps the
    third idle for itself (not claimed), the last waits behind it."""
    queue = [waiter(t, 2, arrival=i) for i, t in enumerate(("x", "y", "z"))]
    got = decide(queue, {V6E: ["a", "b", "c"]}, [Holding(V6E, 1)])
    assert got.grants == {"x": ("a", "b")}
    assert got.earmarks == {"y": ("c",), "z": ()}
    assert "1 idle kept for it, 1 more" in got.blocked["y"]
    assert "behind 1 earlier request(s)" in got.blocked["z"]


def test_a_blocked_request_is_not_starved_by_smaller_later_ones() -> None:
    queue = [waiter("big", 2, arrival=0), waiter("small", 1, arrival=1)]
    got = decide(queue, {V6E: ["a"]}, [Holding(V6E, 3)])
    assert got.grants == {} and got.earmarks == {"big": ("a",), "small": ()}


def test_a_range_takes_every_idle_slice_up_to_its_maximum() -> None:
    assert decide([waiter("r", 1, 4)], {V6E: ["c", "a", "b"]}).grants == {"r": ("a", "b", "c")}
    assert decide([waiter("r", 1, 2)], {V6E: ["c", "a", "b"]}).grants == {"r": ("a", "b")}
    blocked = decide([waiter("r", 3, 4)], {V6E: ["a", "b"]}, [Holding(V6E, 2)])
    assert blocked.grants == {} and blocked.earmarks == {"r": ("a", "b")}


def test_another_kind_is_served_past_a_blocked_request() -> None:
    queue = [waiter("big", 2, arrival=0), waiter("v4", 1, arrival=1, kind="v4-16")]
    got = decide(queue, {V6E: ["a"], "v4-16": ["p"]}, [Holding(V6E, 3)])
    assert got.grants == {"v4": ("p",)}


def test_a_blocked_requests_idle_slices_are_never_lent_to_a_later_one() -> None:
    """The head needs 2 and has 1 idle kept; a later 1-slice request of the same kind waits
    behind it, however short its work."""
    queue = [waiter("head", 2, arrival=0), waiter("filler", 1, arrival=1)]
    got = decide(queue, {V6E: ["a"]}, [Holding(V6E, 3)])
    assert got.grants == {}
    assert got.earmarks["head"] == ("a",)
    assert "1 idle kept for it, 1 more" in got.blocked["head"]
    assert "behind 1 earlier request" in got.blocked["filler"]


def test_a_request_bigger_than_its_kind_is_never_granted() -> None:
    got = decide([waiter("huge", 5), waiter("one", 1, arrival=1)], {V6E: SLICES})
    assert "the cluster has 4" in got.never["huge"]
    assert got.grants == {"one": ("a",)}  # it does not block anyone


@pytest.mark.parametrize("count", [(0, 1), (3, 2)])
def test_bad_requests_are_refused(count: tuple[int, int]) -> None:
    with pytest.raises(InvalidArgumentError, match="request t"):
        Waiter("t", V6E, count)


# --- a contention scenario, replayed on the policy alone ---------------------------


@dataclass(order=True)
class Event:
    at: float
    seq: int
    what: str = field(compare=False)
    driver: int = field(compare=False)


@dataclass
class Replay:
    makespan: float
    waits: list[float]
    first_come_order: bool


def replay(sizes: list[int], jobs_each: int, length: float, slices: int) -> Replay:
    """Drivers submit ``jobs_each`` jobs in a row; job sizes per driver in ``sizes``. The
    queue decides at every arrival and release; a grant runs ``length`` seconds."""
    events: list[Event] = []
    seq = 0

    def push(at: float, what: str, driver: int) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, Event(at, seq, what, driver))

    for driver in range(len(sizes)):
        push(0.0, "submit", driver)
    idle = [f"s{i}" for i in range(slices)]
    waiting: dict[str, tuple[Waiter, float]] = {}
    running: dict[str, tuple[list[str], float]] = {}
    done = [0] * len(sizes)
    waits, grant_order, arrival_order = [], [], []
    now = 0.0
    while events:
        event = heapq.heappop(events)
        now = event.at
        ticket = f"{event.driver}.{done[event.driver]}"
        if event.what == "submit":
            waiting[ticket] = (waiter(ticket, sizes[event.driver], arrival=event.seq), now)
            arrival_order.append(ticket)
        else:
            slices_back, _ = running.pop(ticket)
            idle += slices_back
            done[event.driver] += 1
            if done[event.driver] < jobs_each:
                push(now, "submit", event.driver)
                continue
        holding = [Holding(V6E, len(s)) for s, _ in running.values()]
        got: Decision = decide([w for w, _ in waiting.values()], {V6E: idle}, holding)
        for granted, names in got.grants.items():
            _, since = waiting.pop(granted)
            waits.append(now - since)
            grant_order.append(granted)
            idle = [s for s in idle if s not in names]
            running[granted] = (list(names), now + length)
            push(now + length, "end", int(granted.split(".")[0]))
    same_size = {t for t in arrival_order if sizes[int(t.split(".")[0])] == 1}
    in_order = [t for t in grant_order if t in same_size] == [
        t for t in arrival_order if t in same_size
    ]
    return Replay(now, waits, in_order)


def test_six_drivers_on_four_slices_meet_the_makespan_target_on_the_policy_alone() -> None:
    """6 drivers x 3 jobs of 2 s on 4 slices, four asking for 1 slice and two for 2: ideal
    12 s (48 slice-seconds / 4 slices). The policy alone finishes within 1.15x of it;
    1-slice jobs start in arrival order; every job has run."""
    result = replay([1, 1, 1, 1, 2, 2], jobs_each=3, length=2.0, slices=4)
    assert result.makespan <= 1.15 * 12.0, result
    assert result.first_come_order
    assert len(result.waits) == 18
    assert max(result.waits) < 6 * 2.0  # no job waits behind every other driver's


def test_three_two_slice_requests_on_three_slices_all_complete() -> None:
    """Held-and-wait would deadlock them (each holding one slice); here they run one at a
    time, 9 jobs of 2 s."""
    result = replay([2, 2, 2], jobs_each=3, length=2.0, slices=3)
    assert len(result.waits) == 9 and result.makespan == 18.0


def test_a_slice_offered_under_two_kinds_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="slice s1 is listed under kinds"):
        decide([waiter("a", 1)], {V6E: ["s1"], "v6e-16/2x4": ["s1"]})


# --- requests restricted by label selectors ------------------------------------------------


def test_a_restricted_request_is_granted_only_the_slices_it_accepts() -> None:
    got = decide([waiter("zone-b", 1, only=frozenset({"c"}))], {V6E: ["a", "b", "c"]})
    assert got.grants == {"zone-b": ("c",)}


def test_a_blocked_restricted_request_holds_back_only_its_own_slices() -> None:
    """It waits for a busy slice; a later request of the kind takes an idle other one (it
    could not serve the first), and one that wants the first's slice waits behind it."""
    queue = [
        waiter("pinned", 1, arrival=1, only=frozenset({"a"})),
        waiter("any", 1, arrival=2),
        waiter("also-a", 1, arrival=3, only=frozenset({"a", "b"})),
    ]
    got = decide(queue, {V6E: ["b"]}, [Holding(V6E, 1)])
    assert got.grants == {"any": ("b",)}
    assert "pinned" in got.blocked and "also-a" in got.blocked


def test_an_unrestricted_blocked_request_still_holds_back_everyone_behind_it() -> None:
    queue = [waiter("two", 2, arrival=1), waiter("zone", 1, arrival=2, only=frozenset({"a"}))]
    got = decide(queue, {V6E: ["a"]}, [Holding(V6E, 1)])
    assert got.grants == {}
    assert got.earmarks["two"] == ("a",)


def test_a_request_that_names_its_slice_takes_it_though_suspect() -> None:
    """A health check pins the suspect slice it checks: no other slice could serve it."""
    got = decide([waiter("check", 1, only=frozenset({"s"}))], {V6E: ["a"]}, suspects={V6E: ["s"]})
    assert got.grants == {"check": ("s",)}
    spread = decide(
        [waiter("zone", 1, only=frozenset({"s", "a2"}))],
        {V6E: []},
        suspects={V6E: ["s"]},
        trusted={V6E: 4},
    )
    assert spread.grants == {}  # it could wait for a trusted one it accepts


def test_a_restricted_request_the_cluster_can_never_hold_is_told_so() -> None:
    got = decide([waiter("two-pinned", 2, only=frozenset({"a"}))], {V6E: ["a", "b"]})
    assert "the cluster has 1 that its label selectors accept" in got.never["two-pinned"]


def test_a_restricted_request_never_preempts() -> None:
    victim = Holding(V6E, 1, preemptible=True, holder="low", priority=-5, who="low")
    got = decide([waiter("pinned", 1, priority=5, only=frozenset({"a"}))], {V6E: []}, [victim])
    assert got.preempt == {}
