"""Tenants on the queue service (what the queue actor runs), on an in-memory cluster:
holder records become the holdings the policy weighs, a preemption becomes a notice on
the work's hosts, the work that leaves frees its slice for the request, and work that
outstays its grace is taken back. Pure."""

from __future__ import annotations

from tpuslice._reserve.queue.book import Granted, Waiting
from tpuslice._reserve.queue.service import Orders, QueueService, SliceKind, Ticket
from tpuslice._reserve.queue.share import UsageMeter
from tpuslice._reserve.request import SliceRequest
from tpuslice._view.cluster import SliceState
from tpuslice._view.holders import QUEUE_SOURCE, Holder
from tpuslice._view.quotas import Quotas, TenantQuota
from tpuslice.testing.memory import InMemoryCluster, MemoryGroup

KIND = SliceKind(SliceRequest(topology="4x4", accelerator_version="v6e").plan.shape, 1)


def ask(name: str, tenant: str, *, priority: int = 0, preemptible: bool = False) -> Ticket:
    return Ticket(
        name, KIND, (1, 1), priority, f"pid {name}", "", tenant=tenant, preemptible=preemptible
    )


class World:
    """A service over an in-memory cluster, with holder records and quotas kept here, and
    a decision's orders carried out on the cluster as the queue actor would."""

    def __init__(self, quotas: Quotas) -> None:
        self.cluster = InMemoryCluster([("v6e", "4x4", 2)])
        self.holders: dict[str, Holder] = {}
        self.groups: dict[str, MemoryGroup] = {}
        self.quotas = quotas
        self.done: list[Orders] = []
        stamps = iter(range(10**9, 10**10, 10**9))
        self.service = QueueService(
            self.cluster.snapshot,
            holders=lambda: dict(self.holders),
            quotas=lambda: self.quotas,
            act=self.carry_out,
            meter=UsageMeter(),
            clock=self.cluster.clock.now,
            stamp=lambda: next(stamps),
            wall=self.cluster.clock.now,
            decide_every_s=0.0,
        )

    def hold(self, slice_name: str, holder: str, tenant: str, **kw: object) -> None:
        hosts = self.cluster.slice_hosts[slice_name]
        self.groups[holder] = self.cluster.take(slice_name, 0, {"TPU": 4})
        for worker in range(1, len(hosts)):
            self.cluster.take(slice_name, worker, {"TPU": 4})
        self.holders[slice_name] = Holder(
            holder,
            slice_name,
            tenant,
            int(kw.get("priority", 0)),  # type: ignore[call-overload]
            bool(kw.get("preemptible", True)),
            since=self.cluster.clock.now(),
            who=f"job {holder}",
        )

    def leave(self, slice_name: str) -> None:
        """The holder's hand-back: its groups go, its record and the queue's notices too."""
        for group in [g for g in self.cluster.live_groups() if slice_name in str(g.nodes)]:
            self.cluster.remove_group(group)
        for node in self.cluster.slice_hosts[slice_name]:
            self.cluster.notices.pop(node, None)
        self.holders.pop(slice_name, None)

    def carry_out(self, orders: Orders) -> None:
        self.done.append(orders)
        for notice in orders.notices:
            self.cluster.notices[notice.node_id] = notice
        for record in orders.take_back:
            self.leave(record.slice_name)
        for node in orders.clear:
            self.cluster.notices.pop(node, None)

    def at(self, t: float) -> None:
        self.cluster.clock.t = t


def test_a_tenant_takes_back_its_quota_and_the_borrower_gets_the_notice_gce_would_give() -> None:
    quotas = Quotas({"team-a": TenantQuota({"v6e-16": 1}, grace_s=30), "team-b": TenantQuota()})
    world = World(quotas)
    names = sorted(world.cluster.slice_hosts)
    world.hold(names[0], "b-early", "team-b")
    world.at(10.0)
    world.hold(names[1], "b-late", "team-b")
    world.at(20.0)
    world.service.enqueue(ask("a1", "team-a"))
    answer = world.service.wait("a1")
    assert isinstance(answer, Waiting)
    assert "preempting job b-late of tenant team-b: grace ends in 30 s" in answer.reason
    notices = [n for o in world.done for n in o.notices]
    assert {n.node_id for n in notices} == set(world.cluster.slice_hosts[names[1]])
    assert {(n.kind, n.source, n.deadline) for n in notices} == {("preemption", QUEUE_SOURCE, 50.0)}
    assert "team-a takes back its quota" in notices[0].event
    (preemption, records), *_ = [p for o in world.done for p in o.preempted]
    assert preemption.cause == "quota" and [r.holder for r in records] == ["b-late"]
    # The warned slice shows under notice, and the next decisions warn no one else.
    snapshot = world.cluster.snapshot(1)
    assert snapshot.slices[names[1]].state is SliceState.NOTICE
    world.at(25.0)
    world.done.clear()
    assert isinstance(world.service.wait("a1"), Waiting)
    assert not any(o.notices for o in world.done)
    # The borrower leaves within its grace: the slice goes to team-a at once.
    world.leave(names[1])
    world.at(26.0)
    assert world.service.wait("a1") == Granted((names[1],))


def test_work_that_outstays_its_grace_is_taken_back() -> None:
    # The grace is the preempted tenant's own.
    quotas = Quotas({"team-a": TenantQuota({"v6e-16": 2}), "team-b": TenantQuota(grace_s=5)})
    world = World(quotas)
    names = sorted(world.cluster.slice_hosts)
    world.hold(names[0], "b1", "team-b")
    world.hold(names[1], "b2", "team-b", preemptible=False)
    world.service.enqueue(ask("a1", "team-a"))
    world.service.wait("a1")
    assert [p.holder for o in world.done for p, _ in o.preempted] == ["b1"]
    world.at(4.0)
    world.service.wait("a1")
    assert not any(o.take_back for o in world.done)
    world.at(6.0)
    world.service.wait("a1")  # grace over: b1's groups go, its notices with them
    assert [h.holder for o in world.done for h in o.take_back] == ["b1"]
    world.at(7.0)
    assert world.service.wait("a1") == Granted((names[0],))
    assert names[1] in world.holders  # the work that cannot be preempted stays


def test_without_quotas_a_higher_priority_preempts_only_preemptible_lower_work() -> None:
    world = World(Quotas())
    names = sorted(world.cluster.slice_hosts)
    world.hold(names[0], "batch", "someone", priority=0)
    world.hold(names[1], "fixed", "someone", priority=0, preemptible=False)
    world.service.enqueue(ask("equal", "other", priority=0))
    world.service.wait("equal")
    assert not any(o.preempted for o in world.done)
    world.service.leave("equal")
    world.service.enqueue(ask("urgent", "other", priority=5))
    world.service.wait("urgent")
    [(preemption, _)] = [p for o in world.done for p in o.preempted]
    assert preemption.holder == "batch" and preemption.cause == "priority"


def test_busy_slices_no_one_recorded_are_held_by_no_one_and_never_preempted() -> None:
    world = World(Quotas({"team-a": TenantQuota({"v6e-16": 2})}))
    for name in world.cluster.slice_hosts:
        world.cluster.take(name, 0, {"TPU": 4})
    world.service.enqueue(ask("a1", "team-a", priority=9))
    assert isinstance(world.service.wait("a1"), Waiting)
    assert not any(o.preempted for o in world.done)


def test_use_is_counted_per_tenant_from_the_holder_records() -> None:
    world = World(Quotas({"team-a": TenantQuota(), "team-b": TenantQuota()}))
    names = sorted(world.cluster.slice_hosts)
    world.hold(names[0], "a", "team-a")
    world.hold(names[1], "b", "team-b")
    world.service.enqueue(ask("x", "team-a"))
    world.service.wait("x")
    world.at(100.0)
    world.service.wait("x")
    world.leave(names[1])
    world.at(300.0)
    world.service.wait("x")
    usage = world.service.meter.of_all(300.0)
    assert usage["team-a"] > usage["team-b"] > 0


def test_a_place_given_an_arrival_enqueues_with_it_and_keeps_it() -> None:
    """A resilient run's retry enqueues with the run's first arrival, ahead of later ones."""
    from tpuslice._reserve.queue.place import QueuePlace

    world = World(Quotas())
    names = sorted(world.cluster.slice_hosts)
    world.hold(names[0], "x", "t", preemptible=False)
    world.hold(names[1], "y", "t", preemptible=False)
    world.service.enqueue(ask("later", "t"))  # arrival 1 s on the stamps' clock
    place = QueuePlace(world.service, KIND, (1, 1), 0, arrival=5)
    place.join(0.0)
    assert place.arrival == 5
    world.leave(names[0])
    world.at(1.0)
    assert place.wait(0.0) == Granted((names[0],))
