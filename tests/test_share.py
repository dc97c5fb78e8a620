"""Tenants sharing a cluster (tpuslice._reserve.queue.share and the queue's policy with quotas):
standing, borrowing and its limits, taking a quota back, priority preemption only when
needed, weighted fair share over a replayed workload, decay, and no starvation. Pure."""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

import pytest

from tpuslice._reserve.queue.schedule import Decision, Holding, Waiter, decide
from tpuslice._reserve.queue.share import Sharing, Usage
from tpuslice._view.quotas import Quotas, Standing, TenantQuota, quota_keys
from tpuslice.errors import InvalidArgumentError

KIND = "v6e-16 4x4"


def ask(ticket: str, tenant: str, low: int = 1, high: int | None = None, **kw: object) -> Waiter:
    return Waiter(ticket, KIND, (low, high or low), tenant=tenant, **kw)  # type: ignore[arg-type]


def run(holder: str, tenant: str, slices: int = 1, **kw: object) -> Holding:
    return Holding(KIND, slices, tenant=tenant, holder=holder, who=holder, **kw)  # type: ignore[arg-type]


def quotas(**tenants: TenantQuota) -> Quotas:
    return Quotas(tenants)


def share(q: Quotas, **usage: float) -> Sharing:
    return Sharing(q, usage)


def idle(*names: str) -> dict[str, list[str]]:
    return {KIND: list(names)}


# --- the configuration ------------------------------------------------------------------


def test_a_quota_names_a_pod_type_or_a_pod_type_and_topology() -> None:
    quota = TenantQuota({"v6e-16": 2, "v4-16 2x2x2": 1})
    assert quota.nominal("v6e-16 4x4") == 2
    assert quota.nominal("v6e-16 4x4 (8 chips/host)") == 2
    assert quota.nominal("v4-16 2x2x2") == 1
    assert quota.nominal("v4-16 4x2") == 0
    assert TenantQuota({"v6e-16": 2, "v6e-16 4x4": 5}).nominal("v6e-16 4x4") == 5
    assert quota_keys("v5p-64 4x4x4") == ("v5p-64", "v5p-64 4x4x4")


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"slices": {"v6e-16": -1}}, "cannot be negative"),
        ({"slices": {"": 1}}, "pod type"),
        ({"slices": {"v6e-16": 1.5}}, "whole number"),
        ({"borrow_limit": -2}, "borrow limit -2"),
        ({"weight": 0.0}, "weight 0.0"),
        ({"weight": float("nan")}, "weight nan"),
        ({"grace_s": -1.0}, "grace -1.0"),
    ],
)
def test_a_bad_quota_is_refused_saying_what_to_give(kw: dict[str, object], says: str) -> None:
    with pytest.raises(InvalidArgumentError, match=says):
        TenantQuota(**kw)  # type: ignore[arg-type]


def test_quotas_survive_the_store_and_a_bad_record_is_not_quotas() -> None:
    stored = Quotas(half_life_s=600).with_tenant(
        "team-a", TenantQuota({"v6e-16": 2}, borrow_limit=1, weight=2.0, grace_s=10)
    )
    stored = stored.with_tenant("team-b", TenantQuota({"v4-16": 1}))
    back = Quotas.from_json(stored.to_json())
    assert back == stored and back.half_life_s == 600
    assert back.with_tenant("team-a", None).tenants.keys() == {"team-b"}
    for raw in (b"[]", b'{"tenants": {"a": {"slices": {"x": -1}}}}', b'{"half_life_s": 0}'):
        with pytest.raises(ValueError):
            Quotas.from_json(raw)


def test_standing_within_then_borrowing_and_no_quota_last() -> None:
    q = quotas(a=TenantQuota({"v6e-16": 2}))
    assert q.standing("a", KIND, held=1, more=1) is Standing.WITHIN
    assert q.standing("a", KIND, held=2, more=1) is Standing.BORROWING
    assert q.standing("c", KIND, held=0, more=1) is Standing.NO_QUOTA


# --- quotas and borrowing ---------------------------------------------------------------


def test_no_quota_configured_keeps_the_plain_order() -> None:
    queue = [ask("late", "b", arrival=2), ask("early", "a", arrival=1), ask("hi", "b", priority=3)]
    got = decide(queue, idle("s1"), sharing=share(Quotas(), a=1e9))
    assert got.grants == {"hi": ("s1",)}
    assert got.order == ["hi", "early", "late"]


def test_a_tenant_within_its_quota_goes_before_earlier_borrowers_and_tenants_without() -> None:
    q = quotas(a=TenantQuota({"v6e-16": 1}), b=TenantQuota({"v6e-16": 1}))
    queue = [
        ask("c-first", "c", arrival=1, preemptible=True),  # no quota
        ask("b-over", "b", arrival=2),  # b already holds its one: borrowing
        ask("a-own", "a", arrival=3),  # within a's quota
    ]
    got = decide(queue, idle("s1"), [run("b-run", "b")], sharing=share(q))
    assert got.grants == {"a-own": ("s1",)}
    assert got.order == ["a-own", "b-over", "c-first"]
    assert "has no quota and shares what is left over" in got.blocked["c-first"]


def test_standing_is_judged_as_grants_are_made() -> None:
    """a's second request would take it beyond its quota of 1, so b's request within its
    own quota comes first, though a's usage is lower."""
    q = quotas(a=TenantQuota({"v6e-16": 1}), b=TenantQuota({"v6e-16": 1}))
    queue = [ask("a1", "a", arrival=1), ask("a2", "a", arrival=2), ask("b1", "b", arrival=3)]
    got = decide(queue, idle("s1", "s2"), sharing=share(q, a=0.0, b=500.0))
    assert got.grants == {"a1": ("s1",), "b1": ("s2",)}
    assert got.order == ["a1", "b1", "a2"]


def test_a_tenant_borrows_idle_slices_within_its_limit_and_a_range_is_cut_to_fit() -> None:
    q = quotas(a=TenantQuota({"v6e-16": 1}, borrow_limit=1))
    got = decide([ask("r", "a", 1, 4)], idle("s1", "s2", "s3", "s4"), sharing=share(q))
    assert got.grants == {"r": ("s1", "s2")}  # its quota of 1 and 1 borrowed
    over = decide([ask("x", "a", 2)], idle("s1", "s2"), [run("h", "a")], sharing=share(q))
    assert over.grants == {} and "x" not in over.earmarks
    assert "at its borrow limit" in over.blocked["x"]
    assert "--borrow-limit" in over.blocked["x"]


def test_a_request_held_back_by_its_borrow_limit_does_not_hold_others_back() -> None:
    q = quotas(a=TenantQuota({"v6e-16": 0}, borrow_limit=0), b=TenantQuota({"v6e-16": 1}))
    got = decide(
        [ask("a1", "a", arrival=1), ask("b1", "b", arrival=2)], idle("s1"), sharing=share(q)
    )
    assert got.grants == {"b1": ("s1",)}


def test_work_that_cannot_be_preempted_borrows_only_what_no_quota_covers() -> None:
    """Four slices, a's quota of 3 leaves one no quota covers: b's work that cannot be
    preempted gets that one, and never a slice of a's quota, so a can always take its
    quota back. Preemptible work of b may borrow a's unused quota."""
    q = quotas(a=TenantQuota({"v6e-16": 3}), b=TenantQuota({"v6e-16": 0}))
    four = idle("s1", "s2", "s3", "s4")
    fixed = decide([ask("b1", "b", 1, 4)], four, sharing=share(q))
    assert fixed.grants == {"b1": ("s1",)}
    again = decide([ask("b2", "b")], idle("s2", "s3", "s4"), [run("b1", "b")], sharing=share(q))
    assert again.grants == {} and "make it preemptible" in again.blocked["b2"]
    flexible = decide([ask("b3", "b", 1, 4, preemptible=True)], four, sharing=share(q))
    assert flexible.grants == {"b3": ("s1", "s2", "s3", "s4")}


# --- taking a quota back, and priority --------------------------------------------------


def test_the_owner_of_a_quota_takes_it_back_from_the_latest_lowest_borrower() -> None:
    q = quotas(a=TenantQuota({"v6e-16": 2}, grace_s=12), b=TenantQuota({"v6e-16": 0}, grace_s=20))
    holding = [
        run("b-old", "b", preemptible=True, started=1.0),
        run("b-new", "b", preemptible=True, started=5.0),
        run("b-low", "b", preemptible=True, started=2.0, priority=-1),
        run("b-fixed", "b", started=9.0),
    ]
    got = decide([ask("a1", "a", 2)], {}, holding, sharing=share(q), now=10.0)
    assert set(got.preempt) == {"b-low", "b-new"}
    assert got.preempt["b-new"].ticket == "a1" and got.preempt["b-new"].grace_s == 20
    assert "takes back its quota" in got.preempt["b-new"].reason
    assert (
        "preempting b-low of tenant b, b-new of tenant b: grace ends in 20 s" in got.blocked["a1"]
    )


def test_a_quota_is_taken_back_from_a_reservation_that_only_partly_borrows() -> None:
    """b's quota is 1 and it holds one 2-slice reservation: half of it is borrowed, and
    the reservation leaves whole when a takes back its quota."""
    q = quotas(a=TenantQuota({"v6e-16": 1}), b=TenantQuota({"v6e-16": 1}))
    got = decide([ask("a1", "a")], {}, [run("b2", "b", 2, preemptible=True)], sharing=share(q))
    assert set(got.preempt) == {"b2"} and got.preempt["b2"].cause == "quota"


def test_a_pod_types_quota_counts_every_topology_of_it_together() -> None:
    q = quotas(a=TenantQuota({"v4-64": 1}, borrow_limit=0))
    held = [Holding("v4-64 2x2x8", 1, tenant="a")]
    other = Waiter("x", "v4-64 2x4x4", (1, 1), tenant="a", preemptible=True)
    got = decide([other], {"v4-64 2x4x4": ["s9"]}, held, sharing=share(q))
    assert got.grants == {} and "at its borrow limit" in got.blocked["x"]
    exact = quotas(a=TenantQuota({"v4-64 2x2x8": 1, "v4-64 2x4x4": 1}, borrow_limit=0))
    assert decide([other], {"v4-64 2x4x4": ["s9"]}, held, sharing=share(exact)).grants


def test_nothing_is_preempted_when_it_would_not_serve_the_request() -> None:
    q = quotas(a=TenantQuota({"v6e-16": 2}), b=TenantQuota({"v6e-16": 0}))
    one = [run("b1", "b", preemptible=True), run("b2", "b")]  # only one may be preempted
    assert decide([ask("a1", "a", 2)], {}, one, sharing=share(q)).preempt == {}


def test_nothing_is_preempted_while_idle_slices_serve_or_for_a_borrower() -> None:
    q = quotas(a=TenantQuota({"v6e-16": 1}), b=TenantQuota({"v6e-16": 0}))
    borrowed = [run("b1", "b", preemptible=True)]
    served = decide([ask("a1", "a")], idle("s2"), borrowed, sharing=share(q))
    assert served.grants == {"a1": ("s2",)} and served.preempt == {}
    # a beyond its own quota may not take b's borrowed slice (both borrow).
    beyond = decide([ask("a2", "a")], {}, [*borrowed, run("a1", "a")], sharing=share(q))
    assert beyond.preempt == {}


def test_work_within_its_own_quota_is_never_preempted_for_another_tenant() -> None:
    q = quotas(a=TenantQuota({"v6e-16": 1}), b=TenantQuota({"v6e-16": 1}))
    holding = [run("b1", "b", preemptible=True, priority=0)]
    got = decide(
        [ask("a-urgent", "a", 2, priority=9)], {}, [*holding, run("a0", "a")], sharing=share(q)
    )
    assert got.preempt == {}


def test_a_slice_ending_within_the_grace_period_is_waited_for_instead() -> None:
    q = quotas(a=TenantQuota({"v6e-16": 1}), b=TenantQuota({"v6e-16": 0}, grace_s=30))
    holding = [run("b1", "b", preemptible=True), run("n", "", ends_at=120.0)]
    soon = decide([ask("a1", "a")], {}, holding, sharing=share(q), now=100.0)
    assert soon.preempt == {}
    later = decide([ask("a1", "a")], {}, holding, sharing=share(q), now=80.0)
    assert set(later.preempt) == {"b1"}


def test_work_already_leaving_is_not_preempted_twice_and_counts_towards_the_request() -> None:
    q = quotas(a=TenantQuota({"v6e-16": 2}), b=TenantQuota({"v6e-16": 0}, grace_s=10))
    leaving = [run("b1", "b", preemptible=True, ends_at=8.0), run("b2", "b", preemptible=True)]
    one = decide([ask("a1", "a")], {}, leaving, sharing=share(q), now=0.0)
    assert one.preempt == {}  # b1 leaves within b's grace: that serves it
    # For two, b1's slice counts: only b2 is told to leave, at once, not a grace later.
    two = decide([ask("a2", "a", 2)], {}, leaving, sharing=share(q), now=0.0)
    assert set(two.preempt) == {"b2"}


def test_priority_preempts_lower_preemptible_work_with_no_quotas_configured() -> None:
    holding = [
        run("low", "", preemptible=True, priority=0, started=3.0),
        run("fixed", "", priority=0, started=4.0),
        run("peer", "", preemptible=True, priority=5, started=5.0),
    ]
    got = decide([ask("urgent", "", priority=5)], {}, holding)
    assert set(got.preempt) == {"low"}
    assert "priority 5 outranks its 0" in got.preempt["low"].reason
    assert decide([ask("plain", "", priority=0)], {}, holding).preempt == {}


def test_only_the_first_blocked_request_of_a_kind_preempts() -> None:
    holding = [run(f"h{i}", "", preemptible=True, started=float(i)) for i in range(3)]
    queue = [ask("first", "", priority=2, arrival=1), ask("second", "", priority=2, arrival=2)]
    got = decide(queue, {}, holding)
    assert list(got.preempt) == ["h2"] and got.preempt["h2"].ticket == "first"
    assert "of higher priority" not in got.blocked["second"]


def test_a_later_request_of_lower_priority_is_told_how_many_outrank_it() -> None:
    queue = [ask("hi", "", 2, priority=3), ask("lo", "", 2, priority=0, arrival=1)]
    got = decide(queue, idle("s1"), [run("x", "", 3)])
    assert "behind 1 earlier request(s) for them, 1 of higher priority" in got.blocked["lo"]


# --- fair share over time ---------------------------------------------------------------


@dataclass(order=True)
class _Job:
    ends: float
    holder: str = field(compare=False)
    tenant: str = field(compare=False)


def replay(
    q: Quotas,
    demand: dict[str, list[float]],
    *,
    slices: int,
    horizon_s: float,
    arrivals: dict[str, list[float]] | None = None,
    backlog: int = 0,
    grace_s: float = 5.0,
) -> tuple[dict[str, float], dict[str, list[float]], dict[str, int]]:
    """Run the policy over a workload of 1-slice jobs (their durations in ``demand``).
    Jobs queue at their arrival times, or, with ``backlog``, as soon as their tenant has
    fewer than that many waiting (so every tenant always has demand). They are granted by
    :func:`decide` with the tenants' decayed usage, and run; a job the policy preempts
    leaves ``grace_s`` later and queues again, at its first arrival, for what it had left.
    Returns each tenant's slice-seconds up to the horizon, each job's wait for its first
    grant, and each tenant's preemptions."""
    usage = Usage(q.half_life_s)
    free = [f"s{i}" for i in range(slices)]
    running: list[_Job] = []
    holding: dict[str, Holding] = {}
    slice_of: dict[str, str] = {}
    left: dict[str, float] = {}
    ends: dict[str, float] = {}
    pending: list[tuple[float, str, str]] = []  # (arrival, ticket, tenant)
    for tenant, durations in demand.items():
        times = (arrivals or {}).get(tenant, [0.0] * len(durations))
        for i, (at, duration) in enumerate(zip(times, durations, strict=True)):
            pending.append((at, f"{tenant}-{i:05d}", tenant))
            left[f"{tenant}-{i:05d}"] = duration
    pending.sort()
    first: dict[str, float] = {}
    preempted: set[str] = set()
    started: set[str] = set()
    evicted: dict[str, int] = dict.fromkeys(demand, 0)
    queue: dict[str, Waiter] = {}
    used: dict[str, float] = dict.fromkeys(demand, 0.0)
    waits: dict[str, list[float]] = {t: [] for t in demand}
    now = last = 0.0

    def enqueue(ticket: str, tenant: str) -> None:
        at = first.setdefault(ticket, now)
        queue[ticket] = Waiter(
            ticket,
            KIND,
            (1, 1),
            arrival=int(at * 1e3) * 10**6 + int(ticket[-5:]),
            tenant=tenant,
            preemptible=True,
        )

    while now < horizon_s and (pending or queue or running):
        for job in holding.values():
            usage.add(job.tenant, now - last, now)
            used[job.tenant] += now - last
        last = now
        while running and running[0].ends <= now:
            job = heapq.heappop(running)
            free.append(slice_of.pop(job.holder))
            done = holding.pop(job.holder)
            if job.holder in preempted:  # queue again for the rest
                preempted.discard(job.holder)
                enqueue(job.holder, done.tenant)
        if backlog:
            for tenant in demand:
                waiting = sum(1 for w in queue.values() if w.tenant == tenant)
                mine = [p for p in pending if p[2] == tenant][: max(0, backlog - waiting)]
                for entry in mine:
                    pending.remove(entry)
                    enqueue(entry[1], tenant)
        else:
            while pending and pending[0][0] <= now:
                _, ticket, tenant = pending.pop(0)
                enqueue(ticket, tenant)
        got: Decision = decide(
            list(queue.values()),
            {KIND: sorted(free)},
            list(holding.values()),
            sharing=Sharing(q, usage.all(now)),
            now=now,
        )
        for ticket, granted in got.grants.items():
            waiter = queue.pop(ticket)
            free.remove(granted[0])
            slice_of[ticket] = granted[0]
            holding[ticket] = Holding(
                KIND, 1, tenant=waiter.tenant, preemptible=True, started=now, holder=ticket
            )
            ends[ticket] = now + left[ticket]
            heapq.heappush(running, _Job(ends[ticket], ticket, waiter.tenant))
            if ticket not in started:
                started.add(ticket)
                waits[waiter.tenant].append(now - first[ticket])
        for holder in got.preempt:
            job = holding[holder]
            gone = now + grace_s
            if gone < ends[holder]:
                left[holder] = ends[holder] - gone
                holding[holder] = Holding(
                    KIND,
                    1,
                    tenant=job.tenant,
                    preemptible=True,
                    started=job.started,
                    holder=holder,
                    ends_at=gone,
                )
                running = [j for j in running if j.holder != holder]
                heapq.heapify(running)
                heapq.heappush(running, _Job(gone, holder, job.tenant))
                ends[holder] = gone
                preempted.add(holder)
                evicted[job.tenant] += 1
        times = [j.ends for j in running[:1]] + [p[0] for p in pending[:1] if not backlog]
        now = min([*times, horizon_s]) if times else horizon_s
    for job in holding.values():
        used[job.tenant] += max(0.0, min(now, horizon_s) - last)
    return used, waits, evicted


def test_weights_one_and_two_split_slice_seconds_one_to_two() -> None:
    """Two tenants beyond their (zero) quotas, weights 1 and 2, each with more 1-slice
    jobs than the cluster can run, of random lengths: their slice-seconds end within 5%
    of a 1:2 split."""
    rng = random.Random(7)
    q = quotas(light=TenantQuota(weight=1.0), heavy=TenantQuota(weight=2.0))
    demand = {t: [rng.uniform(20, 120) for _ in range(2_000)] for t in ("light", "heavy")}
    used, _, _ = replay(q, demand, slices=6, horizon_s=20_000.0, backlog=8)
    total = used["light"] + used["heavy"]
    assert total == pytest.approx(6 * 20_000.0, rel=0.01)  # never idle while both wait
    assert used["light"] / total == pytest.approx(1 / 3, rel=0.05)
    assert used["heavy"] / total == pytest.approx(2 / 3, rel=0.05)


def test_equal_weights_split_evenly_and_the_split_follows_a_weight_change() -> None:
    rng = random.Random(3)
    demand = {t: [rng.uniform(20, 120) for _ in range(1_500)] for t in ("a", "b")}
    even, _, _ = replay(
        quotas(a=TenantQuota(), b=TenantQuota()), demand, slices=4, horizon_s=15_000.0, backlog=8
    )
    assert even["a"] / (even["a"] + even["b"]) == pytest.approx(0.5, rel=0.05)
    tilted, _, _ = replay(
        quotas(a=TenantQuota(weight=3.0), b=TenantQuota()),
        demand,
        slices=4,
        horizon_s=15_000.0,
        backlog=8,
    )
    assert tilted["a"] / (tilted["a"] + tilted["b"]) == pytest.approx(0.75, rel=0.05)


def test_usage_decays_by_half_each_half_life() -> None:
    usage = Usage(half_life_s=100.0)
    usage.add("a", 800.0, now=0.0)
    assert usage.of("a", 0.0) == pytest.approx(800.0)
    assert usage.of("a", 100.0) == pytest.approx(400.0)
    assert usage.of("a", 300.0) == pytest.approx(100.0)
    usage.add("a", 100.0, now=300.0)
    assert usage.of("a", 400.0) == pytest.approx(100.0)
    stored = Usage.from_dict(usage.all(400.0), at=400.0, half_life_s=100.0)
    assert stored.of("a", 500.0) == pytest.approx(50.0)
    assert usage.of("never", 500.0) == 0.0


def test_a_tenant_busy_long_ago_is_not_held_back_now() -> None:
    """With decay, yesterday's heavy use weighs little: the tenant that used 10 h of slice
    time two days ago goes before one that used 1 h an hour ago."""
    usage = Usage(half_life_s=3600.0)
    usage.add("old", 36_000.0, now=0.0)
    usage.add("recent", 3_600.0, now=46 * 3600.0)
    now = 47 * 3600.0
    assert usage.of("old", now) < usage.of("recent", now)
    q = quotas(old=TenantQuota(), recent=TenantQuota())
    queue = [ask("r", "recent", arrival=1), ask("o", "old", arrival=2)]
    got = decide(queue, idle("s1"), sharing=Sharing(q, usage.all(now)))
    assert got.grants == {"o": ("s1",)}


def test_a_tenant_with_no_quota_is_not_starved_when_the_cluster_is_not_always_full() -> None:
    """Two teams with quotas covering the cluster submit bursts that fill it, with quiet
    spells between; a tenant with no quota submits a preemptible job every 50 s
    throughout. The teams take their quotas back from it at each burst, and still every
    one of its jobs runs, none waiting for its first slice longer than a burst lasts."""
    rng = random.Random(11)
    q = quotas(a=TenantQuota({"v6e-16": 2}), b=TenantQuota({"v6e-16": 2}))
    bursts = [i * 1_000.0 + 990.0 for i in range(10)]  # each: 8 jobs of 100 s per team
    arrivals = {t: [at for at in bursts for _ in range(8)] for t in ("a", "b")}
    arrivals["c"] = [i * 50.0 for i in range(200)]
    demand = {t: [100.0] * len(arrivals[t]) for t in ("a", "b")}
    demand["c"] = [rng.uniform(20, 120) for _ in arrivals["c"]]
    _, waits, evicted = replay(q, demand, slices=4, horizon_s=20_000.0, arrivals=arrivals)
    assert len(waits["c"]) == 200
    assert max(waits["c"]) <= 450.0  # a burst: 16 jobs of 100 s on 4 slices, and a grace
    assert evicted["c"] > 0 and evicted["a"] == evicted["b"] == 0
    assert len(waits["a"]) == len(waits["b"]) == 80
    assert max(waits["a"] + waits["b"]) <= 400.0
