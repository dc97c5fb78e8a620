"""Placement avoids suspect hosts, pure: the last-resort rule in the queue's policy, the
claiming loop and the queue on an in-memory cluster, and sub-slices."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from test_claim_pure import names, reserver
from test_subslices_pure import Layouts, workers
from test_subslices_pure import reserve as reserve_subslice
from tpuslice._reserve.queue.schedule import LAST_RESORT_S, Holding, Waiter, decide, last_resort
from tpuslice._reserve.queue.service import SliceKind, Ticket
from tpuslice._reserve.request import SliceRequest
from tpuslice._view.cluster import SliceState
from tpuslice.testing.memory import InMemoryCluster


def one_slice(count: int = 1) -> InMemoryCluster:
    return InMemoryCluster([("v6e", "4x4", count)])


# --- the policy ---------------------------------------------------------------------------

KIND = "v6e-16"


def waiter(ticket: str, low: int = 1, high: int | None = None, **kw: Any) -> Waiter:
    return Waiter(ticket, KIND, (low, high or low), **kw)


def test_the_last_resort_rule() -> None:
    assert last_resort(trusted=0, least=1, time_left_s=None)
    assert last_resort(trusted=1, least=2, time_left_s=None)
    assert not last_resort(trusted=1, least=1, time_left_s=None)
    assert not last_resort(trusted=1, least=1, time_left_s=LAST_RESORT_S + 0.1)
    assert last_resort(trusted=1, least=1, time_left_s=LAST_RESORT_S)


def test_a_suspect_slice_waits_while_a_trusted_one_could_serve() -> None:
    got = decide(
        [waiter("a")], {KIND: []}, [Holding(KIND, 1)], suspects={KIND: ["s"]}, trusted={KIND: 1}
    )
    assert got.grants == {} and "a" not in got.never
    assert got.blocked["a"].endswith("1 idle with a suspect host, kept for a last resort")


def test_a_suspect_slice_is_granted_when_no_trusted_slice_could_serve() -> None:
    alone = decide([waiter("a")], {KIND: []}, suspects={KIND: ["s"]}, trusted={KIND: 0})
    assert alone.grants == {"a": ("s",)}
    short = decide([waiter("big", 2)], {KIND: ["t"]}, suspects={KIND: ["s"]}, trusted={KIND: 1})
    assert short.grants == {"big": ("s", "t")}


def test_trusted_idle_slices_go_first_even_in_a_last_resort() -> None:
    got = decide([waiter("r", 1, 3)], {KIND: ["t"]}, suspects={KIND: ["a", "b"]}, trusted={KIND: 1})
    assert got.grants == {"r": ("t",)}  # one trusted slice serves the range's minimum
    near = decide(
        [waiter("r", 1, 2, deadline=100.0)],
        {KIND: ["t"]},
        suspects={KIND: ["a"]},
        trusted={KIND: 1},
        now=100.0 - LAST_RESORT_S,
    )
    assert near.grants == {"r": ("a", "t")}


def test_a_near_deadline_takes_a_suspect_slice_rather_than_wait() -> None:
    def grants(now: float) -> dict[str, tuple[str, ...]]:
        queue = [waiter("soon", deadline=100.0), waiter("later", arrival=2)]
        return decide(
            queue,
            {KIND: []},
            [Holding(KIND, 1)],
            suspects={KIND: ["s"]},
            trusted={KIND: 1},
            now=now,
        ).grants

    assert grants(now=100.0 - LAST_RESORT_S - 1) == {}
    assert grants(now=100.0 - LAST_RESORT_S) == {"soon": ("s",)}


def test_suspect_slices_count_toward_what_the_cluster_can_ever_hold() -> None:
    got = decide(
        [waiter("a", 2)], {KIND: []}, [Holding(KIND, 1)], suspects={KIND: ["s"]}, trusted={KIND: 0}
    )
    assert got.never == {}


# --- the claiming loop and the queue ------------------------------------------------------


def test_a_reservation_prefers_a_slice_without_a_suspect_host() -> None:
    cluster = one_slice(2)
    cluster.suspect("v6e-16-0", 2)
    reservation = reserver(cluster).run()
    assert names(reservation) == ["v6e-16-1"]
    assert not any(claim.suspect for claim in reservation.claims)


def test_a_suspect_slice_is_taken_when_no_other_exists_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cluster = one_slice()
    cluster.suspect("v6e-16-0", 2)
    with caplog.at_level(logging.INFO, logger="tpuslice._reserve.claim"):
        reservation = reserver(cluster).run()
    assert names(reservation) == ["v6e-16-0"]
    assert reservation.claims[0].suspect
    assert [c.slice_name for c in reservation.claims if c.suspect] == ["v6e-16-0"]
    assert "taking v6e-16-0 as a last resort" in caplog.text
    assert "host 2 suspect (hang), 10 min left" in caplog.text


def test_with_a_trusted_slice_busy_a_suspect_one_is_taken_near_the_deadline() -> None:
    """The trusted slice stays busy: the request takes the suspect one once its deadline is
    LAST_RESORT_S away, not before, and not at the timeout. The ticket carries the time
    left, and the queue grants it on its own clock."""
    cluster = InMemoryCluster([("v6e", "4x4", 2)])
    cluster.take("v6e-16-0", 0, {"TPU": 4})
    cluster.suspect("v6e-16-1", 3)
    reservation = reserver(cluster, head_reservation_timeout_s=100).run()
    assert names(reservation) == ["v6e-16-1"] and reservation.claims[0].suspect
    assert 100 - LAST_RESORT_S <= cluster.clock.t < 100


def test_a_trusted_slice_freed_before_the_margin_is_taken_instead() -> None:
    cluster = InMemoryCluster([("v6e", "4x4", 2)])
    busy = cluster.take("v6e-16-0", 0, {"TPU": 4})
    cluster.suspect("v6e-16-1", 3)
    cluster.script("sleep", 3, lambda: cluster.remove_group(busy))
    reservation = reserver(cluster, head_reservation_timeout_s=100).run()
    assert names(reservation) == ["v6e-16-0"]
    assert cluster.clock.t < 100 - LAST_RESORT_S


def test_a_range_takes_the_trusted_slices_it_needs_and_leaves_the_suspect_ones() -> None:
    cluster = one_slice(3)
    cluster.suspect("v6e-16-1", 0)
    cluster.suspect("v6e-16-2", 0)
    reservation = reserver(cluster, num_slices=(1, 3)).run()
    assert names(reservation) == ["v6e-16-0"]


def test_a_queue_grant_of_a_suspect_slice_carries_its_state() -> None:
    cluster = InMemoryCluster([("v6e", "4x4", 1)], queue=True)
    assert cluster.queue is not None
    cluster.suspect("v6e-16-0", 1)
    kind = SliceKind(SliceRequest(topology="4x4", accelerator_version="v6e").plan.shape, 1)
    cluster.queue.enqueue(Ticket("t", kind, (1, 1), 0, "driver t", "job", time_left_s=5.0))
    granted = cluster.queue.wait("t")
    assert getattr(granted, "slices", None) == ("v6e-16-0",)
    (view,) = granted.view
    assert view.state is SliceState.SUSPECT and view.idle
    waiting = cluster.queue.book.entry("t")
    assert waiting is not None and waiting[0].deadline == pytest.approx(cluster.clock.t + 5.0)


def test_a_sub_slice_without_a_suspect_host_is_taken_first() -> None:
    """Sub-slice #0 of a 4x4 has a suspect host: #1 is taken; with #1 held, #0 is taken
    only once the deadline is near (sub-slice #1 could serve, once given back)."""
    cluster = InMemoryCluster([("v6e", "4x4")])
    known = Layouts({"v6e-16-0": {0: 0, 1: 1, 2: 2, 3: 3}})
    learned, _ = reserve_subslice(cluster, known)  # learns the layout while all is idle
    cluster.remove_group(learned.combined_pg)
    cluster.suspect("v6e-16-0", 0)
    first, _ = reserve_subslice(cluster, known, head_reservation_timeout_s=100)
    assert workers(first) == [2, 3] and not first.claims[0].suspect
    second, _ = reserve_subslice(cluster, known, head_reservation_timeout_s=100)
    assert workers(second) == [0, 1] and second.claims[0].suspect
    assert second.claims[0].target.reason == "host 0 suspect (hang), 9 min left"
    assert cluster.clock.t >= 100 - LAST_RESORT_S
