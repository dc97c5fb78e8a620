"""Who gets idle slices next: the policy of the cluster-wide queue. Pure.

Requests wait for slices of one *kind* (the slices that can serve them, e.g. every
``v6e-16``). Each pass over the queue decides, from the waiters, the idle slices and the
work holding the others, which waiters are granted which slices now. The rules:

1. **Order.** Higher ``priority`` first; within a priority, arrival order.
2. **All or nothing.** A waiter is granted at least its minimum count at once, or nothing;
   with a range ``(min, max)`` it gets every idle slice of its kind, up to ``max``. A
   waiter never holds some slices while it waits for more.
3. **Earmarks.** A waiter that cannot start yet (it is *blocked*) earmarks the idle slices
   of its kind: they stay free (unclaimed) for it, and later waiters may not take them.
   So a stream of small requests cannot starve a big one that arrived first.
4. **Backfill.** A later waiter may start, out of order, on slices no waiter ahead of it
   can use: slices of another kind at any time; and a blocked waiter's earmarked slices
   only when it declared a time limit and gives them back no later than the start every
   blocked waiter ahead of it is *promised*. The promise is computed as if all work
   holding the kind's slices (granted in this pass too) used its full time limit; work
   with no limit might end at any moment, so it promises "now" and nothing is lent while
   a blocked waiter depends on it. This is the usual guarantee of backfill with time
   limits (EASY): a borrower that keeps to its limit never makes a waiter ahead start
   later than its promise; work that ends before its limit can free slices while a
   borrower still holds them, and that wait is bounded by the borrower's limit.

Nothing here preempts running work.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tpuslice.errors import InvalidArgumentError


@dataclass(frozen=True)
class Waiter:
    """A waiting request.

    Attributes:
        ticket: Its id in the queue.
        kind: The kind of slice it needs (every slice of one kind can serve it).
        count: ``(min, max)`` slices; an int request is ``(n, n)``.
        priority: Higher first.
        arrival: Its place in arrival order (the queue's sequence number).
        time_limit_s: How long its work will hold the slices, if it declared it.
    """

    ticket: str
    kind: str
    count: tuple[int, int]
    priority: int = 0
    arrival: int = 0
    time_limit_s: float | None = None

    def __post_init__(self) -> None:
        low, high = self.count
        if not 1 <= low <= high:
            raise InvalidArgumentError(
                f"request {self.ticket}: count {self.count} must be (min, max) with 1 <= min <= max"
            )
        if self.time_limit_s is not None and not self.time_limit_s > 0:
            raise InvalidArgumentError(
                f"request {self.ticket}: time_limit_s must be positive, got {self.time_limit_s}"
            )


@dataclass(frozen=True)
class Holding:
    """Running work holding slices.

    Attributes:
        kind: The kind of its slices.
        slices: How many it holds.
        ends_by: When it will have given them back (absolute, on the clock ``decide``
            gets), or None if unknown.
    """

    kind: str
    slices: int
    ends_by: float | None = None


@dataclass
class Decision:
    """One pass over the queue.

    Attributes:
        grants: Ticket -> the slices it is granted now, in name order.
        earmarks: Ticket -> idle slices kept free for it (it is blocked).
        blocked: Ticket -> why it waits, for status and timeout messages.
        never: Ticket -> why it can never be granted (more slices than its kind has).
        position: Ticket -> its place in the queue's order, from 1.
        ahead: Ticket -> the tickets before it in that order.
    """

    grants: dict[str, tuple[str, ...]] = field(default_factory=dict)
    earmarks: dict[str, tuple[str, ...]] = field(default_factory=dict)
    blocked: dict[str, str] = field(default_factory=dict)
    never: dict[str, str] = field(default_factory=dict)
    position: dict[str, int] = field(default_factory=dict)
    ahead: dict[str, list[str]] = field(default_factory=dict)


def queue_order(waiters: Sequence[Waiter]) -> list[Waiter]:
    """The order waiters are served in: priority (higher first), then arrival.

    Args:
        waiters: The queue, in any order.

    Returns:
        Them in serving order.
    """
    return sorted(waiters, key=lambda w: (-w.priority, w.arrival, w.ticket))


def decide(
    waiters: Sequence[Waiter],
    idle: Mapping[str, Sequence[str]],
    holding: Sequence[Holding] = (),
    now: float = 0.0,
) -> Decision:
    """Apply the rules (module docstring) to the queue once.

    Args:
        waiters: Every waiting request.
        idle: Kind -> the names of its idle slices (granted lowest name first).
        holding: The work holding the kinds' other slices.
        now: The current time, on the clock of ``Holding.ends_by``.

    Returns:
        The grants, earmarks and reasons of this pass.
    """
    decision = Decision()
    seen: dict[str, str] = {}
    for kind, names in idle.items():
        for name in names:
            if seen.setdefault(name, kind) != kind:
                raise InvalidArgumentError(
                    f"slice {name} is listed under kinds {seen[name]} and {kind}: each idle "
                    "slice must be offered under one kind"
                )
    ordered = queue_order(waiters)
    for place, waiter in enumerate(ordered, start=1):
        decision.position[waiter.ticket] = place
        decision.ahead[waiter.ticket] = [w.ticket for w in ordered[: place - 1]]
    for kind in dict.fromkeys(w.kind for w in ordered):
        _decide_kind(
            [w for w in ordered if w.kind == kind],
            sorted(idle.get(kind, ())),
            [h for h in holding if h.kind == kind],
            now,
            decision,
        )
    return decision


def _decide_kind(
    waiters: list[Waiter],
    free: list[str],
    holding: list[Holding],
    now: float,
    decision: Decision,
) -> None:
    capacity = len(free) + sum(h.slices for h in holding)
    by_ticket = {w.ticket: w for w in waiters}
    # When each held slice is promised back (its work's limit; no limit: at any moment).
    ends = sorted(now if h.ends_by is None else h.ends_by for h in holding for _ in range(h.slices))

    def started(waiter: Waiter, slices: tuple[str, ...]) -> None:
        decision.grants[waiter.ticket] = slices
        back = now if waiter.time_limit_s is None else now + waiter.time_limit_s
        for _ in slices:
            bisect.insort(ends, back)

    # When each blocked waiter could start at the earliest (all of them, so far).
    start_bound = math.inf
    earmarked: dict[str, list[str]] = {}
    waiting_for = 0  # slices the blocked waiters still need beyond what is earmarked
    for waiter in waiters:
        low, high = waiter.count
        if low > capacity:
            decision.never[waiter.ticket] = (
                f"needs {low} slice(s) of {waiter.kind}; the cluster has {capacity}"
            )
            continue
        if not earmarked and len(free) >= low:
            taken, free = free[: min(high, len(free))], free[min(high, len(free)) :]
            started(waiter, tuple(taken))
            continue
        if earmarked:
            lent = _backfill(waiter, earmarked, now, start_bound)
            if lent is not None:
                started(waiter, lent)
                continue
        # Blocked: keep what is idle for it, and say when it could start at the earliest.
        mine, free = free, []
        earmarked[waiter.ticket] = mine
        waiting_for += low - len(mine)
        start = ends[waiting_for - 1] if waiting_for <= len(ends) else math.inf
        start_bound = min(start_bound, start)
    for ahead, (ticket, slices) in enumerate(earmarked.items()):
        decision.earmarks[ticket] = tuple(slices)
        low, kind = by_ticket[ticket].count[0], by_ticket[ticket].kind
        decision.blocked[ticket] = (
            f"needs {low} slice(s) of {kind}, behind {ahead} earlier request(s) for them"
            if ahead
            else f"needs {low} slice(s) of {kind}: {len(slices)} idle kept for it, "
            f"{low - len(slices)} more when running work gives them back"
        )


def _backfill(
    waiter: Waiter, earmarked: dict[str, list[str]], now: float, start_bound: float
) -> tuple[str, ...] | None:
    """Lend a time-limited waiter slices earmarked for the blocked waiters ahead of it,
    if it gives them back before any of those could start; None if it may not."""
    if waiter.time_limit_s is None or now + waiter.time_limit_s > start_bound:
        return None
    pool = sorted(s for slices in earmarked.values() for s in slices)
    low, high = waiter.count
    if len(pool) < low:
        return None
    lent = tuple(pool[: min(high, len(pool))])
    for slices in earmarked.values():
        slices[:] = [s for s in slices if s not in lent]
    return lent
