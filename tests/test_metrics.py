"""The metrics' pure parts: cluster gauges from a snapshot, exported names, request tags."""

from __future__ import annotations

import pytest

from test_status import mixed_snapshot, queued_snapshot
from tpuslice._reserve.observe import describe_request
from tpuslice._reserve.request import SliceRequest
from tpuslice.record import metrics


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
    assert got[series("slices", state="suspect", **v6e16)] == 1
    assert got[series("slices", state="broken", **v6e16)] == 0
    assert got[series("slices", state="broken", pod_type="v5p-32")] == 1
    # 16 hosts of v6e-16: one busy, one warned, one suspect, the rest free
    assert got[series("hosts", state="free", **v6e16)] == 13
    assert got[series("hosts", state="busy", **v6e16)] == 1
    assert got[series("hosts", state="notice", **v6e16)] == 1
    assert got[series("hosts", state="suspect", **v6e16)] == 1
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


@pytest.mark.parametrize(("count", "what"), [(2, "2 x v4 2x2x2"), ((1, 3), "1..3 x v4 2x2x2")])
def test_a_request_is_named_with_its_count_and_tagged_without(
    count: int | tuple[int, int], what: str
) -> None:
    request = SliceRequest(topology="2x2x2", accelerator_version="v4", num_slices=count)
    assert describe_request(request) == (what, "v4 2x2x2")


class Recorded:
    """Stands in for one Ray metric object: remembers what was recorded."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[tuple[str, float, dict[str, str]]] = []

    def inc(self, value: float, tags: dict[str, str]) -> None:
        self.calls.append(("inc", value, tags))

    def observe(self, value: float, tags: dict[str, str]) -> None:
        self.calls.append(("observe", value, tags))

    def set(self, value: float, tags: dict[str, str]) -> None:
        self.calls.append(("set", value, tags))


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> dict[str, Recorded]:
    made: dict[str, Recorded] = {}
    monkeypatch.setattr(metrics, "_REGISTRY", metrics._Registry())
    monkeypatch.setattr(metrics, "_make", lambda name: made.setdefault(name, Recorded(name)))
    monkeypatch.setattr("ray.is_initialized", lambda: True)
    return made


def test_a_reservation_counts_and_observes_its_wait(recorded: dict[str, Recorded]) -> None:
    metrics.reservation_ended("v4 2x2x2", "timed_out", 12.5, "team-a")
    tags = {"topology": "v4 2x2x2", "outcome": "timed_out", "tenant": "team-a"}
    assert recorded["reservations"].calls == [("inc", 1.0, tags)]
    assert recorded["reservation_wait_seconds"].calls == [("observe", 12.5, tags)]


def test_runs_and_attempts_are_recorded_with_their_tags(recorded: dict[str, Recorded]) -> None:
    metrics.run_ended("one_shot", "success", 3.0)
    metrics.attempt_ended("preemption")
    assert recorded["run_duration_seconds"].calls == [
        ("observe", 3.0, {"kind": "one_shot", "outcome": "success"})
    ]
    assert recorded["attempts"].calls == [("inc", 1.0, {"outcome": "preemption"})]


def test_the_reporter_sets_every_gauge_and_survives_a_failed_read(
    recorded: dict[str, Recorded],
) -> None:
    reads: list[object] = [RuntimeError("GCS down"), queued_snapshot()]

    def read() -> object:
        result = reads.pop(0)
        if isinstance(result, Exception):
            raise result
        return result

    reporter = metrics.ClusterReporter(read, on_report=lambda snapshot, seconds: None)
    reporter.report_once()  # logged, nothing set
    assert recorded == {}
    reporter.report_once()
    assert ("set", 2.0, {}) in recorded["queue_length"].calls
    assert ("set", 1.0, {"state": "ready", "pod_type": "v6e-16"}) in recorded["slices"].calls


def test_a_metric_that_fails_is_not_raised_into_the_caller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(name: str) -> object:
        raise ValueError("bad tags")

    monkeypatch.setattr(metrics, "_REGISTRY", metrics._Registry())
    monkeypatch.setattr(metrics, "_make", broken)
    monkeypatch.setattr("ray.is_initialized", lambda: True)
    metrics.attempt_ended("success")  # no exception


def test_tenants_gauges_say_held_quota_and_borrowed(recorded: dict[str, Recorded]) -> None:
    metrics.tenant_values(
        {("team-a", "v4-16"): 3, ("team-b", "v4-16"): 1},
        {("team-a", "v4-16"): 2},
        {"team-a": 120.0},
    )
    sets = {(c[2]["tenant"], c[2]["state"]): c[1] for c in recorded["tenant_slices"].calls}
    assert sets == {
        ("team-a", "held"): 3,
        ("team-a", "borrowed"): 1,
        ("team-a", "quota"): 2,
        ("team-b", "held"): 1,
        ("team-b", "borrowed"): 1,
    }
    assert recorded["tenant_usage"].calls == [("set", 120.0, {"tenant": "team-a"})]
    metrics.preempted("quota", "team-b")
    assert recorded["preemptions"].calls == [("inc", 1.0, {"cause": "quota", "tenant": "team-b"})]
