"""The claiming loop (``tpuslice._reserve.claim.Reserver``) against an in-memory cluster.
Pure: no Ray.

Every step is reached here: claiming idle whole slices only, in one placement round (each
slice's head resource in bundle 0 of its block), a slice breaking while the rest are
claimed, a host or head taken between the look and the claim, autoscaler demand adopted,
deadlines, pinned slices, and Ctrl-C at each step leaving nothing behind.
"""

from __future__ import annotations

from typing import Any

import pytest

from tpuslice._reserve import claim
from tpuslice._reserve.request import SliceRequest
from tpuslice._tpu.clock import Clock
from tpuslice._tpu.labels import SLICE_NAME_LABEL
from tpuslice.errors import InsufficientSlicesError, ReservationTimeoutError
from tpuslice.testing.memory import InMemoryCluster, MemoryGroup

V6E = {"topology": "4x4", "accelerator_version": "v6e"}
HEAD = "TPU-v6e-16-head"


def reserver(cluster: InMemoryCluster, **request: Any) -> claim.Reserver:
    clock = Clock(cluster.clock.now, cluster.clock.sleep, cluster.clock.stamp)
    return claim.Reserver(SliceRequest(**{**V6E, **request}), clock=clock, ops=cluster)


def names(reservation: claim.Reservation) -> list[str]:
    return [c.slice_name for c in reservation.claims]


def worker_nodes(cluster: InMemoryCluster, reservation: claim.Reservation) -> list[str]:
    assert reservation.combined_pg is not None
    group = reservation.combined_pg
    return [cluster.bundle_node(group, i) or "" for i in range(len(group.bundle_specs))]


def record_asks(cluster: InMemoryCluster) -> list[list[str]]:
    """The hosts of each owner ask the cluster gets from now on, in order."""
    asked: list[list[str]] = []
    probe = cluster.start_owner_probe

    def start(node_ids: Any) -> Any:
        asked.append(list(node_ids))
        return probe(node_ids)

    cluster.start_owner_probe = start  # type: ignore[method-assign]
    return asked


def heads_at(group: MemoryGroup) -> list[int]:
    """The bundles of a group that ask for the slice's head resource."""
    return [i for i, bundle in enumerate(group.bundles) if HEAD in bundle]


class Placements:
    """Every host a group of ours was ever placed on. Removing a group forgets where it
    sat, so the hosts of each group of ours are noted as it is removed; the live ones
    are read when asked."""

    def __init__(self, cluster: InMemoryCluster, monkeypatch: pytest.MonkeyPatch) -> None:
        self.cluster = cluster
        self.removed: set[str] = set()
        remove = cluster.remove_group

        def noting(group: Any) -> None:
            if isinstance(group, MemoryGroup) and group.owner == "reserver":
                self.removed.update(group.nodes or [])
            remove(group)

        monkeypatch.setattr(cluster, "remove_group", noting)

    def hosts(self) -> set[str]:
        live = {n for g in self.cluster.live_groups("reserver") for n in g.nodes or []}
        return self.removed | live

    def on(self, slice_name: str) -> set[str]:
        return {n for n in self.hosts() if n.startswith(f"{slice_name}/")}


def others_hosts(cluster: InMemoryCluster) -> set[str]:
    """The hosts where another user holds something now."""
    return {n for g in cluster.live_groups("other") for n in g.nodes or []}


def test_an_idle_slice_is_claimed_with_bundle_i_on_worker_i() -> None:
    cluster = InMemoryCluster([("v6e", "4x4", 2)])
    reservation = reserver(cluster).run()
    assert names(reservation) == ["v6e-16-0"]
    assert worker_nodes(cluster, reservation) == [f"v6e-16-0/{w}" for w in range(4)]
    assert cluster.live_groups("reserver") == [reservation.combined_pg]  # heads and workers
    assert reservation.claims[0].head_pg is None  # the head is in the workers' bundle 0
    assert cluster.clock.t == 0  # nothing waited


def test_a_slice_with_one_busy_host_is_never_picked() -> None:
    cluster = InMemoryCluster([("v6e", "4x4", 2)])
    cluster.take("v6e-16-0", 3, {"TPU": 1})  # not worker 0: its head resource is free
    assert names(reserver(cluster).run()) == ["v6e-16-1"]
    assert cluster.calls["create_group"] == 1  # the one group, on the idle slice: no retries
    assert cluster.calls["wait_placed"] == 1


def test_n_slices_are_claimed_in_one_look_and_placed_together() -> None:
    cluster = InMemoryCluster([("v6e", "4x4", 3)])
    reservation = reserver(cluster, num_slices=3).run()
    assert names(reservation) == ["v6e-16-0", "v6e-16-1", "v6e-16-2"]
    assert cluster.calls["snapshot"] == 0  # the grant carries the queue's look
    assert cluster.calls["create_group"] == 1  # one group of 12 bundles, heads included
    assert cluster.calls["wait_placed"] == 1
    assert worker_nodes(cluster, reservation)[4:8] == [f"v6e-16-1/{w}" for w in range(4)]


@pytest.mark.parametrize("pg_per_slice", [False, True])
def test_the_hosts_are_asked_for_their_owners_while_the_groups_place(pg_per_slice: bool) -> None:
    """Asked once the groups exist, not before: a fresh driver's lookups of the hosts'
    agents overlap Ray's placement. Every picked host is asked once, and a host found
    owned is not used."""
    cluster = InMemoryCluster([("v6e", "4x4", 3)])
    cluster.tpu_owners["v6e-16-0/2"] = "pid 77 (python train.py)"
    seen: list[tuple[int, int]] = []
    cluster.script(
        "start_owner_probe",
        1,
        lambda: seen.append((cluster.calls["create_group"], cluster.calls["wait_placed"])),
    )
    reservation = reserver(cluster, num_slices=2, pg_per_slice=pg_per_slice).run()
    groups = 2 if pg_per_slice else 1
    assert seen == [(groups, 0)]  # after every group was created, before any wait
    assert sorted(names(reservation)) == ["v6e-16-1", "v6e-16-2"]


def test_hosts_their_agents_saw_free_are_not_asked() -> None:
    """A fresh driver's probe is what a one-shot waits on beyond the floor: hosts whose
    agents vouch for a free TPU (their ``tpu-free/`` keys) are not asked; the others are,
    and a host found owned among them is still not used."""
    cluster = InMemoryCluster([("v6e", "4x4", 3)])
    cluster.seen_free.update(cluster.slice_hosts["v6e-16-0"])
    cluster.tpu_owners["v6e-16-1/2"] = "pid 77 (python train.py)"
    asked = record_asks(cluster)
    reservation = reserver(cluster, num_slices=2).run()
    assert sorted(names(reservation)) == ["v6e-16-0", "v6e-16-2"]
    # The first round asked only the hosts nobody vouched for; the retry only the new pick.
    assert asked[0] == cluster.slice_hosts["v6e-16-1"]
    assert asked[1:] == [cluster.slice_hosts["v6e-16-2"]]


def test_a_slice_picked_rounds_ago_is_judged_by_the_latest_read() -> None:
    """Without the queue, a reservation of two slices holds its first pick while it
    waits for a second. A process that takes a TPU of the first meanwhile withdraws
    that host's free key: the host is asked once the groups are made, found owned, and
    its slice given back, rather than spared on the strength of the read it was picked
    on."""
    cluster = InMemoryCluster([("v6e", "4x4", 3)])
    cluster.seen_free.update(n for hosts in cluster.slice_hosts.values() for n in hosts)
    second = [cluster.take("v6e-16-1", w, {"TPU": 4}) for w in range(4)]
    third = [cluster.take("v6e-16-2", w, {"TPU": 4}) for w in range(4)]
    cluster.script("sleep", 1, lambda: cluster.own_tpu("v6e-16-0", 1, "pid 9 (python nb.py)"))
    cluster.script("sleep", 2, lambda: [cluster.remove_group(g) for g in second])
    cluster.script("sleep", 3, lambda: [cluster.remove_group(g) for g in third])
    asked = record_asks(cluster)
    reservation = reserver(cluster, num_slices=2, head_reservation_timeout_s=60).run()
    assert sorted(names(reservation)) == ["v6e-16-1", "v6e-16-2"]
    assert asked == [["v6e-16-0/1"]]


def test_after_an_old_read_the_free_keys_are_listed_again_before_any_host_is_spared() -> None:
    """Every host was vouched free at the read, but the groups are made long after it,
    and meanwhile a process took one host's TPU (its agent withdrew the key). The keys
    are listed again (one call): only that host is asked, found owned, and its slice
    given back for the other."""
    cluster = InMemoryCluster([("v6e", "4x4", 2)])
    cluster.seen_free.update(n for hosts in cluster.slice_hosts.values() for n in hosts)

    def late_and_taken() -> None:
        cluster.clock.sleep(claim.FREE_KEY_TRUST_S + 1)
        cluster.own_tpu("v6e-16-0", 2, "pid 5 (python nb.py)")

    cluster.script("create_group", 1, late_and_taken)
    asked = record_asks(cluster)
    reservation = reserver(cluster, num_slices=1).run()
    assert names(reservation) == ["v6e-16-1"]
    assert asked == [["v6e-16-0/2"]]
    assert cluster.calls["free_hosts"] == 2  # once for each grant


def test_no_host_is_asked_when_every_agent_saw_its_tpu_free() -> None:
    cluster = InMemoryCluster([("v6e", "4x4", 2)])
    cluster.seen_free.update(n for hosts in cluster.slice_hosts.values() for n in hosts)
    reservation = reserver(cluster, num_slices=2).run()
    assert len(reservation.claims) == 2
    assert cluster.calls["start_owner_probe"] == 0


# --- one placement round ------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 3])
def test_a_reservation_is_one_group_waited_for_once_when_nothing_races(count: int) -> None:
    """Heads and workers of every slice are asked for in one group and waited for once:
    no head group of its own for any slice."""
    cluster = InMemoryCluster([("v6e", "4x4", 3)])
    reservation = reserver(cluster, num_slices=count).run()
    assert len(reservation.claims) == count
    assert cluster.calls["create_group"] == 1
    assert cluster.calls["wait_placed"] == 1
    assert all(c.head_pg is None for c in reservation.claims)
    assert cluster.live_groups("reserver") == [reservation.combined_pg]


def test_bundle_0_of_each_slice_holds_its_head_and_no_other_bundle_does() -> None:
    """Two bundles per host, two slices: only bundle 0 of each slice's block (worker 0's
    first) asks for the head, on top of its TPUs; worker 0's second bundle does not.
    Placed, each slice's head is held by that bundle on its worker 0."""
    cluster = InMemoryCluster([("v6e", "4x4", 2)])
    reservation = reserver(cluster, num_slices=2, resources_per_bundle={"TPU": 2}).run()
    [group] = cluster.live_groups("reserver")
    assert group is reservation.combined_pg and len(group.bundles) == 16
    assert heads_at(group) == [0, 8]
    plain = dict(group.bundles[1])
    assert group.bundles[0] == group.bundles[8] == {**plain, HEAD: 1.0}
    nodes = worker_nodes(cluster, reservation)
    assert nodes[:2] == ["v6e-16-0/0"] * 2 and nodes[8:10] == ["v6e-16-1/0"] * 2
    for name in names(reservation):
        assert cluster.nodes[f"{name}/0"].free(HEAD) == 0


def test_pg_per_slice_makes_one_group_per_slice_with_its_head_in_bundle_0() -> None:
    """One group per slice, all made in one round and waited for once; each asks for its
    slice's head in bundle 0 only, placed on that slice's worker 0."""
    cluster = InMemoryCluster([("v6e", "4x4", 3)])
    reservation = reserver(cluster, num_slices=3, pg_per_slice=True).run()
    groups = cluster.live_groups("reserver")
    assert reservation.combined_pg is None
    assert groups == [c.worker_pg for c in reservation.claims]
    assert cluster.calls["create_group"] == 3 and cluster.calls["wait_placed"] == 1
    for c, group in zip(reservation.claims, groups, strict=True):
        assert c.head_pg is None
        assert heads_at(group) == [0]
        assert [cluster.bundle_node(group, i) for i in range(4)] == [
            f"{c.slice_name}/{w}" for w in range(4)
        ]
        assert cluster.nodes[f"{c.slice_name}/0"].free(HEAD) == 0


def test_a_slice_breaking_while_the_rest_are_claimed_is_given_back() -> None:
    """Two slices wanted, one idle: it is picked while waiting for the other; then a host
    of it dies. The broken pick is given back, and the request ends on two whole slices
    (one added meanwhile, as an autoscaler would)."""
    cluster = InMemoryCluster([("v6e", "4x4", 2)], can_grow=True)
    other = cluster.take("v6e-16-1", 2, {"TPU": 4})
    cluster.script("sleep", 1, lambda: cluster.kill_host("v6e-16-0", 1))

    def later() -> None:
        cluster.remove_group(other)
        cluster.add_slice("v6e", "4x4", "v6e-16-new")

    cluster.script("sleep", 2, later)
    reservation = reserver(cluster, num_slices=2).run()
    assert sorted(names(reservation)) == ["v6e-16-1", "v6e-16-new"]
    on_broken = [
        g
        for g in cluster.live_groups("reserver")
        if any(n.startswith("v6e-16-0/") for n in g.nodes or [])
    ]
    assert on_broken == []


def test_a_head_taken_between_grant_and_claim_moves_to_another_slice() -> None:
    """Worker 0's head of the picked slice is taken after the grant: our group (which asks
    for it in bundle 0) does not place within the claim bound, is removed, and the next
    round ends on the other slice."""
    cluster = InMemoryCluster([("v6e", "4x4", 2)])
    cluster.script("create_group", 1, lambda: cluster.take("v6e-16-0", 0, {HEAD: 1}))
    reservation = reserver(cluster).run()
    assert names(reservation) == ["v6e-16-1"]
    assert cluster.clock.t == pytest.approx(claim.CLAIM_BOUND_S)  # one bounded wait
    assert cluster.live_groups("reserver") == [reservation.combined_pg]
    assert worker_nodes(cluster, reservation) == [f"v6e-16-1/{w}" for w in range(4)]


def test_a_host_taken_between_grant_and_claim_gives_that_slice_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Host 2 of the picked slice is taken after the grant: our group (head included) is
    placed whole or not at all, so nothing of ours lands on the slice, not even worker
    0's head; within the claim bound the slice is given back and another is placed."""
    cluster = InMemoryCluster([("v6e", "4x4", 2)])
    placements = Placements(cluster, monkeypatch)
    cluster.script("create_group", 1, lambda: cluster.take("v6e-16-0", 2, {"TPU": 1}))
    reservation = reserver(cluster).run()
    assert names(reservation) == ["v6e-16-1"]
    assert cluster.clock.t == pytest.approx(claim.CLAIM_BOUND_S)
    assert placements.on("v6e-16-0") == set()
    assert cluster.nodes["v6e-16-0/0"].free(HEAD) == 1  # no head claim of ours left there
    assert cluster.live_groups("reserver") == [reservation.combined_pg]


def test_pg_per_slice_keeps_the_slice_that_placed_and_replaces_the_other(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One group per slice; the second slice's host is taken after the grant. The first
    slice stays claimed (as slice 0), the second is given back with nothing of ours left
    on it, and a third replaces it; each slice ends with exactly its own group."""
    cluster = InMemoryCluster([("v6e", "4x4", 3)])
    placements = Placements(cluster, monkeypatch)
    cluster.script("create_group", 1, lambda: cluster.take("v6e-16-1", 3, {"TPU": 1}))
    reservation = reserver(cluster, num_slices=2, pg_per_slice=True).run()
    assert names(reservation) == ["v6e-16-0", "v6e-16-2"]
    groups = [c.worker_pg for c in reservation.claims]
    assert cluster.live_groups("reserver") == groups
    for c in reservation.claims:
        assert c.worker_pg is not None
        assert {cluster.bundle_node(c.worker_pg, i) for i in range(4)} == {
            f"{c.slice_name}/{w}" for w in range(4)
        }
    assert placements.on("v6e-16-1") == set()


def test_without_an_autoscaler_a_request_too_big_fails_at_once() -> None:
    cluster = InMemoryCluster([("v6e", "4x4", 1)])
    with pytest.raises(InsufficientSlicesError, match="asked for 2, the cluster has 1 whole"):
        reserver(cluster, num_slices=2).run()
    assert cluster.clock.t == 0
    assert cluster.live_groups("reserver") == []


def test_a_timeout_while_slices_are_busy_says_what_the_cluster_has() -> None:
    cluster = InMemoryCluster([("v6e", "4x4", 2)])
    cluster.take("v6e-16-0", 1, {"TPU": 4})
    cluster.take("v6e-16-1", 0, {"TPU": 4})
    with pytest.raises(ReservationTimeoutError) as info:
        reserver(cluster, head_reservation_timeout_s=3.0).run()
    text = str(info.value)
    assert "2 whole slice(s), 2 busy (v6e-16-0: 1/4 hosts in use; v6e-16-1: 1/4" in text
    assert "first in the cluster's queue" in text
    assert 3.0 <= cluster.clock.t <= 3.0 + claim.POLL_S[1]
    assert cluster.live_groups("reserver") == []


def test_a_deadline_reached_while_placing_workers_ends_in_a_timeout_not_a_hang() -> None:
    """The slice is idle but its group can never place (a bundle no host holds): the
    loop honours the timeout, gives everything back, and says why (the bundles, not
    busy slices)."""
    cluster = InMemoryCluster([("v6e", "4x4", 1)])
    request = {"resources_per_bundle": {"TPU": 4, "CPU": 500}, "head_reservation_timeout_s": 10.0}
    with pytest.raises(ReservationTimeoutError, match="did not place") as info:
        reserver(cluster, **request).run()
    assert "check resources_per_bundle" in str(info.value)
    assert 10.0 <= cluster.clock.t <= 10.0 + 2 * claim.CLAIM_BOUND_S
    assert cluster.live_groups("reserver") == []


def test_a_pinned_slice_is_waited_for_even_when_another_is_idle() -> None:
    cluster = InMemoryCluster([("v6e", "4x4", 2)])
    other = cluster.take("v6e-16-1", 0, {"TPU": 4})
    cluster.script("sleep", 3, lambda: cluster.remove_group(other))
    pinned = [{SLICE_NAME_LABEL: "v6e-16-1"}] * 4
    reservation = reserver(cluster, bundle_label_selector=pinned).run()
    assert names(reservation) == ["v6e-16-1"]
    assert cluster.clock.t > 0


def test_a_pinned_slice_that_does_not_exist_fails_at_once() -> None:
    cluster = InMemoryCluster([("v6e", "4x4", 1)])
    pinned = [{SLICE_NAME_LABEL: "nope"}] * 4
    with pytest.raises(InsufficientSlicesError, match="nope named in bundle_label_selector"):
        reserver(cluster, bundle_label_selector=pinned).run()


# --- Ctrl-C at every step ------------------------------------------------------------------


def busy_then_grown(cluster: InMemoryCluster) -> None:
    """The scenario interrupted below: two slices wanted, one idle and one busy; demand
    for the autoscaler is kept pending, and after two pauses a new slice lands on it."""
    cluster.take("v6e-16-1", 1, {"TPU": 4})
    cluster.script("sleep", 2, lambda: cluster.add_slice("v6e", "4x4", "v6e-16-grown"))


def fresh() -> tuple[InMemoryCluster, claim.Reserver]:
    cluster = InMemoryCluster([("v6e", "4x4", 2)], can_grow=True)
    busy_then_grown(cluster)
    return cluster, reserver(cluster, num_slices=2)


def steps() -> list[tuple[str, int]]:
    """Every (operation, n-th call) a full run of the scenario makes, but removals (a
    Ctrl-C during clean-up is a second interrupt)."""
    cluster, run = fresh()
    run.run()
    return [
        (op, n)
        for op, count in cluster.calls.items()
        if op != "remove_group"
        for n in range(1, count + 1)
    ]


def test_the_interrupted_scenario_reaches_every_kind_of_step() -> None:
    kinds = {op for op, _ in steps()}
    assert {"snapshot", "create_group", "wait_placed", "sleep", "bundle_node"} <= kinds


@pytest.mark.parametrize(("operation", "call"), steps())
def test_ctrl_c_at_any_step_leaves_nothing_behind(operation: str, call: int) -> None:
    cluster, run = fresh()

    def interrupt() -> None:
        raise KeyboardInterrupt

    cluster.script(operation, call, interrupt)
    with pytest.raises(KeyboardInterrupt):
        run.run()
    assert cluster.live_groups("reserver") == []
    assert run.claims == {}


def test_an_error_while_waiting_propagates_and_leaves_nothing_behind() -> None:
    cluster = InMemoryCluster([("v6e", "4x4", 1)])

    def boom() -> None:
        raise RuntimeError("GCS went away")

    cluster.script("wait_placed", 1, boom)  # while the group is in flight
    with pytest.raises(RuntimeError, match="GCS went away"):
        reserver(cluster).run()
    made = [g for g in cluster.groups if g.owner == "reserver"]
    assert len(made) == 1 and made[0].removed
    assert cluster.live_groups("reserver") == []


def test_a_head_taken_meanwhile_never_gets_workers_on_its_slice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Between the look and the claim another reservation takes worker 0's head of the
    picked slice (it won the race) and starts on each host, leaving room for our bundles.
    No bundle of ours ever sits on a host the winner holds (our group asks for the head
    in bundle 0, so it places nowhere), the winner keeps all it took, and the
    reservation ends on the other slice with nothing of ours left on the first."""
    cluster = InMemoryCluster([("v6e", "4x4", 2)])
    placements = Placements(cluster, monkeypatch)

    def winner() -> None:
        cluster.take("v6e-16-0", 0, {HEAD: 1})
        for w in range(4):  # a CPU on each host: our bundles would still fit beside it
            cluster.take("v6e-16-0", w, {"CPU": 1})

    cluster.script("create_group", 1, winner)
    reservation = reserver(cluster).run()
    assert names(reservation) == ["v6e-16-1"]
    assert placements.hosts() & others_hosts(cluster) == set()
    assert placements.on("v6e-16-0") == set()
    assert all(g.nodes for g in cluster.live_groups("other"))  # the winner keeps its hold
    assert cluster.live_groups("reserver") == [reservation.combined_pg]


# --- reservations of one process ---------------------------------------------------------


def test_two_reservations_of_one_process_pick_different_slices_without_waiting() -> None:
    """A second reservation looks while the first has picked a slice but not yet asked
    Ray for it: it takes the other slice at once, and the first's group places where it
    was picked (neither waits out a group that cannot place)."""
    cluster = InMemoryCluster([("v6e", "4x4", 2)])
    second: list[claim.Reservation] = []
    cluster.script("create_group", 1, lambda: second.append(reserver(cluster).run()))
    first = reserver(cluster).run()
    assert names(first) == ["v6e-16-0"]
    assert names(second[0]) == ["v6e-16-1"]
    assert cluster.clock.t == 0
    assert cluster.live_groups("reserver") == [second[0].combined_pg, first.combined_pg]


def test_a_reservation_that_ended_no_longer_hides_its_slices() -> None:
    """Interrupted after picking a slice, a reservation forgets it: the next one of this
    process takes that slice."""
    cluster = InMemoryCluster([("v6e", "4x4", 2)])

    def interrupt() -> None:
        raise KeyboardInterrupt

    cluster.script("create_group", 1, interrupt)
    with pytest.raises(KeyboardInterrupt):
        reserver(cluster).run()
    assert names(reserver(cluster).run()) == ["v6e-16-0"]


# --- TPU owners --------------------------------------------------------------------------

NOTEBOOK = "pid 4242 (python notebook.py)"


def test_a_slice_whose_tpu_another_process_owns_is_given_back_and_another_taken() -> None:
    """Ray's resources say both slices are idle; a process outside Ray holds a TPU of the
    first. Its group places but is removed once the hosts' answer names the owner, the
    second slice is taken, and the first shows busy with the owner named from then on."""
    cluster = InMemoryCluster([("v6e", "4x4", 2)])
    cluster.own_tpu("v6e-16-0", 2, NOTEBOOK)
    reservation = reserver(cluster).run()
    assert names(reservation) == ["v6e-16-1"]
    assert cluster.live_groups("reserver") == [reservation.combined_pg]
    assert worker_nodes(cluster, reservation) == [f"v6e-16-1/{w}" for w in range(4)]
    view = cluster.snapshot(1).slices["v6e-16-0"]
    assert view.state.value == "busy"
    assert view.reason == f"1/4 hosts in use; host 2: TPU held by {NOTEBOOK}"


def test_a_stale_owner_record_does_not_keep_a_slice_busy_forever() -> None:
    """The owner exits after being recorded; the waiting reservation asks again and
    takes the slice."""
    cluster = InMemoryCluster([("v6e", "4x4", 1)])
    cluster.own_tpu("v6e-16-0", 1, NOTEBOOK)
    with pytest.raises(ReservationTimeoutError, match="TPU held by pid 4242"):
        reserver(cluster, head_reservation_timeout_s=1.0).run()
    cluster.own_tpu("v6e-16-0", 1, None)  # the notebook exits; its record stays
    assert cluster.snapshot(1).slices["v6e-16-0"].state.value == "busy"
    reservation = reserver(cluster, head_reservation_timeout_s=30.0).run()
    assert names(reservation) == ["v6e-16-0"]
    assert cluster.clock.t < 1.0 + claim.REPROBE_S + 1.0


def test_a_wait_for_no_groups_answers_at_once_without_asking_ray() -> None:
    """Nothing to wait for (no demand group pending): no call to Ray, which is not even
    connected here and would refuse a wait for nothing."""
    from tpuslice._reserve.groups import wait_all

    assert wait_all([], 30.0) == []
