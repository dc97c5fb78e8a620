"""The metrics' pure parts: cluster gauges from a snapshot, exported names, request tags."""

from __future__ import annotations

import pytest

from test_status import mixed_snapshot, queued_snapshot
from tpuslice import metrics
from tpuslice.observe import describe_request
from tpuslice.request import SliceRequest


def values(snapshot: object, known: set[str] | None = None) -> dict[tuple[str, ...], float]:
    found = metrics.cluster_values(snapshot, known)  # type: ignore[arg-type]
    return {(name, *sorted(tags.items())): value for name, value, tags in found}  # type: ignore[misc]


def series(name: str, **tags: str) -> tuple[str, ...]:
    return (name, *sorted(tags.items()))  # type: ignore[arg-type]


def test_slices_and_hosts_are_counted_by_state_and_pod_type() -> None:
    got = values(queued_snapshot())
    v6e16 = {"pod_type": "v6e-16"}
    assert got[series("slices", state="ready", **v6e16)] == 1
    assert got[series("slices", state="busy", **v6e16)] == 1
    assert got[series("slices", state="notice", **v6e16)] == 1
    assert got[series("slices", state="broken", **v6e16)] == 0
    assert got[series("slices", state="broken", pod_type="v5p-32")] == 1
    # 12 hosts of v6e-16: one busy, one warned, the rest free
    assert got[series("hosts", state="free", **v6e16)] == 10
    assert got[series("hosts", state="busy", **v6e16)] == 1
    assert got[series("hosts", state="notice", **v6e16)] == 1
    # v5p-32: one host killed, one missing (not a host Ray knows, so not counted)
    assert got[series("hosts", state="dead", pod_type="v5p-32")] == 1
    assert got[series("hosts", state="free", pod_type="v5p-32")] == 2


def test_waiting_requests_are_queued_slices_and_the_queue_length() -> None:
    got = values(queued_snapshot())
    # t1 wants 2 v6e-16 and t2 at least 1; t3 was granted its v6e-8 and waits no more
    assert got[series("slices", state="queued", pod_type="v6e-16")] == 3
    assert got[series("slices", state="queued", pod_type="v6e-8")] == 0
    assert got[series("queue_length")] == 2


def test_a_stale_queue_record_counts_as_no_queue() -> None:
    got = values(queued_snapshot(written_at=0.0))
    assert got[series("queue_length")] == 0
    assert got[series("slices", state="queued", pod_type="v6e-16")] == 0


def test_a_pod_type_that_disappears_reads_zero_instead_of_its_last_value() -> None:
    known: set[str] = set()
    values(mixed_snapshot(), known)
    assert "v5p-32" in known
    from dataclasses import replace

    gone = replace(
        mixed_snapshot(),
        slices={k: v for k, v in mixed_snapshot().slices.items() if v.pod_type != "v5p-32"},
    )
    got = values(gone, known)
    assert got[series("slices", state="broken", pod_type="v5p-32")] == 0
    assert got[series("hosts", state="dead", pod_type="v5p-32")] == 0


def test_every_series_is_exported_under_rays_prefix_with_prometheus_suffixes() -> None:
    names = metrics.exported_names()
    assert "ray_tpuslice_reservations_total" in names
    assert "ray_tpuslice_reservation_wait_seconds_bucket" in names
    assert "ray_tpuslice_slices" in names
    assert all(n.startswith("ray_tpuslice_") for n in names)
    counters = [n for n, d in metrics.DEFINITIONS.items() if d[0] == "counter"]
    assert not any(n.endswith("_total") for n in counters)  # Ray adds it


def test_tags_are_bounded_no_ids() -> None:
    for name, (_, _, tags, _) in metrics.DEFINITIONS.items():
        assert not {"job", "task", "ticket", "pid", "node_id"} & set(tags), name


@pytest.mark.parametrize(("count", "what"), [(2, "2 x v4 2x2x2"), ((1, 3), "1..3 x v4 2x2x2")])
def test_a_request_is_named_with_its_count_and_tagged_without(
    count: int | tuple[int, int], what: str
) -> None:
    request = SliceRequest(topology="2x2x2", accelerator_version="v4", num_slices=count)
    assert describe_request(request) == (what, "v4 2x2x2")


def test_recording_without_ray_does_nothing_and_does_not_raise() -> None:
    metrics.reservation_ended("v4 2x2x2", "granted", 0.5)
    metrics.run_ended("one_shot", "ok", 1.0)
    metrics.attempt_ended("success")
