"""tpuslice's metrics, through Ray's own metrics system (:mod:`ray.util.metrics`), so Ray's
Prometheus set-up scrapes them as ``ray_tpuslice_<name>`` with no new service. Drivers
record their outcomes as they happen; the queue actor reports the cluster every
:data:`REPORT_S`. Tags are bounded: never ids of tasks, jobs or tickets.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from tpuslice._view.cluster import HostInfo, HostState, SliceState

if TYPE_CHECKING:
    from tpuslice._view.cluster import ClusterSnapshot

__all__ = ["exported_names"]

logger = logging.getLogger(__name__)

PREFIX = "tpuslice_"
EXPORTED_PREFIX = "ray_" + PREFIX
"""What Ray's exporter puts in front of every name here."""
REPORT_S = 5.0
"""How often the queue actor sets the cluster gauges."""

WAIT_BUCKETS = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
RUN_BUCKETS = (1.0, 10.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 12 * 3600.0, 24 * 3600.0)

SLICE_STATES = (*(s.value for s in SliceState), "queued")
"""``queued``: slices that waiting requests want (each request's least count)."""
HOST_STATES = (*(s.value for s in HostState), "notice", "suspect")
"""``notice``: alive and warned; ``suspect``: alive, not warned, and failed a run lately."""

# name -> (kind, description, tag keys)
DEFINITIONS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "slices": (
        "gauge",
        "TPU slices by state (ready, busy, broken, notice, suspect; queued: wanted by waiters).",
        ("state", "pod_type"),
    ),
    "hosts": (
        "gauge",
        "TPU hosts by state (free, busy, dead, notice, suspect).",
        ("state", "pod_type"),
    ),
    "queue_length": ("gauge", "Requests waiting in the cluster-wide slice queue.", ()),
    "reservations": (
        "counter",
        "Reservations by outcome (granted, timed_out, impossible).",
        ("topology", "outcome", "tenant"),
    ),
    "reservation_wait_seconds": (
        "histogram",
        "Seconds from asking for slices to the outcome (the admission wait), by tenant.",
        ("topology", "outcome", "tenant"),
    ),
    "run_duration_seconds": (
        "histogram",
        "Seconds a run took (one_shot, command, resilient_attempt) by outcome.",
        ("kind", "outcome"),
    ),
    "attempts": (
        "counter",
        "Resilient attempts by outcome (success, failure, preemption, host_failure, hang).",
        ("outcome",),
    ),
    "goodput_seconds": (
        "counter",
        "Seconds of ended runs by where they went (queued, reserving, starting, "
        "productive, checkpointing, lost, recovering, handing_back); lost by cause.",
        ("category", "cause"),
    ),
    "slice_seconds": (
        "counter",
        "Slice-seconds by state (productive, busy, idle, broken, notice).",
        ("state", "pod_type"),
    ),
    "preemptions": (
        "counter",
        "Work the queue preempted, by cause (quota: a tenant took back its quota; "
        "priority) and the preempted work's tenant; taken_back: it outstayed its grace.",
        ("cause", "tenant"),
    ),
    "tenant_slices": (
        "gauge",
        "Slices per tenant and pod type: held, quota, and borrowed (held beyond quota).",
        ("tenant", "pod_type", "state"),
    ),
    "tenant_usage": (
        "gauge",
        "Each tenant's decayed slice-seconds, which fair share orders tenants by.",
        ("tenant",),
    ),
}
BUCKETS = {"reservation_wait_seconds": WAIT_BUCKETS, "run_duration_seconds": RUN_BUCKETS}
"""Each histogram's bucket boundaries, in seconds."""


def exported_names() -> set[str]:
    """Every series name Prometheus gets from these metrics (without labels).

    Returns:
        ``ray_tpuslice_<name>``, with ``_total`` for counters and ``_bucket`` / ``_count``
        / ``_sum`` for histograms.
    """
    names = set()
    for name, (kind, _, _) in DEFINITIONS.items():
        full = EXPORTED_PREFIX + name
        if kind == "counter":
            names.add(full + "_total")
        elif kind == "histogram":
            names.update(full + suffix for suffix in ("_bucket", "_count", "_sum"))
        else:
            names.add(full)
    return names


class _Registry:
    """The Ray metric objects of this process, made on first use (Ray must be up).
    Process-wide, not per connection: Ray registers a metric name for the whole process,
    and a metric object holds no connection, so it still records after a reconnection."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._metrics: dict[str, Any] = {}

    def get(self, name: str) -> Any:
        with self._lock:
            metric = self._metrics.get(name)
            if metric is None:
                metric = self._metrics[name] = _make(name)
            return metric


def _make(name: str) -> Any:
    from ray.util.metrics import Counter, Gauge, Histogram

    kind, description, tags = DEFINITIONS[name]
    if kind == "counter":
        return Counter(PREFIX + name, description=description, tag_keys=tags)
    if kind == "histogram":
        return Histogram(
            PREFIX + name, description=description, boundaries=list(BUCKETS[name]), tag_keys=tags
        )
    return Gauge(PREFIX + name, description=description, tag_keys=tags)


_REGISTRY = _Registry()
"""This process's Ray metric objects (private: this module's functions are its API)."""


def _apply(name: str, value: float, tags: Mapping[str, str]) -> None:
    """Record one value; a metrics failure is logged, never raised into the caller's work."""
    import ray

    if not ray.is_initialized():
        return
    try:
        metric = _REGISTRY.get(name)
        kind = DEFINITIONS[name][0]
        if kind == "counter":
            metric.inc(value, tags=dict(tags))
        elif kind == "histogram":
            metric.observe(value, tags=dict(tags))
        else:
            metric.set(value, tags=dict(tags))
    except (ValueError, TypeError, RuntimeError, ray.exceptions.RayError) as exc:
        logger.debug("metric %s not recorded: %s", name, exc)


def reservation_ended(topology: str, outcome: str, wait_s: float, tenant: str = "") -> None:
    """Count a reservation's outcome (``granted``, ``timed_out`` or ``impossible``) and
    observe its admission wait; ``topology`` is ``<accelerator> <topology>`` (``v6e 4x4``)."""
    tags = {"topology": topology, "outcome": outcome, "tenant": tenant}
    _apply("reservations", 1.0, tags)
    _apply("reservation_wait_seconds", wait_s, tags)


def run_ended(kind: str, outcome: str, seconds: float) -> None:
    """Observe how long a run (``one_shot``, ``command`` or ``resilient_attempt``) took;
    ``outcome`` is ``success``, ``failure``, ``interrupted``, or an attempt's failure class."""
    _apply("run_duration_seconds", seconds, {"kind": kind, "outcome": outcome})


def attempt_ended(outcome: str) -> None:
    """Count one resilient attempt's outcome: ``success`` or the failure class."""
    _apply("attempts", 1.0, {"outcome": outcome})


def goodput_seconds(category: str, seconds: float, cause: str = "") -> None:
    """A run ended: count its seconds in one of :data:`~tpuslice.record.goodput.CATEGORIES`
    (for ``lost``, by ``cause``: one of :data:`~tpuslice.record.goodput.LOST_CAUSES`)."""
    _apply("goodput_seconds", seconds, {"category": category, "cause": cause})


def slice_seconds(state: str, pod_type: str, seconds: float) -> None:
    """Count slice-seconds spent in a state of :data:`~tpuslice.record.slice_seconds.TIME_USES`."""
    _apply("slice_seconds", seconds, {"state": state, "pod_type": pod_type})


def preempted(cause: str, tenant: str) -> None:
    """Count work the queue preempted, by ``cause`` (``quota``, ``priority``, or
    ``taken_back``: it outstayed its grace) and the work's tenant."""
    _apply("preemptions", 1.0, {"cause": cause, "tenant": tenant})


def tenant_values(
    held: Mapping[tuple[str, str], int],
    quota: Mapping[tuple[str, str], int],
    usage: Mapping[str, float],
) -> None:
    """Set the tenants' gauges: slices held and nominal quota per ``(tenant, pod type)``,
    decayed slice-seconds per tenant."""
    for (tenant, pod_type), count in held.items():
        tags = {"tenant": tenant, "pod_type": pod_type}
        _apply("tenant_slices", count, {**tags, "state": "held"})
        beyond = max(0, count - quota.get((tenant, pod_type), 0))
        _apply("tenant_slices", beyond, {**tags, "state": "borrowed"})
    for (tenant, pod_type), count in quota.items():
        _apply("tenant_slices", count, {"tenant": tenant, "pod_type": pod_type, "state": "quota"})
    for tenant, value in usage.items():
        _apply("tenant_usage", value, {"tenant": tenant})


def cluster_values(
    snapshot: ClusterSnapshot, known_pod_types: set[str] | None = None
) -> list[tuple[str, float, dict[str, str]]]:
    """``(metric name, value, tags)`` of each cluster gauge: every state of every pod type
    seen, zeros included so a state that empties reads 0, not its last value. Pod types go
    into ``known_pod_types``, kept at 0 once gone."""
    pod_types = known_pod_types if known_pod_types is not None else set()
    slices: dict[tuple[str, str], int] = {}
    hosts: dict[tuple[str, str], int] = {}
    for info in snapshot.slices.values():
        pod_types.add(info.pod_type)
        key = (info.state.value, info.pod_type)
        slices[key] = slices.get(key, 0) + 1
        for host in info.hosts.values():
            key = (_host_state(host), info.pod_type)
            hosts[key] = hosts.get(key, 0) + 1
    waiting = [r for r in snapshot.queued() if not r.granted]
    for request in waiting:
        pod_type = request.kind.split(" ")[0]
        pod_types.add(pod_type)
        key = ("queued", pod_type)
        slices[key] = slices.get(key, 0) + request.count[0]
    values: list[tuple[str, float, dict[str, str]]] = []
    for pod_type in sorted(pod_types):
        for state in SLICE_STATES:
            count = slices.get((state, pod_type), 0)
            values.append(("slices", float(count), {"state": state, "pod_type": pod_type}))
        for state in HOST_STATES:
            count = hosts.get((state, pod_type), 0)
            values.append(("hosts", float(count), {"state": state, "pod_type": pod_type}))
    values.append(("queue_length", float(len(waiting)), {}))
    return values


def _host_state(host: HostInfo) -> str:
    """A host's state for the gauges: a live host's notice, then suspicion, come first."""
    if host.alive and host.notice is not None:
        return "notice"
    if host.alive and host.suspect is not None:
        return "suspect"
    return host.state.value


class ClusterReporter:
    """Sets the cluster gauges every :data:`REPORT_S` from a daemon thread, from the
    snapshots ``read`` takes; ``on_report`` gets each from the second on, with the seconds
    since the last."""

    def __init__(self, read: Any, on_report: Callable[[ClusterSnapshot, float], None]) -> None:
        self._read = read
        self._on_report = on_report
        self._last: float | None = None
        self._pod_types: set[str] = set()
        self._thread = threading.Thread(target=self._loop, name="tpuslice-metrics", daemon=True)

    def start(self) -> None:
        """Start reporting."""
        self._thread.start()

    def report_once(self) -> None:
        """Read the cluster and set every gauge (errors are logged, not raised)."""
        try:
            snapshot = self._read()
        except Exception as exc:  # noqa: BLE001 - a reporter thread must not die
            logger.debug("cluster metrics not reported: %s", exc)
            return
        for name, value, tags in cluster_values(snapshot, self._pod_types):
            _apply(name, value, tags)
        now = time.monotonic()
        since, self._last = self._last, now
        if since is not None:
            try:
                self._on_report(snapshot, now - since)
            except Exception as exc:  # noqa: BLE001 - as the read above
                logger.debug("slice-seconds not counted: %s", exc)

    def _loop(self) -> None:
        while True:
            self.report_once()
            time.sleep(REPORT_S)
