"""Tenants sharing the simulated cluster: a tenant takes back its quota from a borrower's
resilient run, which gets the notice a GCE preemption gives, leaves within its grace,
queues again and finishes on the slice left; and a higher priority preempts lower
preemptible work, with status showing the pending reason and PREEMPTING."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import tpuslice
from clusterutil import beat_until_go, markers_written, run_in_background, wait_for
from tpuslice import AttemptEvent, Outcome
from tpuslice._tpu import _ray
from tpuslice._tpu.keys import HOLDER_KEY_PREFIX, NAMESPACE, PREEMPT_KEY_PREFIX, QUOTAS_KEY
from tpuslice._view.cluster import SliceState, read_snapshot
from tpuslice._view.quotas import Quotas, TenantQuota
from tpuslice.cli.status import state_label
from tpuslice.testing import SimulatedCluster, assert_no_placement_groups

pytestmark = pytest.mark.cluster

V4 = {"topology": "2x2x2", "accelerator_version": "v4"}
V4_SLICES = ["v4-16-a", "v4-16-b"]


@pytest.fixture
def quotas() -> Iterator[None]:
    """Quotas for this test only: team-a may have one v4-16, team-b none (it borrows)."""
    q = Quotas(
        {"team-a": TenantQuota({"v4-16": 1}), "team-b": TenantQuota(grace_s=20.0)},
    )
    _ray.kv_put(QUOTAS_KEY, q.to_json(), NAMESPACE)
    try:
        yield
    finally:
        _ray.kv_delete(QUOTAS_KEY, NAMESPACE)


def nothing_left() -> None:
    wait_for(
        lambda: all(read_snapshot().slices[n].state is SliceState.READY for n in V4_SLICES),
        60,
        "every v4 slice idle, with no notice",
    )
    assert_no_placement_groups()
    assert _ray.kv_list(HOLDER_KEY_PREFIX, NAMESPACE) == []
    assert _ray.kv_list(PREEMPT_KEY_PREFIX, NAMESPACE) == []


def test_a_tenant_takes_back_its_quota_from_a_borrowing_resilient_run(
    tpu_cluster: SimulatedCluster, tmp_path: Path, quotas: None
) -> None:
    markers, go = tmp_path / "started", tmp_path / "go"
    markers.mkdir()
    events: list[AttemptEvent] = []
    hooked: list[str] = []
    seen: list[str] = []

    def on_notice(event: AttemptEvent) -> None:
        assert event.notice is not None
        info = read_snapshot().slices[event.notice.slice_name]
        seen.append(f"{state_label(info)}: {info.reason}")
        hooked.append(event.notice.source)

    with run_in_background(
        beat_until_go,
        str(markers),
        str(go),
        **V4,
        num_slices=(1, 2),
        tenant="team-b",
        head_reservation_timeout_s=60,
        max_retries_preemption=1,
        backoff_s=(0.1, 0.2),
        on_event=events.append,
        on_notice=on_notice,
        go=go,
    ) as future:
        first = wait_for(lambda: markers_written(markers, 4), 60, "team-b on both slices")
        assert sorted(set(first)) == V4_SLICES  # it borrowed both idle slices
        asked = time.monotonic()
        with tpuslice.SlicePlacementGroup(
            **V4, tenant="team-a", head_reservation_timeout_s=60
        ) as mine:
            took = time.monotonic() - asked
            # team-b's run is back on the slice team-a did not take.
            again = wait_for(lambda: markers_written(markers, 6), 60, "team-b again")
            second = {s for s in V4_SLICES if again.count(s) == 4}
            assert second == set(V4_SLICES) - set(mine.slice_names)
            go.touch()
            results = future.result(timeout=60)
    assert took < 20.0  # team-b left at once, well within its grace of 20 s
    assert [e.kind for e in events] == ["started", "notice", "failed", "started", "succeeded"]
    failed = events[2]
    assert failed.outcome is Outcome.PREEMPTION
    assert "team-a takes back its quota" in failed.cause
    assert hooked == ["tpuslice queue"]
    assert seen and seen[0].startswith("PREEMPTING: preemption notice on")
    assert set(results) == set(second)
    nothing_left()


def test_a_higher_priority_preempts_lower_preemptible_work_and_status_says_so(
    tpu_cluster: SimulatedCluster, tmp_path: Path
) -> None:
    """No quotas: two reservations hold the v4 slices, one preemptible. A request of
    higher priority waits with a reason naming the work it preempts; the work sees the
    queue's notice (status: PREEMPTING, time left); once it leaves, the request runs."""
    low = tpuslice.SlicePlacementGroup(**V4, preemptible=True, tenant="batch")
    fixed = tpuslice.SlicePlacementGroup(**V4, tenant="batch")
    urgent: list[tpuslice.SlicePlacementGroup] = []
    try:
        thread = threading.Thread(
            target=lambda: urgent.append(
                tpuslice.SlicePlacementGroup(
                    **V4, priority=5, tenant="oncall", head_reservation_timeout_s=60
                )
            )
        )
        thread.start()
        taken = low.slice_names
        notices = wait_for(low.notices, 30, "the queue's notice on the preemptible work")
        assert {n.slice_name for n in notices} == set(taken)
        assert fixed.notices() == []
        # The queue gives its notices before it publishes the decision's record (an
        # earlier record, of a decision before the preemption, may still be there).
        snapshot = wait_for(
            lambda: (
                (found := read_snapshot()).queued()
                and "preempting" in found.queued()[0].reason
                and found
            ),
            10,
            "the request in the queue's record, preempting",
        )
        info = snapshot.slices[taken[0]]
        assert state_label(info) == "PREEMPTING" and "s left" in info.reason
        [request] = snapshot.queued()
        assert request.tenant == "oncall" and "preempting" in request.reason
        assert "a request of priority 5 outranks its 0" in notices[0].event
        low.shutdown()
        thread.join(60)
        assert urgent and urgent[0].slice_names == taken
    finally:
        for spg in [low, fixed, *urgent]:
            spg.shutdown()
    nothing_left()
