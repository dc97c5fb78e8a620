"""What ``tpuslice status`` shows: a :class:`ClusterSnapshot` as rich renderables or JSON.

Pure: no Ray, no I/O. A table of slices, then each slice's hosts as cells on its worker grid.
Text folds rather than elides, so an 80-column terminal still sees every word.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Container, Iterable, Iterator, Mapping
from dataclasses import asdict
from typing import Any

from rich import box
from rich.box import Box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from tpuslice._host.notices import Notice
from tpuslice._host.suspects import Suspect, duration
from tpuslice._tpu import subslice
from tpuslice._view.cluster import ClusterSnapshot, HostInfo, HostState, SliceInfo, SliceState
from tpuslice._view.queue_record import QueuedRequest
from tpuslice.record.events import SliceEvent

__all__ = [
    "new_table",
    "owners_table",
    "render_status",
    "request_reason",
    "shape_label",
    "status_dict",
    "subslice_dict",
    "summary_line",
    "timeline_table",
]

STATE_STYLES = {
    SliceState.READY: "bold green",
    SliceState.BUSY: "bold yellow",
    SliceState.BROKEN: "bold red",
    SliceState.NOTICE: "bold magenta",
    SliceState.SUSPECT: "bold dark_orange",
}
HOST_STYLES = {
    "free": "black on green",
    "busy": "black on yellow",
    "dead": "white on red",
    "suspect": "black on dark_orange",
    "missing": "dim",
}
COMPACT_GLYPHS = {"free": "o", "busy": "*", "dead": "x", "suspect": "!", "missing": "?"}
"""Cells of grids too wide to number: the glyph keeps the state readable without colour."""
MARKS = {**COMPACT_GLYPHS, "free": " "}
"""What follows the worker id in a numbered cell (``12*`` busy), for the same reason."""

GRID_INDENT = 2
MAX_GRID_LINES = 32
"""Taller grids are summarised, not drawn."""


def _num(value: float) -> str:
    """``16.0`` -> ``"16"``; fractional TPU amounts keep their decimals."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def new_table(
    title: str | None,
    columns: Iterable[str],
    right: Container[str] = (),
    frame: Box = box.SIMPLE_HEAD,
) -> Table:
    """A table titled on the left whose columns fold text rather than elide it.

    Args:
        title: The title, if any.
        columns: The column headers.
        right: The headers of right-justified columns.
        frame: The box style.

    Returns:
        The table, with no rows.
    """
    table = Table(title=title, title_justify="left", box=frame)
    for column in columns:
        table.add_column(column, justify="right" if column in right else "left", overflow="fold")
    return table


def _sorted_slices(snapshot: ClusterSnapshot) -> list[SliceInfo]:
    return [info for _, info in sorted(snapshot.slices.items())]


def _state_counts(snapshot: ClusterSnapshot) -> dict[str, int]:
    """Slices per state, every state present, in :class:`SliceState` order."""
    counts = Counter(info.state for info in snapshot.slices.values())
    return {state.value: counts[state] for state in SliceState}


def summary_line(snapshot: ClusterSnapshot) -> str:
    """``4 TPU slice(s): 2 ready, 1 busy, 1 broken``.

    Args:
        snapshot: The cluster as read.

    Returns:
        The one-line summary.
    """
    counts = _state_counts(snapshot)
    for shown_if_any in (SliceState.NOTICE, SliceState.SUSPECT):  # rare
        if not counts[shown_if_any.value]:
            del counts[shown_if_any.value]
    parts = ", ".join(f"{n} {state}" for state, n in counts.items())
    return f"{len(snapshot.slices)} TPU slice(s): {parts}"


def state_label(info: SliceInfo) -> str:
    """The slice's state as shown; a slice under notice shows ``PREEMPTING`` or ``MAINTENANCE``.

    Args:
        info: One slice.

    Returns:
        The label.
    """
    notice = info.notice
    if info.state is SliceState.NOTICE and notice is not None:
        return notice.state
    return info.state.value


def shape_label(info: SliceInfo) -> str:
    """How a slice's shape is shown.

    Args:
        info: One slice.

    Returns:
        ``v6e 4x4``; the raw labels (or ``?``) when they name no valid shape.
    """
    if info.shape is not None:
        return f"{info.shape.generation.name} {info.topology}"
    return f"{info.pod_type or '?'} {info.topology or '?'}"


def slice_table(snapshot: ClusterSnapshot) -> Table:
    """One row per slice: name, shape, state, reason, hosts alive/expected, TPU free/total.

    Args:
        snapshot: The cluster as read.

    Returns:
        The table, titled with :func:`summary_line`, slices in name order.
    """
    columns = ("slice", "shape", "state", "reason", "hosts", "TPU free")
    table = new_table(summary_line(snapshot), columns, right=("hosts", "TPU free"))
    for info in _sorted_slices(snapshot):
        table.add_row(
            info.name,
            shape_label(info),
            Text(state_label(info), style=STATE_STYLES[info.state]),
            info.reason,
            f"{info.alive_hosts}/{info.expected_hosts}",
            f"{_num(info.chips_free)}/{_num(info.chips_total)}",
        )
    return table


def host_state(host: HostInfo | None) -> str:
    """``free``, ``busy``, ``dead``, ``suspect`` (alive, failed a run lately) or ``missing``.

    Args:
        host: The host of a worker id, or None if no node has it.

    Returns:
        The state's name, a key of :data:`HOST_STYLES`.
    """
    if host is None:
        return "missing"
    if host.alive and host.suspect is not None:
        return "suspect"
    return host.state.value


def grid_rows(info: SliceInfo, physical: Mapping[int, int] | None = None) -> list[list[int]]:
    """Worker ids on the worker grid: rows are the leading sides flattened, columns the last.

    A slice with no usable shape is one row.

    Args:
        info: One slice.
        physical: Each worker's physical position, if known (a sub-slice is then a box).

    Returns:
        Rows of worker ids; every expected and every found worker id appears once.
    """
    shape = info.shape
    if shape is None or any(w >= shape.num_hosts for w in info.hosts):
        return [sorted(set(range(info.expected_hosts)) | set(info.hosts))]
    at = {p: w for w, p in (physical or {}).items()}
    if sorted(at) != list(range(shape.num_hosts)):
        at = {w: w for w in range(shape.num_hosts)}
    cols = shape.worker_grid[-1]
    rows: list[list[int]] = [[] for _ in range(shape.num_hosts // cols)]
    for position in range(shape.num_hosts):
        worker = at[position]
        coords = shape.worker_coords(position)
        row = 0
        for side, coord in zip(shape.worker_grid[:-1], coords[:-1], strict=True):
            row = row * side + coord
        rows[row].append(worker)
    return rows


def _cells(info: SliceInfo, workers: list[int], compact: bool, digits: int) -> Iterator[Text]:
    for worker in workers:
        state = host_state(info.hosts.get(worker))
        text = COMPACT_GLYPHS[state] if compact else f" {worker:>{digits}}{MARKS[state]}"
        yield Text(text, style=HOST_STYLES[state])


def subslice_summary(info: SliceInfo, physical: Mapping[int, int]) -> str:
    """How many sub-slices of each shape are free: ``sub-slices: 2x2 3/4 free, 2x4 1/2 free``.

    Args:
        info: One slice whose layout is known.
        physical: Each worker's physical position.

    Returns:
        One line, empty if the slice has no sub-slices.
    """
    topologies = subslice_dict(info, physical)["topologies"]
    parts = [f"{sub} {len(t['free'])}/{len(t['members'])} free" for sub, t in topologies.items()]
    return f"sub-slices: {', '.join(parts)}" if parts else ""


def host_grid(info: SliceInfo, width: int, physical: Mapping[int, int] | None = None) -> Text:
    """The slice's hosts as coloured cells on its worker grid.

    Cells show worker ids when they fit in ``width``, else one glyph each; rows wrap. A grid
    taller than :data:`MAX_GRID_LINES` becomes a one-line tally.

    Args:
        info: One slice.
        width: Columns available, indent included.
        physical: Each worker's physical position, if known.

    Returns:
        The grid (or tally) as styled text.
    """
    rows = grid_rows(info, physical)
    digits = len(str(max((w for row in rows for w in row), default=0)))
    room = max(1, width - GRID_INDENT)
    widest = max((len(row) for row in rows), default=0)
    compact = widest * (digits + 3) - 1 > room
    per_line = max(1, (room + 1) // (2 if compact else digits + 3))
    if sum(math.ceil(len(row) / per_line) for row in rows) > MAX_GRID_LINES:
        return Text(" " * GRID_INDENT + f"{_tally(info, rows)} (too many hosts to draw)")
    lines: list[Text] = []
    for row in rows:
        for start in range(0, len(row), per_line):
            line = Text(" " * GRID_INDENT)
            line.append(
                Text(" ").join(_cells(info, row[start : start + per_line], compact, digits))
            )
            lines.append(line)
    return Text("\n").join(lines)


def _tally(info: SliceInfo, rows: list[list[int]]) -> str:
    """``1436 free, 100 busy``: hosts per state, in legend order."""
    counts = Counter(host_state(info.hosts.get(worker)) for row in rows for worker in row)
    return ", ".join(f"{counts[state]} {state}" for state in HOST_STYLES if counts[state])


def _slice_heading(info: SliceInfo) -> Text:
    """``v6e-16-a  v6e 4x4, 4 hosts (2x2)  busy``: the line above a slice's grid."""
    heading = Text(info.name, style="bold")
    grid = ""
    if info.shape is not None and info.shape.num_hosts > 1:
        grid = f" ({'x'.join(map(str, info.shape.worker_grid))})"
    heading.append(f"  {shape_label(info)}, {info.expected_hosts} host(s){grid}  ")
    heading.append(state_label(info), style=STATE_STYLES[info.state])
    return heading


def _suspect_line(record: Suspect, now: float) -> Text:
    """``host 1 (node 4f2a...) suspect: hang, 9 min left; <evidence>``, under its grid."""
    line = (
        f"host {record.worker_id} (node {record.node_id[:12]}) suspect: "
        f"{record.reason.value}, {duration(record.left(now))} left"
    )
    if record.evidence:
        line += f"; {record.evidence}"
    return Text(" " * GRID_INDENT + line, style="dark_orange")


def legend() -> Text:
    """Which colour (and, in compact grids, which glyph) means which host state.

    Returns:
        The one-line legend.
    """
    text = Text("hosts:")
    for state, style in HOST_STYLES.items():
        text.append(" ")
        text.append(f" {COMPACT_GLYPHS[state]} ", style=style)
        text.append(f" {state}")
    return text


def render_status(
    snapshot: ClusterSnapshot,
    width: int = 80,
    layouts: Mapping[str, Mapping[int, int]] | None = None,
) -> RenderableType:
    """The whole ``tpuslice status`` screen for a console ``width`` columns wide.

    Args:
        snapshot: The cluster as read.
        width: The console's width in columns.
        layouts: Per slice, each worker's physical position where known.

    Returns:
        The table, each slice's heading and grid, the legend and the queue.
    """
    if not snapshot.slices:
        return Text("No TPU slices in this cluster (no node has TPU labels or resources).")
    parts: list[RenderableType] = [slice_table(snapshot)]
    for info in _sorted_slices(snapshot):
        physical = (layouts or {}).get(info.name)
        parts += [_slice_heading(info), host_grid(info, width, physical)]
        parts += [_suspect_line(s, snapshot.taken_at) for s in info.suspects]
        if physical:
            parts.append(Text(" " * GRID_INDENT + subslice_summary(info, physical)))
    parts.append(legend())
    queue = _queue_table(snapshot)
    if queue is not None:
        parts.append(queue)
    return Group(*parts)


def _queue_table(snapshot: ClusterSnapshot) -> Table | None:
    """The cluster's queue, one row per waiting request in serving order; None if empty."""
    waiting = snapshot.queued()
    if not waiting:
        return None
    tenants = any(r.tenant for r in waiting)
    columns = ("#", "priority", *(("tenant",) if tenants else ()), "wants", "waited", "driver")
    title = f"queue: {len(waiting)} request(s) waiting"
    table = new_table(title, (*columns, "why"), right=("#", "priority", "waited"))
    for request in waiting:
        table.add_row(
            str(request.position),
            str(request.priority),
            *((request.tenant or "-",) if tenants else ()),
            f"{request.wanted} x {request.kind}",
            f"{max(0.0, snapshot.taken_at - request.since):.0f} s",
            request.who,
            request_reason(request),
        )
    return table


def request_reason(request: QueuedRequest) -> str:
    """Why a request waits, or the slices granted to it and not yet claimed.

    Args:
        request: One request in the queue.

    Returns:
        The text status shows.
    """
    return f"granted {', '.join(request.granted)}" if request.granted else request.reason


# --- JSON --------------------------------------------------------------------------------


def _host_dict(host: HostInfo, now: float) -> dict[str, Any]:
    notice, suspect = host.notice, host.suspect
    return {
        "worker_id": host.worker_id,
        "node_id": host.node_id,
        "address": host.address,
        "alive": host.alive,
        "state": host.state.value,
        "tpu_total": host.tpu_total,
        "tpu_available": host.tpu_available,
        "head_free": host.head_free,
        "tpu_owner": host.tpu_owner,
        "notice": None if notice is None else _notice_dict(notice),
        "suspect": None if suspect is None else _suspect_dict(suspect, now),
    }


def _suspect_dict(record: Suspect, now: float) -> dict[str, Any]:
    left = round(record.left(now), 1)
    return {**asdict(record), "reason": record.reason.value, "left_s": left}


def _notice_dict(notice: Notice) -> dict[str, Any]:
    return {
        "kind": notice.kind,
        "state": notice.state,
        "event": notice.event,
        "since": notice.since,
        "deadline": notice.deadline,
        "left_s": round(notice.left(time.time()), 1),
    }


def _slice_dict(info: SliceInfo, now: float) -> dict[str, Any]:
    """One slice and its hosts; shape fields are None when the labels name no valid shape."""
    shape = info.shape
    return {
        "name": info.name,
        "state": info.state.value,
        "shown_state": state_label(info),
        "reason": info.reason,
        "generation": info.generation,
        "pod_type": info.pod_type,
        "topology": info.topology,
        "chips_per_host": shape.chips_per_host if shape else None,
        "worker_grid": list(shape.worker_grid) if shape else None,
        "expected_hosts": info.expected_hosts,
        "alive_hosts": info.alive_hosts,
        "busy_hosts": info.busy_hosts,
        "idle": info.idle,
        "missing_workers": info.missing_workers,
        "tpu_total": info.chips_total,
        "tpu_available": info.chips_free,
        "suspects": [_suspect_dict(s, now) for s in info.suspects],
        "hosts": [_host_dict(h, now) for h in info.hosts.values()],
    }


def status_dict(
    snapshot: ClusterSnapshot, layouts: Mapping[str, Mapping[int, int]] | None = None
) -> dict[str, Any]:
    """Everything the screen shows, as JSON-able data for scripts (``--json``).

    Args:
        snapshot: The cluster as read.
        layouts: Each slice's physical layout, where known (adds its ``subslices``).

    Returns:
        ``taken_at``, counts per state, every slice in name order, and the waiting ``queue``.
    """
    slices = []
    for info in _sorted_slices(snapshot):
        entry = _slice_dict(info, snapshot.taken_at)
        physical = (layouts or {}).get(info.name)
        if physical is not None:
            entry["subslices"] = subslice_dict(info, physical)
        slices.append(entry)
    queue = [
        {**r.to_dict(), "waited_s": max(0.0, snapshot.taken_at - r.since)}
        for r in snapshot.queued()
    ]
    return {
        "taken_at": snapshot.taken_at,
        "counts": _state_counts(snapshot),
        "slices": slices,
        "queue": queue,
    }


def subslice_dict(info: SliceInfo, physical: Mapping[int, int]) -> dict[str, Any]:
    """Where each worker sits, and its sub-slices.

    Args:
        info: One slice.
        physical: Its worker id -> physical position.

    Returns:
        ``physical`` and, per sub-topology, Ray's index -> workers and the free indices.
    """
    topologies = {}
    for sub in subslice.subslice_topologies(info.topology):
        found = subslice.members(physical, info.topology, sub)
        free = [i for i, workers in found.items() if all(_free(info, w) for w in workers)]
        topologies[sub] = {"members": {str(i): ws for i, ws in found.items()}, "free": free}
    return {"physical": {str(w): p for w, p in sorted(physical.items())}, "topologies": topologies}


def _free(info: SliceInfo, worker: int) -> bool:
    """Whether a worker's host is there and free (suspect or not)."""
    host = info.hosts.get(worker)
    return host is not None and host.state is HostState.FREE


def owners_table(snapshot: ClusterSnapshot) -> RenderableType:
    """Which process owns each host's TPU, for hosts where one was seen.

    Args:
        snapshot: The cluster, with the owners its hosts' agents recorded.

    Returns:
        A table, or a line saying no TPU is owned.
    """
    rows = [
        (info.name, str(worker), host.node_id[:12], host.tpu_owner)
        for info in _sorted_slices(snapshot)
        for worker, host in info.hosts.items()
        if host.tpu_owner
    ]
    if not rows:
        return Text("No process owns a TPU on any live host.")
    table = new_table("TPU owners", ("slice", "worker", "node", "owner"))
    for row in rows:
        table.add_row(*row)
    return table


def timeline_table(events: list[SliceEvent]) -> RenderableType:
    """The recent history of reservations and runs, oldest first.

    Args:
        events: From :func:`tpuslice.record.events.read_events`.

    Returns:
        A table, or a line saying there is no history.
    """
    if not events:
        return Text("No events recorded on this cluster yet.")
    now = time.time()
    table = new_table("Slice timeline", ("time", "ago", "event", "job"))
    for event in events:
        clock = time.strftime("%H:%M:%S", time.localtime(event.at))
        table.add_row(clock, _ago(now - event.at), event.describe(), event.job)
    return table


def _ago(seconds: float) -> str:
    if seconds < 90:
        return f"{max(0, round(seconds))} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"
