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
   kind; never on slices earmarked for a waiter ahead of it. A waiter restricted to some
   slices of its kind (label selectors) is, for this rule, of a kind of its own: blocked,
   it holds back only the slices it could take, and it never causes a preemption.
5. **Suspects last.** Idle slices with a suspect host (one that failed a run lately) are
   granted only as a last resort (:func:`last_resort`), and after every trusted idle one.
6. **Tenants.** With quotas configured, the order across tenants is by standing and fair
   share, and grants keep to borrow limits (:mod:`tpuslice._reserve.queue.share`); within a
   tenant it stays priority, then arrival. With none configured, rule 1 holds as is.
7. **Preemption, only when needed.** When the first blocked request of a kind can be
   served only by taking slices back, running work marked preemptible is chosen to leave:
   work of lower priority, or, for a request within its tenant's quota, work borrowing
   beyond its own tenant's quota. Lowest priority and most recently started go first, and
   only if enough can be freed that way. Nothing is preempted while slices that end
   within the victims' grace period would serve the request, nor twice, nor work that is
   not preemptible, nor another tenant's work within its quota for a priority.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from tpuslice._reserve.queue.share import Sharing
from tpuslice._view.quotas import Quotas, Standing, describe_tenant
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
        tenant: Whom it is charged to (``""``: no tenant named).
        preemptible: Whether its work may be preempted once it runs.
        only: The slices of its kind it may be granted (its label selectors accept no
            others); ``None``: any.
    """

    ticket: str
    kind: str
    count: tuple[int, int]
    priority: int = 0
    arrival: int = 0
    deadline: float | None = None
    tenant: str = ""
    preemptible: bool = False
    only: frozenset[str] | None = None

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
        tenant: Whom it is charged to (``""``: unknown or none).
        priority: Its priority.
        preemptible: Whether it may be preempted.
        started: When it started (seconds, the clock of ``now``).
        holder: Its id, to preempt it by (``""``: it cannot be preempted from here).
        ends_at: When it is known to end (it was preempted, or its hosts are under a
            notice), on the clock of ``now``; ``None``: not known.
        who: Who runs it, for messages.
    """

    kind: str
    slices: int
    tenant: str = ""
    priority: int = 0
    preemptible: bool = False
    started: float = 0.0
    holder: str = ""
    ends_at: float | None = None
    who: str = ""


@dataclass(frozen=True)
class Preemption:
    """Running work told to leave so that a waiting request can be served.

    Attributes:
        holder: The work's id (:attr:`Holding.holder`).
        ticket: The request it leaves for.
        reason: Why, for the work's notice and the timeline.
        grace_s: How long it has to leave before its slices are taken.
        cause: ``quota`` (a tenant takes back its quota) or ``priority``.
    """

    holder: str
    ticket: str
    reason: str
    grace_s: float
    cause: str = "priority"


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
        preempt: Holder -> the preemption that tells it to leave (new in this pass).
        order: Every ticket in the order it was served.
    """

    grants: dict[str, tuple[str, ...]] = field(default_factory=dict)
    earmarks: dict[str, tuple[str, ...]] = field(default_factory=dict)
    blocked: dict[str, str] = field(default_factory=dict)
    never: dict[str, str] = field(default_factory=dict)
    position: dict[str, int] = field(default_factory=dict)
    ahead: dict[str, list[str]] = field(default_factory=dict)
    preempt: dict[str, Preemption] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)


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
    sharing: Sharing | None = None,
    unread: Collection[str] = (),
) -> Decision:
    """Apply the rules (module docstring) to the queue once.

    Args:
        waiters: Every waiting request.
        idle: Kind -> the names of its idle trusted slices (granted lowest name first).
        holding: The work holding the kinds' other slices (suspect ones included).
        suspects: Kind -> the names of its idle slices with a suspect host.
        trusted: Kind -> how many of its slices are trusted, idle or busy (default:
            its idle ones and those held).
        now: The time on the clock of the waiters' deadlines and the holdings' times.
        sharing: The cluster's quotas and its tenants' past use (default: none
            configured).
        unread: Kinds whose slices this pass did not read (their first waiter arrived
            during the read): their waiters are left as they were, for the next pass.

    Returns:
        The grants, earmarks, preemptions and reasons of this pass.

    Raises:
        InvalidArgumentError: a slice is offered under two kinds.
    """
    decision = Decision()
    sharing = sharing or Sharing()
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
    ledger = _Ledger(sharing.quotas, holding)
    for kind in dict.fromkeys(w.kind for w in ordered):
        if kind in unread:  # its waiters are judged at a pass that read its slices
            for waiter in ordered:
                if waiter.kind == kind:
                    decision.blocked[waiter.ticket] = f"the queue reads the {kind} slices next"
            continue
        held = [h for h in holding if h.kind == kind]
        free = sorted(idle.get(kind, ()))
        count = trusted.get(kind, 0) if trusted is not None else len(free) + _held(held)
        _KindPass(
            kind,
            _Offer(free, sorted(suspects.get(kind, ())), count),
            held,
            decision,
            now,
            sharing,
            ledger,
        ).run([w for w in ordered if w.kind == kind])
    if not sharing.quotas.configured:
        decision.order = [w.ticket for w in ordered]
    for place, ticket in enumerate(decision.order, start=1):
        decision.position[ticket] = place
        decision.ahead[ticket] = decision.order[: place - 1]
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
        usable = list(self.free)
        # A waiter that names its slices (no more than it wants) has no other to wait for.
        named = waiter.only is not None and len(waiter.only) <= waiter.count[1]
        if self.suspects and (named or last_resort(self.trusted, waiter.count[0], left)):
            usable += self.suspects
        return usable if waiter.only is None else [s for s in usable if s in waiter.only]

    def take(self, names: Sequence[str]) -> None:
        taken = set(names)
        self.free = [s for s in self.free if s not in taken]
        self.suspects = [s for s in self.suspects if s not in taken]


class _Ledger:
    """Slices each tenant holds, counted per quota key (a pod type's quota covers every
    topology of it, so holdings of every kind it covers count against it), and of those
    the ones that cannot be preempted; shared by every kind of a pass, and grown by its
    grants."""

    def __init__(self, quotas: Quotas, holding: Sequence[Holding]) -> None:
        self.quotas = quotas
        self.held: dict[tuple[str, str], int] = {}
        self.fixed: dict[tuple[str, str], int] = {}
        for h in holding:
            self.add(h.tenant, h.kind, h.slices, preemptible=h.preemptible)

    def _key(self, tenant: str, kind: str) -> tuple[str, str]:
        return tenant, self.quotas.key_for(tenant, kind)

    def add(self, tenant: str, kind: str, slices: int, *, preemptible: bool) -> None:
        key = self._key(tenant, kind)
        self.held[key] = self.held.get(key, 0) + slices
        if not preemptible:
            self.fixed[key] = self.fixed.get(key, 0) + slices

    def held_of(self, tenant: str, kind: str) -> int:
        return self.held.get(self._key(tenant, kind), 0)

    def fixed_of(self, tenant: str, kind: str) -> int:
        return self.fixed.get(self._key(tenant, kind), 0)

    def tenants(self) -> set[str]:
        return {tenant for tenant, _ in self.held}

    def borrowing(self, tenant: str, kind: str) -> bool:
        """Whether the tenant holds more of the kind's quota key than its quota."""
        return self.held_of(tenant, kind) > self.quotas.nominal(tenant, kind)

    def copy(self) -> _Ledger:
        ledger = _Ledger(self.quotas, ())
        ledger.held, ledger.fixed = dict(self.held), dict(self.fixed)
        return ledger


class _KindPass:
    """One kind's part of a pass: grants in serving order, then earmarks, reasons and any
    preemption for the first blocked request."""

    def __init__(
        self,
        kind: str,
        offer: _Offer,
        holding: list[Holding],
        decision: Decision,
        now: float,
        sharing: Sharing,
        ledger: _Ledger,
    ) -> None:
        self.kind = kind
        self.offer = offer
        self.holding = holding
        self.decision = decision
        self.now = now
        self.sharing = sharing
        self.quotas: Quotas = sharing.quotas
        self.capacity = len(offer.free) + len(offer.suspects) + _held(holding)
        self.ledger = ledger
        # Slices of the kind that no quota covers: the most that work which cannot be
        # preempted may hold beyond its tenants' quotas, so every quota can be taken back.
        self.pool = max(0, self.capacity - self.quotas.covered(kind))

    def run(self, waiters: list[Waiter]) -> None:
        earmarked: dict[str, list[str]] = {}
        behind = False
        """Whether a blocked waiter ahead could take any slice of the kind: then every
        later one waits behind it (one restricted by labels holds back only its own
        slices, which it took out of the offer)."""
        by_ticket = {w.ticket: w for w in waiters}
        for waiter in self._serving(waiters):
            self.decision.order.append(waiter.ticket)
            low, high = waiter.count
            capacity = self.capacity if waiter.only is None else len(waiter.only)
            if low > capacity:
                accepted = "" if waiter.only is None else " that its label selectors accept"
                self.decision.never[waiter.ticket] = (
                    f"needs {low} slice(s) of {waiter.kind}; the cluster has {capacity}{accepted}"
                )
                continue
            if self.quotas.configured:
                room, why = self._room(waiter)
                if room < low:
                    self.decision.blocked[waiter.ticket] = why
                    continue
                high = min(high, room)
            usable = self.offer.usable(waiter, self.now)
            if not behind and len(usable) >= low:
                taken = usable[: min(high, len(usable))]
                self.offer.take(taken)
                self.decision.grants[waiter.ticket] = tuple(sorted(taken))
                self._count(waiter, len(taken))
                continue
            # Blocked: keep what is idle for it.
            earmarked[waiter.ticket] = usable
            self.offer.take(usable)
            behind = behind or waiter.only is None
        for ahead, (ticket, slices) in enumerate(earmarked.items()):
            self.decision.earmarks[ticket] = tuple(slices)
            self.decision.blocked[ticket] = self._blocked_reason(
                by_ticket[ticket], ahead, len(slices), by_ticket, earmarked
            )
            if not ahead and by_ticket[ticket].only is None:
                self._preempt_for(by_ticket[ticket], len(slices))

    def _serving(self, waiters: list[Waiter]) -> Iterator[Waiter]:
        """The kind's waiters in serving order. With quotas, the next is the head of the
        tenant whose head has the best standing, then the lowest weighted usage; standings
        are judged as grants are made (the ledger grows between yields)."""
        if not self.quotas.configured:
            yield from waiters
            return
        queues: dict[str, list[Waiter]] = {}
        for waiter in waiters:
            queues.setdefault(waiter.tenant, []).append(waiter)

        def key(tenant: str) -> tuple[int, float, int, int, str]:
            head = queues[tenant][0]
            held = self.ledger.held_of(tenant, self.kind)
            standing = self.quotas.standing(tenant, self.kind, held, head.count[0])
            weighted = self.sharing.weighted(tenant)
            return (standing, weighted, -head.priority, head.arrival, head.ticket)

        while queues:
            tenant = min(queues, key=key)
            yield queues[tenant].pop(0)
            if not queues[tenant]:
                del queues[tenant]

    def _room(self, waiter: Waiter) -> tuple[int, str]:
        """The most slices the waiter's tenant may be granted now, and why not more."""
        tenant, kind = waiter.tenant, self.kind
        quota = self.quotas.of(tenant)
        nominal = self.quotas.nominal(tenant, kind)
        held = self.ledger.held_of(tenant, kind)
        room, why = self.capacity, ""
        if quota is not None and quota.borrow_limit is not None:
            room = nominal + quota.borrow_limit - held
            why = (
                f"{describe_tenant(tenant)} at its borrow limit: it holds {held} slice(s) of "
                f"{kind} against a quota of {nominal} and may borrow {quota.borrow_limit} "
                f"more; waits for its own work to end (or raise the limit: tpuslice quota "
                f"set {tenant} --borrow-limit N)"
            )
        if not waiter.preemptible:
            others = sum(
                max(0, self.ledger.fixed_of(t, kind) - self.quotas.nominal(t, kind))
                for t in self.ledger.tenants()
                if t != tenant
            )
            fixed = self.ledger.fixed_of(tenant, kind)
            unprotected = nominal + max(0, self.pool - others) - fixed
            if unprotected < room:
                room = unprotected
                if quota is None:
                    standing = f"{describe_tenant(tenant)} has no quota"
                else:
                    standing = f"{describe_tenant(tenant)} at quota ({held} of {nominal} {kind})"
                covered = (
                    f"every slice of {kind} is in some tenant's quota"
                    if self.pool == 0
                    else f"the {self.pool} slice(s) of {kind} that no quota covers are in use"
                )
                why = (
                    f"{standing}; work that cannot be preempted runs beyond quotas only on "
                    f"slices no quota covers, and {covered}; make it preemptible "
                    "(preemptible=True) to borrow unused quota"
                )
        return room, why

    def _count(self, waiter: Waiter, slices: int) -> None:
        self.ledger.add(waiter.tenant, self.kind, slices, preemptible=waiter.preemptible)

    def _blocked_reason(
        self,
        waiter: Waiter,
        ahead: int,
        kept: int,
        by_ticket: Mapping[str, Waiter],
        earmarked: Mapping[str, list[str]],
    ) -> str:
        low, kind = waiter.count[0], waiter.kind
        if ahead:
            before = list(earmarked)[:ahead]
            higher = sum(1 for t in before if by_ticket[t].priority > waiter.priority)
            more = f", {higher} of higher priority" if higher else ""
            reason = f"needs {low} slice(s) of {kind}, behind {ahead} earlier request(s) for them"
            return reason + more
        reason = (
            f"needs {low} slice(s) of {kind}: {kept} idle kept for it, "
            f"{low - kept} more when running work gives them back"
        )
        if self.offer.suspects:
            spare = len(self.offer.suspects)
            reason += f"; {spare} idle with a suspect host, kept for a last resort"
        if self.quotas.configured:
            held = self.ledger.held_of(waiter.tenant, kind)
            standing = self.quotas.standing(waiter.tenant, kind, held, low)
            nominal = self.quotas.nominal(waiter.tenant, kind)
            reason += {
                Standing.WITHIN: f"; within {describe_tenant(waiter.tenant)}'s quota "
                f"({held} of {nominal} in use)",
                Standing.BORROWING: f"; {describe_tenant(waiter.tenant)} would borrow "
                f"beyond its quota ({held} of {nominal} in use)",
                Standing.NO_QUOTA: f"; {describe_tenant(waiter.tenant)} has no quota and "
                "shares what is left over",
            }[standing]
        return reason

    def _may_preempt(self, waiter: Waiter, victim: Holding, ledger: _Ledger) -> tuple[str, str]:
        """Why the victim may leave for the waiter: ``(cause, reason)``; ``("", "")``
        if it may not."""
        if not (victim.preemptible and victim.holder and victim.ends_at is None):
            return "", ""
        configured = self.quotas.configured
        # Work of a tenant holding more than its quota is borrowing (as in Kueue),
        # even if taking it back leaves that tenant below its quota: a reservation
        # leaves whole.
        borrowed = (
            configured
            and victim.tenant != waiter.tenant
            and ledger.borrowing(victim.tenant, self.kind)
        )
        if borrowed:
            low = waiter.count[0]
            held = self.ledger.held_of(waiter.tenant, self.kind)
            standing = self.quotas.standing(waiter.tenant, self.kind, held, low)
            if standing is Standing.WITHIN:
                return "quota", (
                    f"{describe_tenant(waiter.tenant)} takes back its quota, which "
                    f"{describe_tenant(victim.tenant)} borrowed"
                )
        if victim.priority < waiter.priority and (
            not configured or victim.tenant == waiter.tenant or borrowed
        ):
            return "priority", (
                f"a request of priority {waiter.priority} outranks its {victim.priority}"
            )
        return "", ""

    def _preempt_for(self, waiter: Waiter, kept: int) -> None:
        """Choose running work to leave for the first blocked waiter, if that is the only
        way to serve it (module docstring, rule 7). Slices already leaving within the
        grace the new work would get count towards it: nothing is preempted while they
        would serve it, and only what they do not cover is taken from new work."""
        need = waiter.count[0] - kept
        order = sorted(self.holding, key=lambda h: (h.priority, -h.started, h.holder))
        eligible = [h for h in order if self._may_preempt(waiter, h, self.ledger)[1]]
        if not eligible:
            return
        grace = max(self.quotas.grace_s(h.tenant) for h in eligible)
        soon = sum(
            h.slices
            for h in self.holding
            if h.ends_at is not None and h.ends_at <= self.now + grace
        )
        if soon >= need:
            return
        ledger = self.ledger.copy()
        chosen: list[tuple[Holding, str, str]] = []
        got = soon
        for victim in order:
            if got >= need:
                break
            cause, why = self._may_preempt(waiter, victim, ledger)
            if why:
                chosen.append((victim, cause, why))
                got += victim.slices
                ledger.add(victim.tenant, self.kind, -victim.slices, preemptible=True)
        if got < need:
            return
        grace = max(self.quotas.grace_s(v.tenant) for v, _, _ in chosen)
        ask = f"{waiter.count[0]} x {waiter.kind} of {describe_tenant(waiter.tenant)}"
        names = []
        for victim, cause, why in chosen:
            own = self.quotas.grace_s(victim.tenant)
            self.decision.preempt[victim.holder] = Preemption(
                victim.holder, waiter.ticket, f"preempted for {ask}: {why}", own, cause
            )
            names.append(f"{victim.who or victim.holder} of {describe_tenant(victim.tenant)}")
        self.decision.blocked[waiter.ticket] += (
            f"; preempting {', '.join(names)}: grace ends in {grace:.0f} s"
        )
