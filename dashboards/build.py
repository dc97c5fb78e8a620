"""Write tpuslice's Grafana dashboard (``tpuslice_grafana_dashboard.json``, next to this
file) in the form of the dashboards Ray generates for itself (Ray 2.60's
``ray/dashboard/modules/metrics/dashboards``): a ``${datasource}`` variable, the
``SessionName`` filter, a ``$window`` for rates, and "graph" panels on a 24-column grid.
Import it in Grafana next to Ray's. Run ``python dashboards/build.py`` after changing a
panel; ``tests/test_dashboard.py`` fails while the JSON and this script disagree.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
OUTPUT = HERE / "tpuslice_grafana_dashboard.json"
FILTER = 'SessionName=~"$SessionName"'


def counted(selector: str) -> str:
    """What a counter (or a histogram's series) added in the window, each series counted
    from nothing if it began in the window: every driver records into series of its own
    (labelled with its worker), and ``increase`` alone never counts a series' first step,
    so a driver's first reservation or run would never show."""
    return f"({selector} unless {selector} offset $window or increase({selector}[$window]))"


GOODPUT = f"ray_tpuslice_goodput_seconds_total{{{FILTER}}}"
PRODUCTIVE = f'ray_tpuslice_goodput_seconds_total{{{FILTER}, category="productive"}}'
BADPUT = f'ray_tpuslice_goodput_seconds_total{{{FILTER}, category!="productive"}}'
WAITED = f'ray_tpuslice_reservation_wait_seconds_bucket{{{FILTER}, outcome="granted"}}'

# (title, description, unit, stacked, [(expr, legend)])
PANELS: list[tuple[str, str, str, bool, list[tuple[str, str]]]] = [
    (
        "TPU slices by state",
        "Whole slices: ready (idle), busy, broken (a host dead or missing), notice "
        "(preemption or maintenance announced), suspect (a host failed a run lately: taken "
        "only as a last resort), and queued (slices waiting requests want).",
        "short",
        True,
        [
            (
                f"sum by (state) (max by (state, pod_type) (ray_tpuslice_slices{{{FILTER}}}))",
                "{{state}}",
            )
        ],
    ),
    (
        "TPU hosts by state",
        "TPU VMs: free, busy, dead, notice, suspect (failed a run lately).",
        "short",
        True,
        [
            (
                f"sum by (state) (max by (state, pod_type) (ray_tpuslice_hosts{{{FILTER}}}))",
                "{{state}}",
            )
        ],
    ),
    (
        "Requests waiting in the slice queue",
        "Reservations waiting in the cluster-wide queue.",
        "short",
        False,
        [(f"max(ray_tpuslice_queue_length{{{FILTER}}})", "waiting")],
    ),
    (
        "Reservations by outcome",
        "Reservations ended in the window: granted, timed out, impossible (the cluster "
        "can never hold the request).",
        "short",
        True,
        [
            (
                f"sum by (outcome) {counted(f'ray_tpuslice_reservations_total{{{FILTER}}}')}",
                "{{outcome}}",
            )
        ],
    ),
    (
        "Reservation wait",
        "Seconds from asking for slices to the grant, over the window: 50th and 95th "
        "percentile, and mean.",
        "s",
        False,
        [
            (
                f"histogram_quantile(0.5, sum by (le, topology) {counted(WAITED)})",
                "p50 {{topology}}",
            ),
            (
                f"histogram_quantile(0.95, sum by (le, topology) {counted(WAITED)})",
                "p95 {{topology}}",
            ),
            (
                "sum by (topology) "
                + counted(
                    f'ray_tpuslice_reservation_wait_seconds_sum{{{FILTER}, outcome="granted"}}'
                )
                + " / sum by (topology) "
                + counted(
                    f'ray_tpuslice_reservation_wait_seconds_count{{{FILTER}, outcome="granted"}}'
                ),
                "mean {{topology}}",
            ),
        ],
    ),
    (
        "Resilient attempts by outcome",
        "Attempts ended per window: success, failure (the code raised), preemption, "
        "host_failure (a host lost without notice), hang.",
        "short",
        True,
        [
            (
                f"sum by (outcome) {counted(f'ray_tpuslice_attempts_total{{{FILTER}}}')}",
                "{{outcome}}",
            )
        ],
    ),
    (
        "Run duration (95th percentile)",
        "One-shot runs, tpuslice run commands, and resilient attempts ended in the window.",
        "s",
        False,
        [
            (
                "histogram_quantile(0.95, sum by (le, kind) "
                f"{counted(f'ray_tpuslice_run_duration_seconds_bucket{{{FILTER}}}')})",
                "{{kind}}",
            )
        ],
    ),
    (
        "Goodput",
        "Of the wall time of the runs that ended in the window (from asking for slices to "
        "handing them back), the share that was productive: the gang beating, less "
        "checkpoint saves and work a failure threw away.",
        "percentunit",
        False,
        [(f"sum {counted(PRODUCTIVE)} / sum {counted(GOODPUT)}", "goodput")],
    ),
    (
        "Badput by cause",
        "Where the rest of those runs' time went: queued, reserving, starting, "
        "checkpointing, lost (by cause: preemption, host_failure, hang, failure), "
        "recovering, handing_back.",
        "s",
        True,
        [(f"sum by (category, cause) {counted(BADPUT)}", "{{category}} {{cause}}")],
    ),
    (
        "Admission wait by tenant (95th percentile)",
        "Seconds from asking for slices to the grant, per tenant, over the window.",
        "s",
        False,
        [
            (
                f"histogram_quantile(0.95, sum by (le, tenant) {counted(WAITED)})",
                "{{tenant}}",
            )
        ],
    ),
    (
        "Tenants: slices held, quota, borrowed",
        "Per tenant (with quotas set): the slices it holds, its quota, and how many of "
        "those it holds it borrowed beyond its quota.",
        "short",
        False,
        [
            (
                "sum by (tenant, state) (max by (tenant, pod_type, state) "
                f"(ray_tpuslice_tenant_slices{{{FILTER}}}))",
                "{{tenant}} {{state}}",
            )
        ],
    ),
    (
        "Tenants' use (fair share)",
        "Each tenant's decayed slice-seconds: with quotas set, the next grant among tenants "
        "of one standing goes to the lowest use over weight.",
        "s",
        False,
        [(f"max by (tenant) (ray_tpuslice_tenant_usage{{{FILTER}}})", "{{tenant}}")],
    ),
    (
        "Preemptions by cause",
        "Work the queue preempted in the window: quota (a tenant took back its quota), "
        "priority, and taken_back (the work outstayed its grace); by the work's tenant.",
        "short",
        True,
        [
            (
                f"sum by (cause, tenant) {counted(f'ray_tpuslice_preemptions_total{{{FILTER}}}')}",
                "{{cause}} {{tenant}}",
            )
        ],
    ),
    (
        "Slice-seconds by state",
        "Where the cluster's slice time went in the window: productive (busy, its gang "
        "beating), busy otherwise, idle, broken, notice.",
        "s",
        True,
        [
            (
                f"sum by (state) {counted(f'ray_tpuslice_slice_seconds_total{{{FILTER}}}')}",
                "{{state}}",
            )
        ],
    ),
]


def panel(index: int, spec: tuple[str, str, str, bool, list[tuple[str, str]]]) -> dict[str, Any]:
    """One panel in the "graph" form of Ray's own dashboards."""
    title, description, unit, stacked, queries = spec
    return {
        "datasource": "${datasource}",
        "description": description,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
        "id": index + 1,
        "fill": 10 if stacked else 1,
        "legend": {
            "alignAsTable": True,
            "current": True,
            "max": True,
            "show": True,
            "values": True,
        },
        "lines": True,
        "linewidth": 1,
        "nullPointMode": "null",
        "stack": stacked,
        "targets": [
            {"exemplar": True, "expr": expr, "legendFormat": legend, "refId": chr(65 + n)}
            for n, (expr, legend) in enumerate(queries)
        ],
        "title": title,
        "tooltip": {"shared": True, "sort": 0, "value_type": "individual"},
        "type": "graph",
        "xaxis": {"mode": "time", "show": True, "values": []},
        "yaxes": [
            {"format": unit, "logBase": 1, "min": "0", "show": True},
            {"format": "short", "logBase": 1, "show": True},
        ],
    }


def dashboard() -> dict[str, Any]:
    """The whole dashboard."""
    return {
        "title": "tpuslice",
        "uid": "tpuslice",
        "version": 1,
        "schemaVersion": 27,
        "style": "dark",
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "tags": ["ray", "tpu", "tpuslice"],
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": "-- Grafana --",
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "type": "datasource",
                    "description": "Filter queries of a specific Prometheus type.",
                    "query": "prometheus",
                    "refresh": 1,
                    "hide": 2,
                    "includeAll": False,
                    "multi": False,
                    "current": {"selected": False},
                },
                {
                    "name": "window",
                    "label": "Window",
                    "type": "interval",
                    "description": "Window for rate() and increase().",
                    "query": "1m,5m,15m,1h",
                    "current": {"selected": True, "text": "5m", "value": "5m"},
                    "auto": False,
                    "refresh": 2,
                    "hide": 0,
                },
                {
                    "name": "SessionName",
                    "type": "query",
                    "description": "Filter queries to specific Ray sessions.",
                    "datasource": "${datasource}",
                    "definition": "label_values(ray_tpuslice_slices, SessionName)",
                    "query": {
                        "query": "label_values(ray_tpuslice_slices, SessionName)",
                        "refId": "StandardVariableQuery",
                    },
                    "refresh": 1,
                    "hide": 0,
                    "includeAll": True,
                    "multi": False,
                    "allValue": ".*",
                    "sort": 2,
                    "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
                },
            ]
        },
        "panels": [panel(i, spec) for i, spec in enumerate(PANELS)],
    }


def render() -> str:
    """The dashboard as the JSON file holds it."""
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    OUTPUT.write_text(render())
    print(f"wrote {OUTPUT}")
