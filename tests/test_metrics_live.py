"""Metrics and the timeline on the session's simulated cluster: a driver process runs a
scripted history (reserve and run, a one-shot, a timeout, an impossible request, and a
resilient run whose first attempt fails); the test scrapes every node's Ray metrics
agent, as Prometheus does through Ray's service discovery, and reads the timeline with
`tpuslice status --events`. (The gauges' counts by state, a dead host's included, are
test_metrics's.)"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from clusterutil import exported_metrics, take_back_a_quota, wait_for
from test_dashboard import load, queried_metrics
from tpuslice._tpu import _ray
from tpuslice._tpu.keys import NAMESPACE, QUOTAS_KEY
from tpuslice.cli.commands import main
from tpuslice.record import metrics
from tpuslice.testing import SimulatedCluster, live_placement_groups

pytestmark = pytest.mark.cluster

DRIVER = textwrap.dedent(
    """
    import json, os, pathlib, sys, time
    import ray, tpuslice
    from tpuslice.record import events

    ray.init(address=sys.argv[1], log_to_driver=False)
    marks = pathlib.Path(sys.argv[2])
    context = ray.get_runtime_context()
    print(json.dumps({"worker": context.get_worker_id(), "job": context.get_job_id()}),
          flush=True)
    V4 = dict(topology="2x2x2", accelerator_version="v4")
    V6E = dict(topology="4x4", accelerator_version="v6e")

    @ray.remote
    def rank():
        return tpuslice.current_host().rank

    @ray.remote
    def fail_once():
        host = tpuslice.current_host()
        if host.rank == 1 and not (marks / "failed").exists():  # the first attempt only
            (marks / "failed").write_text(host.slice_name)
            raise ValueError("the first attempt fails")
        return host.slice_name

    with tpuslice.SlicePlacementGroup(**V4) as spg:            # reserve, run, hand back
        assert ray.get(tpuslice.run_on_slice(rank, tpu_slice=spg)) == [0, 1]
    assert ray.get(tpuslice.run_on_slice(rank, **V4)) == [0, 1]  # a one-shot
    with tpuslice.SlicePlacementGroup(**V6E):                   # the only v6e 4x4 held:
        try:                                                    # the next one times out
            tpuslice.SlicePlacementGroup(**V6E, head_reservation_timeout_s=1)
        except tpuslice.ReservationTimeoutError:
            pass
    try:                                                        # impossible here
        tpuslice.SlicePlacementGroup(topology="8x8", accelerator_version="v6e")
    except tpuslice.InsufficientSlicesError:
        pass
    result = tpuslice.run_resilient(fail_once, **V4, max_retries_failure=1)
    print(json.dumps({"ran_on": result}), flush=True)
    assert events.flush(timeout_s=10)
    (marks / "done").touch()
    deadline = time.monotonic() + 120                           # until the test scraped
    while not (marks / "exit").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    """
)


def scrape() -> list[tuple[str, dict[str, str], float]]:
    """Every ``ray_tpuslice_*`` sample of every live node's metrics agent (an agent that
    does not answer is skipped, as Prometheus marks a target down)."""
    samples = []
    for text in exported_metrics().values():
        for family in text_string_to_metric_families(text or ""):
            for sample in family.samples:
                if sample.name.startswith(metrics.EXPORTED_PREFIX):
                    samples.append((sample.name, dict(sample.labels), sample.value))
    return samples


def total(samples: list[tuple[str, dict[str, str], float]], name: str, **tags: str) -> float:
    """Sum of the samples named ``name`` whose labels include ``tags``."""
    return sum(
        value
        for sample, labels, value in samples
        if sample == name and tags.items() <= labels.items()
    )


def driver_log(marks: Path) -> str:
    """The end of the driver's stderr (a file: a pipe nobody reads fills up, and then
    the driver blocks on its next warning)."""
    return (marks / "driver.err").read_text(errors="replace")[-3000:]


@pytest.fixture
def driver(tpu_cluster: SimulatedCluster, tmp_path: Path) -> Iterator[dict[str, Any]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, tpu_cluster.address, str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=(tmp_path / "driver.err").open("w"),
        text=True,
    )
    assert proc.stdout is not None
    ids: dict[str, Any] = json.loads(proc.stdout.readline() or "{}")
    ids.update(proc=proc, marks=tmp_path)
    try:
        yield ids
    finally:
        (tmp_path / "exit").touch()
        try:
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()


def test_a_scripted_history_shows_in_the_metrics_and_the_timeline(
    tpu_cluster: SimulatedCluster, driver: dict[str, Any]
) -> None:
    proc, marks = driver["proc"], driver["marks"]
    assert driver.get("worker"), driver_log(marks)
    try:
        wait_for(
            lambda: (marks / "done").exists() or proc.poll() is not None,
            timeout=120,
            what="the driver's script",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}; its stderr ends:\n{driver_log(marks)}") from None
    assert (marks / "done").exists(), driver_log(marks)
    failed_on = (marks / "failed").read_text()

    # The queue actor's gauges describe the live cluster: every v4-16 slice, by state.
    wait_for(
        lambda: total(scrape(), "ray_tpuslice_slices", pod_type="v4-16") >= 2,
        timeout=60,
        what="the cluster gauges",
    )

    ours = {"WorkerId": driver["worker"]}
    expected = {
        ("ray_tpuslice_reservations_total", "granted", "v4 2x2x2"): 4,  # 1, one-shot, 2 tries
        ("ray_tpuslice_reservations_total", "granted", "v6e 4x4"): 1,
        ("ray_tpuslice_reservations_total", "timed_out", "v6e 4x4"): 1,
        ("ray_tpuslice_reservations_total", "impossible", "v6e 8x8"): 1,
        ("ray_tpuslice_reservation_wait_seconds_count", "timed_out", "v6e 4x4"): 1,
    }

    runs = "ray_tpuslice_run_duration_seconds_count"
    # Recorded at different moments and exported together every 2 s: all awaited at once.
    counted = {
        ("ray_tpuslice_attempts_total", "failure", ""): 1,
        ("ray_tpuslice_attempts_total", "success", ""): 1,
        (runs, "success", "one_shot"): 1,
        (runs, "failure", "resilient_attempt"): 1,
        (runs, "success", "resilient_attempt"): 1,
    }

    def driver_values() -> dict[tuple[str, str, str], float]:
        samples = scrape()
        found = {
            key: total(samples, key[0], outcome=key[1], topology=key[2], **ours) for key in expected
        }
        for key in counted:
            kind = {"kind": key[2]} if key[2] else {}
            found[key] = total(samples, key[0], outcome=key[1], **kind, **ours)
        return found

    wanted = {**expected, **counted}
    wait_for(lambda: driver_values() == wanted, timeout=60, what=f"{wanted}")
    samples = scrape()
    assert total(samples, "ray_tpuslice_reservation_wait_seconds_sum", outcome="timed_out") >= 1
    # Nothing waits now; the queue actor's gauge follows its last decision, exported on
    # the next metrics report.
    wait_for(
        lambda: total(scrape(), "ray_tpuslice_queue_length") == 0,
        timeout=30,
        what="the queue length gauge back to 0",
    )
    # A tenant takes back its quota: the queue's preemption count and tenants' gauges.
    try:
        take_back_a_quota()

        def names() -> set[str]:
            return {name for name, _, _ in scrape()}

        seen = wait_for(
            lambda: (found := names()) >= metrics.exported_names() and found,
            timeout=30,
            what="every metric exported",
        )
    finally:
        _ray.kv_delete(QUOTAS_KEY, NAMESPACE)
    assert metrics.exported_names() <= seen, metrics.exported_names() - seen
    assert queried_metrics(load()) <= seen  # the dashboard asks only for what is there

    # The timeline, as `tpuslice status --events --json` shows it, in order.
    result = CliRunner().invoke(main, ["status", "--events", "200", "--json"])
    assert result.exit_code == 0, result.output
    history = [e for e in json.loads(result.output)["events"] if e["job"] == driver["job"]]
    steps = [(e["kind"], e["outcome"]) for e in history]
    script = [
        ("reserved", "granted"),
        ("released", ""),
        ("reserved", "granted"),
        ("run", "success"),  # its hand-back is in the background: no place in the order
        ("reserved", "granted"),
        ("timed_out", "timed_out"),
        ("released", ""),
        ("impossible", "impossible"),
        ("reserved", "granted"),
        ("attempt", ""),
        ("attempt", "failure"),
        ("reserved", "granted"),
        ("attempt", ""),
        ("attempt", "success"),
        ("released", ""),
    ]
    assert _in_order(script, steps), steps
    assert steps.count(("released", "")) == 5  # 1, the one-shot, v6e, 2 attempts
    failed = next(e for e in history if e["kind"] == "attempt" and e["outcome"] == "failure")
    assert failed["slices"] == [failed_on] and "rank 1" in failed["detail"]
    text = CliRunner().invoke(main, ["status", "--events"], env={"COLUMNS": "160"}).output
    assert "impossible (1 x v6e 8x8)" in text and f"released {failed_on}" in text

    (marks / "exit").touch()
    assert proc.wait(timeout=30) == 0, driver_log(marks)
    wait_for(lambda: not live_placement_groups(), timeout=30, what="slices released")
    tpu_cluster.wait_tpus_free()


def _in_order(wanted: list[tuple[str, str]], seen: list[tuple[str, str]]) -> bool:
    """Whether ``wanted`` appears in ``seen`` in order (other steps may come between)."""
    rest = iter(seen)
    return all(step in rest for step in wanted)
