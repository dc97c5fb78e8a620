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
4. **Other kinds.** A later waiter may start, out of order, on idle slices of another
   kind; never on slices earmarked for a waiter ahead of it.
5. **Suspects last.** Idle slices with a suspect host (one that failed a run lately) are
   granted only as a last resort (:func:`last_resort`), and after every trusted idle one.

Nothing here preempts running work.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tpuslice.errors import InvalidArgumentError

LAST_RESORT_S = 30.0
"""A waiter whose deadline is this close may be granted a suspect slice rather than time
out: enough to claim it (one placement round, bounded at 2 s) and to check its hosts
before the work starts, with room to spare for a queue that decides once a second."""


def last_resort(trusted: int, least: int, time_left_s: float | None) -> bool:
    """Whether a request may be granted slices with a suspect host: when its kind has
    fewer trusted slices (ready or busy, none suspect) than the least it needs, so
    waiting for trusted ones could never serve it; or when its deadline is within
    :data:`LAST_RESORT_S`. Trusted idle slices are granted first even then.

    Args:
        trusted: The kind's trusted slices, idle or busy.
        least: The least count the request can start with.
        time_left_s: Seconds to its deadline; ``None``: it has none.

    Returns:
        True if suspect slices may be granted to it.
    """
    return trusted < least or (time_left_s is not None and time_left_s <= LAST_RESORT_S)


@dataclass(frozen=True)
class Waiter:
    """A waiting request.

    Attributes:
        ticket: Its id in the queue.
        kind: The kind of slice it needs (every slice of one kind can serve it).
        count: ``(min, max)`` slices; an int request is ``(n, n)``.
        priority: Higher first.
        arrival: Its place in arrival order (the queue's sequence number).
        deadline: When it gives up, on the clock the queue decides by; ``None``: never.
    """

    ticket: str
    kind: str
    count: tuple[int, int]
    priority: int = 0
    arrival: int = 0
    deadline: float | None = None

    def __post_init__(self) -> None:
        low, high = self.count
        if not 1 <= low <= high:
            raise InvalidArgumentError(
                f"request {self.ticket}: count {self.count} must be (min, max) with 1 <= min <= max"
            )


@dataclass(frozen=True)
class Holding:
    """Running work holding slices.

    Attributes:
        kind: The kind of its slices.
        slices: How many it holds.
    """

    kind: str
    slices: int


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
    *,
    suspects: Mapping[str, Sequence[str]] | None = None,
    trusted: Mapping[str, int] | None = None,
    now: float = 0.0,
) -> Decision:
    """Apply the rules (module docstring) to the queue once.

    Args:
        waiters: Every waiting request.
        idle: Kind -> the names of its idle trusted slices (granted lowest name first).
        holding: The work holding the kinds' other slices (suspect ones included).
        suspects: Kind -> the names of its idle slices with a suspect host.
        trusted: Kind -> how many of its slices are trusted, idle or busy (default:
            its idle ones and those held).
        now: The time on the clock of the waiters' deadlines.

    Returns:
        The grants, earmarks and reasons of this pass.
    """
    decision = Decision()
    seen: dict[str, str] = {}
    suspects = suspects or {}
    for kind, names in [*idle.items(), *suspects.items()]:
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
        held = [h for h in holding if h.kind == kind]
        free = sorted(idle.get(kind, ()))
        count = trusted.get(kind, 0) if trusted is not None else len(free) + _held(held)
        _decide_kind(
            [w for w in ordered if w.kind == kind],
            _Offer(free, sorted(suspects.get(kind, ())), count),
            held,
            decision,
            now,
        )
    return decision


def _held(holding: Sequence[Holding]) -> int:
    return sum(h.slices for h in holding)


@dataclass
class _Offer:
    """One kind's idle slices in a pass: trusted ones, suspect ones, and how many trusted
    slices (idle or busy) the kind has."""

    free: list[str]
    suspects: list[str]
    trusted: int

    def usable(self, waiter: Waiter, now: float) -> list[str]:
        """What the waiter may be granted: the trusted idle slices, then the suspect ones
        if it may have a last resort."""
        left = None if waiter.deadline is None else waiter.deadline - now
        if self.suspects and last_resort(self.trusted, waiter.count[0], left):
            return self.free + self.suspects
        return list(self.free)

    def take(self, names: Sequence[str]) -> None:
        taken = set(names)
        self.free = [s for s in self.free if s not in taken]
        self.suspects = [s for s in self.suspects if s not in taken]


def _decide_kind(
    waiters: list[Waiter],
    offer: _Offer,
    holding: list[Holding],
    decision: Decision,
    now: float,
) -> None:
    capacity = len(offer.free) + len(offer.suspects) + _held(holding)
    by_ticket = {w.ticket: w for w in waiters}
    earmarked: dict[str, list[str]] = {}
    for waiter in waiters:
        low, high = waiter.count
        if low > capacity:
            decision.never[waiter.ticket] = (
                f"needs {low} slice(s) of {waiter.kind}; the cluster has {capacity}"
            )
            continue
        usable = offer.usable(waiter, now)
        if not earmarked and len(usable) >= low:
            taken = usable[: min(high, len(usable))]
            offer.take(taken)
            decision.grants[waiter.ticket] = tuple(sorted(taken))
            continue
        # Blocked: keep what is idle for it; every later waiter of its kind waits behind it.
        earmarked[waiter.ticket] = usable
        offer.take(usable)
    for ahead, (ticket, slices) in enumerate(earmarked.items()):
        decision.earmarks[ticket] = tuple(slices)
        low, kind = by_ticket[ticket].count[0], by_ticket[ticket].kind
        decision.blocked[ticket] = (
            f"needs {low} slice(s) of {kind}, behind {ahead} earlier request(s) for them"
            if ahead
            else f"needs {low} slice(s) of {kind}: {len(slices)} idle kept for it, "
            f"{low - len(slices)} more when running work gives them back"
        )
        if not ahead and offer.suspects:
            decision.blocked[ticket] += (
                f"; {len(offer.suspects)} idle with a suspect host, kept for a last resort"
            )
