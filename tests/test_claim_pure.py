"""The claiming loop (``tpuslice.claim.Reserver``) against an in-memory cluster. Pure: no Ray.

Every step is reached here: claiming idle whole slices only, a slice breaking while the rest
are claimed, a host taken between the look and the claim, autoscaler demand adopted,
deadlines, pinned slices, and Ctrl-C at each step leaving nothing behind.
"""

from __future__ import annotations

from typing import Any

import pytest

from tpuslice import claim
from tpuslice.clock import Clock
from tpuslice.errors import InsufficientSlicesError, ReservationTimeoutError
from tpuslice.labels import SLICE_NAME_LABEL
from tpuslice.request import SliceRequest
from tpuslice.testing.memory import InMemoryCluster

V6E = {"topology": "4x4", "accelerator_version": "v6e"}


def reserver(cluster: InMemoryCluster, **request: Any) -> claim.Reserver:
    clock = Clock(cluster.clock.now, cluster.clock.sleep)
    return claim.Reserver(SliceRequest(**{**V6E, **request}), clock=clock, ops=cluster)


def names(reservation: claim.Reservation) -> list[str]:
    return [c.slice_name for c in reservation.claims]


def worker_nodes(cluster: InMemoryCluster, reservation: claim.Reservation) -> list[str]:
    assert reservation.combined_pg is not None
    group = reservation.combined_pg
    return [cluster.bundle_node(group, i) or "" for i in range(len(group.bundle_specs))]


def test_an_idle_slice_is_claimed_with_bundle_i_on_worker_i() -> None:
    cluster = InMemoryCluster([("v6e", "4x4", 2)])
    reservation = reserver(cluster).run()
    assert names(reservation) == ["v6e-16-0"]
    assert worker_nodes(cluster, reservation) == [f"v6e-16-0/{w}" for w in range(4)]
    assert len(cluster.live_groups("reserver")) == 2  # the head claim and the workers
    assert cluster.clock.t == 0  # nothing waited


def test_a_slice_with_one_busy_host_is_never_picked() -> None:
    cluster = InMemoryCluster([("v6e", "4x4", 2)])
    cluster.take("v6e-16-0", 3, {"TPU": 1})  # not worker 0: its head resource is free
    assert names(reserver(cluster).run()) == ["v6e-16-1"]
    assert cluster.calls["create_group"] == 2  # one head claim, one worker group: no retries


def test_n_slices_are_claimed_in_one_look_and_placed_together() -> None:
    cluster = InMemoryCluster([("v6e", "4x4", 3)])
    reservation = reserver(cluster, num_slices=3).run()
    assert names(reservation) == ["v6e-16-0", "v6e-16-1", "v6e-16-2"]
    assert cluster.calls["snapshot"] == 1
    assert cluster.calls["create_group"] == 4  # three heads, then one group of 12 bundles
    assert worker_nodes(cluster, reservation)[4:8] == [f"v6e-16-1/{w}" for w in range(4)]


def test_a_slice_breaking_while_the_rest_are_claimed_is_given_back() -> None:
    """Two slices wanted, one idle: its head is held while waiting; then a host of it dies.
    The broken claim is given back, and the request ends on two whole slices (one added
    meanwhile, as an autoscaler would)."""
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


def test_a_head_taken_between_look_and_claim_moves_to_another_slice() -> None:
    cluster = InMemoryCluster([("v6e", "4x4", 2)])
    cluster.script(
        "snapshot", 1, lambda: cluster.take("v6e-16-0", 0, {"TPU-v6e-16-head": 1}), after=True
    )
    assert names(reserver(cluster).run()) == ["v6e-16-1"]
    assert len(cluster.live_groups("reserver")) == 2


def test_a_host_taken_between_look_and_claim_gives_that_slice_back() -> None:
    """The head claim places, the workers cannot (host 2 taken after the look): within
    the claim bound the slice is given back and another is placed."""
    cluster = InMemoryCluster([("v6e", "4x4", 2)])
    cluster.script("snapshot", 1, lambda: cluster.take("v6e-16-0", 2, {"TPU": 1}), after=True)
    reservation = reserver(cluster).run()
    assert names(reservation) == ["v6e-16-1"]
    assert cluster.clock.t == pytest.approx(claim.CLAIM_BOUND_S)
    assert len(cluster.live_groups("reserver")) == 2  # nothing left on v6e-16-0


def test_pg_per_slice_keeps_the_slice_that_placed_and_replaces_the_other() -> None:
    cluster = InMemoryCluster([("v6e", "4x4", 3)])
    cluster.script("snapshot", 1, lambda: cluster.take("v6e-16-1", 3, {"TPU": 1}), after=True)
    reservation = reserver(cluster, num_slices=2, pg_per_slice=True).run()
    assert sorted(names(reservation)) == ["v6e-16-0", "v6e-16-2"]
    assert all(c.worker_pg is not None for c in reservation.claims)
    assert len(cluster.live_groups("reserver")) == 4


def test_autoscaler_demand_is_adopted_when_the_new_slice_lands() -> None:
    """Nothing idle, the cluster can grow: a pending unpinned head claim is the demand;
    the slice the autoscaler adds is adopted through it, with no second head claim."""
    cluster = InMemoryCluster([("v6e", "4x4", 1)], can_grow=True)
    cluster.take("v6e-16-0", 1, {"TPU": 1})
    cluster.script("sleep", 2, lambda: cluster.add_slice("v6e", "4x4", "v6e-16-grown"))
    reservation = reserver(cluster).run()
    assert names(reservation) == ["v6e-16-grown"]
    head = reservation.claims[0].head_pg
    assert head is not None  # the demand claim, which no slice already there could satisfy
    assert cluster._group(head).selectors[0][SLICE_NAME_LABEL] == "!in(v6e-16-0)"
    assert len(cluster.live_groups("reserver")) == 2  # the adopted head and the workers


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
    assert "holding 0 of 1" in text
    assert 3.0 <= cluster.clock.t <= 3.0 + claim.POLL_S[1]
    assert cluster.live_groups("reserver") == []


def test_a_deadline_reached_while_placing_workers_ends_in_a_timeout_not_a_hang() -> None:
    """The head places but the workers never can (a bundle no host holds): the loop
    honours the timeout, gives everything back, and says why."""
    cluster = InMemoryCluster([("v6e", "4x4", 1)])
    request = {"resources_per_bundle": {"TPU": 4, "CPU": 500}, "head_reservation_timeout_s": 10.0}
    with pytest.raises(ReservationTimeoutError, match="did not place") as info:
        reserver(cluster, **request).run()
    assert "holding 1 of 1" in str(info.value)
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

    cluster.script("wait_placed", 2, boom)  # while the worker group is in flight
    with pytest.raises(RuntimeError, match="GCS went away"):
        reserver(cluster).run()
    assert cluster.calls["create_group"] == 2
    assert cluster.live_groups("reserver") == []


def test_a_head_taken_meanwhile_never_gets_workers_on_its_slice() -> None:
    """Between the look and the claim someone takes worker 0's head resource of the
    picked slice (another reservation won the race): our head claim waits, no worker
    group of ours is ever asked for on that slice (it would sit on the winner's hosts),
    and the next slice is claimed."""
    cluster = InMemoryCluster([("v6e", "4x4", 2)])
    cluster.script("create_group", 1, lambda: cluster.take("v6e-16-0", 0, {"TPU-v6e-16-head": 1}))
    reservation = reserver(cluster).run()
    assert [c.slice_name for c in reservation.claims] == ["v6e-16-1"]
    workers = [g for g in cluster.groups if g.owner == "reserver" and len(g.bundles) > 1]
    assert len(workers) == 1 and workers[0].nodes and "v6e-16-1" in workers[0].nodes[0]
    assert len(cluster.live_groups("reserver")) == 2


# --- TPU owners --------------------------------------------------------------------------

NOTEBOOK = "pid 4242 (python notebook.py)"


def test_a_slice_whose_tpu_another_process_owns_is_given_back_and_another_taken() -> None:
    """Ray's resources say both slices are idle; a process outside Ray holds a TPU of the
    first. Its head claim is given back, the second slice is taken, and the first shows
    busy with the owner named from then on."""
    cluster = InMemoryCluster([("v6e", "4x4", 2)])
    cluster.own_tpu("v6e-16-0", 2, NOTEBOOK)
    assert names(reserver(cluster).run()) == ["v6e-16-1"]
    assert len(cluster.live_groups("reserver")) == 2
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
