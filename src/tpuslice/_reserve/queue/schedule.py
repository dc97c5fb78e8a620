"""Who gets idle slices of a *kind* (e.g. every ``v6e-16``) next: the queue's policy. Pure.
The rules, told to users in docs/concepts.md and docs/teams.md:

1. Higher ``priority`` first; within a priority, arrival order.
2. All or nothing: at least the minimum count at once, or nothing; up to the maximum.
3. A blocked waiter earmarks its kind's idle slices, so small requests cannot starve a big one.
4. A later waiter may start out of order on another kind's slices, never on earmarked ones; one
   restricted by label selectors holds back only the slices it could take, and preempts nothing.
5. Slices with a suspect host only as a last resort (:func:`last_resort`), after trusted ones.
6. With quotas, tenants go by standing and fair share, within borrow limits (:mod:`.share`).
7. Preemption only when needed, of preemptible work: of lower priority (same tenant, or
   borrowing), or borrowing when the request is within its quota. Lowest priority and latest
   started first, only if enough can be freed; never while slices ending within the grace
   would serve, never twice.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from tpuslice._reserve.queue.share import Sharing
from tpuslice._view.quotas import Quotas, Standing, describe_tenant
from tpuslice.errors import InvalidArgumentError

LAST_RESORT_S = 30.0
"""A waiter this close to its deadline may be granted a suspect slice rather than time out
(time to claim it and check its hosts)."""


def last_resort(trusted: int, least: int, time_left_s: float | None) -> bool:
    """Whether a request may be granted slices with a suspect host: when the kind's trusted
    slices (idle or busy) could never serve its ``least`` count, or its deadline (``None``:
    none) is within :data:`LAST_RESORT_S`."""
    return trusted < least or (time_left_s is not None and time_left_s <= LAST_RESORT_S)


@dataclass(frozen=True)
class Waiter:
    """A waiting request for ``count`` = ``(min, max)`` slices; ``deadline`` is when it gives
    up, on the queue's clock (``None``: never), and ``only`` the slices its label selectors
    accept (``None``: any of its kind)."""

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
    """Running work holding ``slices`` slices of a kind; times are on the clock of ``now``."""

    kind: str
    slices: int
    tenant: str = ""
    priority: int = 0
    preemptible: bool = False
    started: float = 0.0
    holder: str = ""
    """Its id, to preempt it by (``""``: it cannot be preempted from here)."""
    ends_at: float | None = None
    """When it is known to end (preempted, or under a notice); ``None``: not known."""
    who: str = ""


@dataclass(frozen=True)
class Preemption:
    """Running work (``holder``) told to leave, within ``grace_s``, for request ``ticket``;
    ``reason`` is for its notice and the timeline, ``cause`` ``quota`` or ``priority``."""

    holder: str
    ticket: str
    reason: str
    grace_s: float
    cause: str = "priority"


@dataclass
class Decision:
    """One pass over the queue: per ticket its grant, earmarks, and why it is blocked or can
    never be granted; new preemptions by holder; every ticket in serving order."""

    grants: dict[str, tuple[str, ...]] = field(default_factory=dict)
    earmarks: dict[str, tuple[str, ...]] = field(default_factory=dict)
    blocked: dict[str, str] = field(default_factory=dict)
    never: dict[str, str] = field(default_factory=dict)
    preempt: dict[str, Preemption] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)


def queue_order(waiters: Sequence[Waiter]) -> list[Waiter]:
    """The order waiters are served in without quotas: priority (higher first), then arrival."""
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
    """Apply the rules to the queue once. ``idle`` maps a kind to its idle trusted slices
    (granted lowest name first), ``suspects`` to those with a suspect host, ``trusted`` to the
    count of its trusted slices, idle or busy (default: idle and held). Waiters of ``unread``
    kinds wait for a pass that read their slices. A slice offered under two kinds is an error."""
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
    return decision


def _held(holding: Sequence[Holding]) -> int:
    return sum(h.slices for h in holding)


@dataclass
class _Offer:
    """One kind's idle slices in a pass, and how many trusted slices (idle or busy) it has."""

    free: list[str]
    suspects: list[str]
    trusted: int

    def usable(self, waiter: Waiter, now: float) -> list[str]:
        """The trusted idle slices the waiter may take, then suspect ones as a last resort."""
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
    """Slices each tenant holds per quota key (a pod type's quota covers all its topologies),
    and of those the ones that cannot be preempted; shared by a pass's kinds, grown by grants."""

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


@dataclass
class _KindPass:
    """One kind's part of a pass: grants, then earmarks, reasons and any preemption."""

    kind: str
    offer: _Offer
    holding: list[Holding]
    decision: Decision
    now: float
    sharing: Sharing
    ledger: _Ledger

    def __post_init__(self) -> None:
        self.quotas: Quotas = self.sharing.quotas
        self.capacity = len(self.offer.free) + len(self.offer.suspects) + _held(self.holding)
        # Unquoted slices: all that work that cannot be preempted may hold beyond its quota.
        self.pool = max(0, self.capacity - self.quotas.covered(self.kind))

    def run(self, waiters: list[Waiter]) -> None:
        earmarked: dict[str, list[str]] = {}
        # A blocked waiter ahead could take any slice, so later ones wait (one restricted by
        # labels holds back only its own slices, already taken out of the offer).
        behind = False
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
                self.ledger.add(
                    waiter.tenant, self.kind, len(taken), preemptible=waiter.preemptible
                )
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
        """The kind's waiters in serving order: with quotas, next is the head of the tenant with
        the best standing, then lowest weighted usage (judged as grants are made)."""
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
            who, use = describe_tenant(waiter.tenant), f"({held} of {nominal} in use)"
            reason += {
                Standing.WITHIN: f"; within {who}'s quota {use}",
                Standing.BORROWING: f"; {who} would borrow beyond its quota {use}",
                Standing.NO_QUOTA: f"; {who} has no quota and shares what is left over",
            }[standing]
        return reason

    def _may_preempt(self, waiter: Waiter, victim: Holding, ledger: _Ledger) -> tuple[str, str]:
        """``(cause, reason)`` the victim may leave for the waiter; ``("", "")`` if it may not."""
        if not (victim.preemptible and victim.holder and victim.ends_at is None):
            return "", ""
        configured = self.quotas.configured
        # A tenant holding more than its quota is borrowing (as in Kueue), even if taking the
        # work back leaves it below: a reservation leaves whole.
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
        """Choose running work to leave for the first blocked waiter (rule 7); slices already
        leaving within the grace count towards it."""
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
