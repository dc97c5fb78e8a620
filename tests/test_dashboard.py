"""The Grafana dashboard shipped in dashboards/: valid JSON, made by its script, in Ray's
form, and asking only for metrics tpuslice exports (the cluster test in test_metrics_live
checks that a real scrape has each of them)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

from tpuslice.record import metrics

DASHBOARDS = Path(__file__).parent.parent / "dashboards"


def load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DASHBOARDS / "tpuslice_grafana_dashboard.json").read_text())
    return data


def queried_metrics(dashboard: dict[str, Any]) -> set[str]:
    """Every ray_tpuslice_* series a panel or a variable asks Prometheus for."""
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return {m for e in exprs for m in re.findall(r"\bray_tpuslice_\w+", e)}


def test_the_json_is_what_the_script_writes() -> None:
    spec = importlib.util.spec_from_file_location("build", DASHBOARDS / "build.py")
    assert spec is not None and spec.loader is not None
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    assert (DASHBOARDS / "tpuslice_grafana_dashboard.json").read_text() == build.render()


def test_every_query_names_an_exported_metric() -> None:
    asked = queried_metrics(load())
    assert asked  # the regex found the queries
    assert asked <= metrics.exported_names(), asked - metrics.exported_names()


def test_it_is_in_rays_form_and_filters_by_session() -> None:
    dashboard = load()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert "SessionName" in variables and "window" in variables
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["datasource"] == "${datasource}"
        for target in panel["targets"]:
            assert 'SessionName=~"$SessionName"' in target["expr"], panel["title"]


def test_it_shows_slices_by_state_waits_and_preemptions() -> None:
    asked = queried_metrics(load())
    assert "ray_tpuslice_slices" in asked
    assert "ray_tpuslice_reservation_wait_seconds_bucket" in asked
    assert "ray_tpuslice_attempts_total" in asked  # preemptions are an outcome there


def test_it_shows_goodput_badput_by_cause_and_slice_seconds() -> None:
    titles = {p["title"]: p for p in load()["panels"]}
    goodput = titles["Goodput"]["targets"][0]["expr"]
    assert 'category="productive"' in goodput and goodput.count("ray_tpuslice_goodput") >= 2
    badput = titles["Badput by cause"]["targets"][0]["expr"]
    assert 'category!="productive"' in badput and "by (category, cause)" in badput
    assert (
        "ray_tpuslice_slice_seconds_total" in titles["Slice-seconds by state"]["targets"][0]["expr"]
    )


def test_counters_count_a_series_that_began_in_the_window() -> None:
    """Each driver records into series of its own, so ``increase`` alone would miss its
    first reservation, attempt or run: every counter and histogram query also takes, whole,
    the series that did not exist a window ago."""
    for panel in load()["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            if "_total" in expr or "_bucket" in expr or "_sum" in expr:
                assert "offset $window" in expr and "increase(" in expr, panel["title"]
                assert "rate(" not in expr, panel["title"]
