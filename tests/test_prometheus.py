"""The shipped Grafana dashboard against a real Prometheus (tests/promutil.py): a driver
process runs a resilient run whose first attempt is preempted and whose second hangs,
between two one-shot runs; Prometheus scrapes the session's simulated cluster through
Ray's service-discovery file, and every query of every panel must return numbers, with
the counts the script makes certain. The pure tests show that the check fails on a query
that names no metric Prometheus has, or that returns no series."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from clusterutil import markers_written, take_back_a_quota, wait_for
from promutil import (
    SD_FILE,
    Prometheus,
    PrometheusError,
    dashboard_problems,
    dashboard_queries,
    data_of,
    query_problems,
    ray_service_discovery,
    running_prometheus,
    series_of,
    stop,
    substitute,
    wait_for_answer,
)
from test_dashboard import load
from tpuslice._tpu import _ray
from tpuslice._tpu.keys import NAMESPACE, QUOTAS_KEY
from tpuslice.testing import SimulatedCluster

WINDOW = "1m"
"""The dashboard's ``$window``: longer than the whole script, so every rate sees it."""

DRIVER = textwrap.dedent(
    """
    import json, os, pathlib, sys, time, uuid
    import ray, tpuslice
    from tpuslice._host.heartbeats import BEAT_ENV

    ray.init(address=sys.argv[1], log_to_driver=False)
    marks = pathlib.Path(sys.argv[2])
    started, go = marks / "started", marks / "go"
    print(json.dumps({"worker": ray.get_runtime_context().get_worker_id()}), flush=True)
    V6E = dict(topology="2x4", accelerator_version="v6e")

    @ray.remote
    def rank():
        return tpuslice.current_host().rank

    @ray.remote
    def beat_until_go():
        # A marker naming the slice and this rank's heartbeat key, then a beat every
        # 50 ms until the test says go.
        host = tpuslice.current_host()
        hidden = started / f".{uuid.uuid4().hex}"
        hidden.write_text(f"{host.slice_name} {os.environ.get(BEAT_ENV, '')}")
        hidden.rename(started / hidden.name[1:])
        deadline = time.monotonic() + 120
        while not go.exists():
            if time.monotonic() > deadline:
                raise TimeoutError("the test never said go")
            tpuslice.heartbeat()
            time.sleep(0.05)
        return host.slice_name

    # A one-shot before and after: a rate needs a series to grow while Prometheus looks.
    ray.get(tpuslice.run_on_slice(rank, **V6E))
    result = tpuslice.run_resilient(
        beat_until_go, topology="2x2x2", accelerator_version="v4",
        max_retries_preemption=1, max_retries_hang=1, heartbeat_timeout_s=2.0,
        backoff_s=(0.1, 0.2), head_reservation_timeout_s=60,
    )
    ray.get(tpuslice.run_on_slice(rank, **V6E))
    (marks / "done").write_text(json.dumps(result))
    deadline = time.monotonic() + 120                           # until the test has asked
    while not (marks / "exit").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    """
)


@pytest.fixture
def prometheus(tpu_cluster: SimulatedCluster, tmp_path: Path) -> Iterator[Prometheus]:
    """A Prometheus scraping the session's cluster, stopped after the test."""
    # Ray has no public API for the session's directories.
    node = ray._private.worker.global_worker.node
    session, temp = Path(node.get_session_dir_path()), Path(node.get_temp_dir_path())
    workdir = tmp_path / "prometheus"
    workdir.mkdir()
    # Prometheus first: its discovery passes targets on every 5 s, a wait that then
    # overlaps the start of Ray's writer.
    with (
        running_prometheus(session / SD_FILE, workdir) as server,
        ray_service_discovery(session, temp, tpu_cluster.address, workdir),
    ):
        wait_for(server.targets_up, 30, "a node of Ray's service discovery scraped")
        yield server


def start_driver(address: str, marks: Path) -> tuple[subprocess.Popen[str], str]:
    """The driver process, and its worker id (the ``WorkerId`` label of its metrics)."""
    with (marks / "driver.err").open("w") as err:  # a file: a pipe nobody reads fills up
        proc = subprocess.Popen(
            [sys.executable, "-c", DRIVER, address, str(marks)],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    assert proc.stdout is not None
    worker = json.loads(proc.stdout.readline() or "{}").get("worker", "")
    assert worker, driver_log(marks)
    return proc, worker


def driver_log(marks: Path) -> str:
    return (marks / "driver.err").read_text(errors="replace")[-3000:]


def by(prometheus: Prometheus, expr: str, *labels: str) -> dict[tuple[str, ...], float]:
    """``expr``'s values keyed by the given labels."""
    return {
        tuple(s["metric"].get(label, "") for label in labels): s["value"]
        for s in prometheus.query(expr)
    }


def counts_problems(prometheus: Prometheus, worker: str) -> list[str]:
    """How the driver's counters differ from what its script makes certain."""
    ours = f'WorkerId="{worker}"'
    wanted: list[tuple[str, tuple[str, ...], dict[tuple[str, ...], float]]] = [
        (
            f"ray_tpuslice_attempts_total{{{ours}}}",
            ("outcome",),
            {("preemption",): 1, ("hang",): 1, ("success",): 1},
        ),
        (
            f"ray_tpuslice_run_duration_seconds_count{{{ours}}}",
            ("kind", "outcome"),
            {
                ("resilient_attempt", "preemption"): 1,
                ("resilient_attempt", "hang"): 1,
                ("resilient_attempt", "success"): 1,
                ("one_shot", "success"): 2,
            },
        ),
        (
            f"ray_tpuslice_reservations_total{{{ours}}}",
            ("topology", "outcome"),
            {("v4 2x2x2", "granted"): 3, ("v6e 2x4", "granted"): 2},
        ),
    ]
    problems = []
    for metric, labels, expected in wanted:
        found = by(prometheus, f"sum by ({', '.join(labels)}) ({metric})", *labels)
        if found != expected:
            problems.append(f"{metric}: {found}, wanted {expected}")
    return problems


def run_the_script(cluster: SimulatedCluster, marks: Path, proc: subprocess.Popen[str]) -> None:
    """Attempt 1 is preempted (its slice dies after a 3 s notice, and comes back), the
    hang of a host of attempt 2's slice is caught by heartbeats, attempt 3 succeeds."""
    started, go = marks / "started", marks / "go"
    dying: list[threading.Thread] = []
    victim = ""
    try:
        first = wait_for(lambda: markers_written(started, 2), 60, "attempt 1 running")
        victim = first[0].split()[0]
        thread = cluster.preempt_slice(victim, notice_s=3, wait=False)
        assert thread is not None
        dying.append(thread)
        markers = wait_for(lambda: markers_written(started, 4), 60, "attempt 2 running")
        second = [m.split() for m in markers if m not in first]
        (other,) = {name for name, _ in second}
        assert other != victim
        beats = {key for _, key in second}
        wait_for(lambda: beats <= set(_ray.kv_list("beat/", "tpuslice")), 30, "attempt 2's beats")
        assert cluster.hang_host(other, 1), "nothing to hang"
        dying.pop().join(30)
        cluster.restore_slice(victim)  # attempt 3 needs a trusted slice: this one, back
        victim = ""
        wait_for(lambda: markers_written(started, 6), 60, "attempt 3 running")
        go.touch()
        wait_for(
            lambda: (marks / "done").exists() or proc.poll() is not None, 60, "the script's end"
        )
        assert (marks / "done").exists(), driver_log(marks)
    finally:
        go.touch()
        for thread in dying:
            thread.join(30)
        if victim:
            cluster.restore_slice(victim)


@pytest.mark.cluster
def test_every_dashboard_query_answers_after_a_preemption_and_a_hang(
    tpu_cluster: SimulatedCluster, prometheus: Prometheus, tmp_path: Path
) -> None:
    marks = tmp_path / "marks"
    (marks / "started").mkdir(parents=True)
    proc, worker = start_driver(tpu_cluster.address, marks)
    try:
        run_the_script(tpu_cluster, marks, proc)
        take_back_a_quota()
        session = session_name(prometheus)
        variables = {"SessionName": session, "window": WINDOW}
        queries = dashboard_queries(load())
        assert queries  # the dashboard has panels with queries

        attempts = substitute(
            next(e for _, e in queries if "ray_tpuslice_attempts_total" in e), variables
        )

        def problems() -> list[str]:
            found = counts_problems(prometheus, worker)
            found += dashboard_problems(prometheus, queries, variables)
            # The attempts panel lists each outcome of the script. Its values are not
            # asserted: increase() cannot see a series' first step, from none to 1.
            shown = {s["metric"].get("outcome") for s in prometheus.query(attempts)}
            if not {"preemption", "hang", "success"} <= shown:
                found.append(f"the attempts panel shows only {sorted(map(str, shown))}")
            return found

        found = wait_for_answer(problems, timeout=30)
        assert not found, "\n".join(found)

        # The same check fails on a metric that does not exist.
        renamed = attempts.replace("attempts_total", "attempt_total")
        assert query_problems(prometheus.query, prometheus.metric_names(), renamed) == [
            "names ray_tpuslice_attempt_total, which Prometheus has no samples of",
            "returned no series",
        ]
        (marks / "exit").touch()
        assert proc.wait(timeout=30) == 0, driver_log(marks)
    finally:
        _ray.kv_delete(QUOTAS_KEY, NAMESPACE)
        (marks / "exit").touch()
        stop(proc)


def session_name(prometheus: Prometheus) -> str:
    """The one Ray session Prometheus sees: what the dashboard's ``SessionName`` variable
    offers (``label_values(ray_tpuslice_slices, SessionName)``)."""
    variable = next(v for v in load()["templating"]["list"] if v["name"] == "SessionName")
    metric = variable["query"]["query"].removeprefix("label_values(").split(",")[0]
    sessions = prometheus.get("/api/v1/label/SessionName/values", **{"match[]": metric})
    assert len(sessions) == 1, sessions
    return str(sessions[0])


# --- the check itself, on Prometheus's answers as its HTTP API gives them ---------------


def answer(*values: str, metric: dict[str, str] | None = None) -> dict[str, Any]:
    """An instant query's answer, as JSON from /api/v1/query."""
    result = [{"metric": metric or {}, "value": [1.7e9, v]} for v in values]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


def fake_query(body: dict[str, Any]) -> Any:
    return lambda expr: series_of(data_of(body))


def test_a_query_that_returns_numbers_has_no_problem() -> None:
    good = answer("1", "NaN", metric={"outcome": "hang"})
    assert query_problems(fake_query(good), {"ray_x_total"}, "sum(ray_x_total)") == []


def test_a_query_with_no_series_fails() -> None:
    assert query_problems(fake_query(answer()), {"ray_x_total"}, "sum(ray_x_total)") == [
        "returned no series"
    ]


def test_a_query_naming_a_metric_prometheus_lacks_fails() -> None:
    """Even when the query still returns something (``or vector(0)``)."""
    problems = query_problems(fake_query(answer("0")), {"ray_x_total"}, "ray_y or vector(0)")
    assert problems == ["names ray_y, which Prometheus has no samples of"]


def test_a_query_of_only_nan_fails() -> None:
    """A quantile of a histogram that did not grow in the window is NaN: no data."""
    problems = query_problems(fake_query(answer("NaN", "NaN")), {"ray_h"}, "q(ray_h)")
    assert problems == ["returned only NaN (2 series)"]


def test_a_refused_query_fails_with_prometheus_reason() -> None:
    refused = {"status": "error", "errorType": "bad_data", "error": "parse error"}
    assert query_problems(fake_query(refused), {"ray_h"}, "ray_h[") == [
        "was refused: bad_data: parse error"
    ]


def test_every_panel_query_is_evaluated_with_its_variables_filled() -> None:
    dashboard = load()
    queries = dashboard_queries(dashboard)
    assert len(queries) == sum(len(p["targets"]) for p in dashboard["panels"])
    filled = [substitute(e, {"SessionName": "s", "window": "1m"}) for _, e in queries]
    assert not any("$" in e for e in filled), filled
    assert substitute("rate(x[${window}])", {"window": "1m"}) == "rate(x[1m])"
    with pytest.raises(PrometheusError, match=r"no value for the template variable \$node"):
        substitute('x{node="$node"}', {"window": "1m"})
