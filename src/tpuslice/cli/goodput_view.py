"""What ``tpuslice goodput`` shows: a run's :class:`~tpuslice.record.goodput.Account`, or the
cluster's slice-seconds by state, as rich renderables. Pure: no Ray, no I/O.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from tpuslice.record.goodput import CATEGORIES, LOST_CAUSES, Account

__all__ = ["SINCE_UNITS", "render_account", "render_cluster"]

BAR_WIDTH = 60
"""Columns of the bar, when the console is at least that wide."""
CATEGORY_STYLES = {
    "queued": "black on cyan",
    "reserving": "white on blue",
    "starting": "black on yellow",
    "productive": "black on green",
    "checkpointing": "white on dark_green",
    "lost": "white on red",
    "recovering": "black on magenta",
    "handing_back": "white on grey37",
}
CATEGORY_GLYPHS = {
    "queued": "q",
    "reserving": "r",
    "starting": "s",
    "productive": "p",
    "checkpointing": "c",
    "lost": "x",
    "recovering": "~",
    "handing_back": "h",
}
"""Each bar cell is its category's glyph on its colour: the bar reads without colour too."""
STATE_STYLES = {
    "productive": "bold green",
    "busy": "bold yellow",
    "idle": "cyan",
    "broken": "bold red",
    "notice": "bold magenta",
}
SINCE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
"""``--since``'s units, in seconds."""
LEGEND_COLUMNS = 4


# --- one run ---------------------------------------------------------------------------


def bar_cells(seconds: Mapping[str, float], width: int = BAR_WIDTH) -> list[tuple[str, int]]:
    """How many cells of a ``width``-cell bar each category gets, in proportion to its
    seconds (largest remainders first) and at least one, so a short hand-back still shows.

    Args:
        seconds: Category -> seconds.
        width: Cells in the bar (raised to the number of categories shown, if fewer).

    Returns:
        ``(category, cells)`` for categories with time, in ``CATEGORIES`` order; cells sum to
        the width.
    """
    shown = [c for c in CATEGORIES if seconds.get(c, 0.0) > 0]
    total = sum(seconds[c] for c in shown)
    if not shown or not total > 0:
        return []
    width = max(width, len(shown))
    ideal = {c: seconds[c] / total * width for c in shown}
    cells = {c: max(1, math.floor(ideal[c])) for c in shown}
    # Ties go to the earlier category, so the bar is the same on every run.
    while sum(cells.values()) < width:
        most_short = max(shown, key=lambda c: (ideal[c] - cells[c], -shown.index(c)))
        cells[most_short] += 1
    while sum(cells.values()) > width:  # the one-cell minimums took more than rounding left
        spare = [c for c in shown if cells[c] > 1]
        least_short = max(spare, key=lambda c: (cells[c] - ideal[c], -shown.index(c)))
        cells[least_short] -= 1
    return [(c, cells[c]) for c in shown]


def _account_bar(account: Account, width: int) -> Text:
    """The run's wall time as one line of coloured cells."""
    cells = bar_cells(account.seconds, width)
    if not cells:
        return Text("(no time recorded)", style="dim")
    bar = Text()
    for category, count in cells:
        bar.append(CATEGORY_GLYPHS[category] * count, style=CATEGORY_STYLES[category])
    return bar


def _bar_legend(account: Account) -> Table:
    """Which glyph and colour is which category, for the categories in the bar."""
    legend = Table.grid(padding=(0, 2))
    shown = [c for c, _ in bar_cells(account.seconds)]
    for _ in shown[:LEGEND_COLUMNS]:
        legend.add_column()
    for start in range(0, len(shown), LEGEND_COLUMNS):
        legend.add_row(*(_chip(c) for c in shown[start : start + LEGEND_COLUMNS]))
    return legend


def _chip(category: str) -> Text:
    """`` p  productive``: a category's bar cell, then its name."""
    text = Text(f" {CATEGORY_GLYPHS[category]} ", style=CATEGORY_STYLES[category])
    text.append(f" {category}")
    return text


def _header(account: Account) -> Text:
    """The run (id, kind, request, outcome, attempts), then its wall time, start and goodput."""
    line = Text("run ")
    line.append(account.run_id, style="bold")
    line.append(f": {account.kind}")
    if account.what:
        line.append(f", {account.what}")
    line.append(", ")
    line.append(account.outcome, style="bold green" if account.outcome == "success" else "bold red")
    line.append(f" after {account.attempts} attempt(s)\n")
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(account.started_at))
    line.append(f"wall {wall_time(account.wall_s)} from {started}, ")
    line.append(f"{100 * account.goodput:.0f}% productive", style="bold")
    return line


def wall_time(seconds: float) -> str:
    """``12.3 s``, ``4 min 05 s``, ``2 h 03 min``: a length of time, for people.

    Args:
        seconds: The length.

    Returns:
        The text.
    """
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


def _account_table(account: Account) -> Table:
    """Every category's seconds and share of the wall time, lost seconds by cause, the wall."""
    table = Table(box=box.SIMPLE_HEAD)
    table.add_column("category")
    table.add_column("seconds", justify="right")
    table.add_column("share of wall", justify="right")
    for category in CATEGORIES:
        seconds = account.seconds.get(category, 0.0)
        table.add_row(
            _chip(category), *_amounts(seconds, account.wall_s), style=None if seconds else "dim"
        )
        if category != "lost":
            continue
        for cause in LOST_CAUSES:
            lost = account.lost.get(cause, 0.0)
            if lost > 0:
                table.add_row(f"      {cause}", *_amounts(lost, account.wall_s), style="dim")
    table.add_section()
    table.add_row("wall", *_amounts(account.wall_s, account.wall_s), style="bold")
    return table


def _amounts(seconds: float, whole: float) -> tuple[str, str]:
    share = 100 * seconds / whole if whole > 0 else 0.0
    return f"{seconds:,.1f}", f"{share:.1f}%"


def render_account(account: Account, width: int = 80) -> RenderableType:
    """The whole ``tpuslice goodput RUN_ID`` screen.

    Args:
        account: The run's account.
        width: The console's width: the bar is :data:`BAR_WIDTH` cells, or this if less.

    Returns:
        The header, the bar and its legend, the table, the account's other facts and notes.
    """
    parts: list[RenderableType] = [_header(account), Text()]
    parts += [_account_bar(account, min(BAR_WIDTH, width)), _bar_legend(account)]
    parts.append(_account_table(account))
    facts = [f"slices {', '.join(account.slices)}"] if account.slices else []
    facts.append(f"{account.checkpoints} checkpoint(s) marked")
    if account.job:
        facts.append(f"job {account.job}")
    parts.append(Text("; ".join(facts)))
    parts += [Text(f"note: {note}", style="dim") for note in account.notes]
    return Group(*parts)


# --- the cluster -----------------------------------------------------------------------


def since_label(seconds: float) -> str:
    """A window in the largest unit that divides it: ``3600`` -> ``1h``.

    Args:
        seconds: The window.

    Returns:
        The text, in ``--since``'s own form.
    """
    for unit, size in sorted(SINCE_UNITS.items(), key=lambda kv: -kv[1]):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def _slice_seconds_table(pod_type: str, by_state: Mapping[str, float]) -> Table:
    """One pod type's slice-seconds per state (``TIME_USES`` order first), shares and total."""
    from tpuslice.record.slice_seconds import TIME_USES

    total = sum(by_state.values())
    table = Table(title=pod_type or "(no pod type)", title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("state")
    table.add_column("slice-seconds", justify="right")
    table.add_column("share", justify="right")
    states = [*TIME_USES, *sorted(set(by_state) - set(TIME_USES))]
    for state in states:
        seconds = by_state.get(state, 0.0)
        share = 100 * seconds / total if total > 0 else 0.0
        label = Text(state, style=STATE_STYLES.get(state, "") if seconds else "dim")
        table.add_row(label, f"{seconds:,.0f}", f"{share:.1f}%", style=None if seconds else "dim")
    table.add_section()
    table.add_row("total", f"{total:,.0f}", "100.0%" if total > 0 else "0.0%", style="bold")
    return table


def render_cluster(
    slice_seconds: Mapping[str, Mapping[str, float]], since_s: float
) -> RenderableType:
    """The whole ``tpuslice goodput --cluster`` screen.

    Args:
        slice_seconds: Pod type -> state -> slice-seconds over the window.
        since_s: The window, in seconds.

    Returns:
        A table per pod type, a total line and what the states mean.
    """
    from tpuslice.record.slice_seconds import BUCKETS_KEPT_S

    window = since_label(since_s)
    if not slice_seconds:
        return Text(
            f"No slice-seconds counted on this cluster in the last {window}: the cluster's "
            "queue actor counts them at each report, and the first tpuslice reservation on a "
            "cluster starts it."
        )
    parts: list[RenderableType] = [Text(f"slice-seconds by state over the last {window}")]
    parts += [_slice_seconds_table(p, slice_seconds[p]) for p in sorted(slice_seconds)]
    total = sum(sum(by_state.values()) for by_state in slice_seconds.values())
    productive = sum(by_state.get("productive", 0.0) for by_state in slice_seconds.values())
    share = 100 * productive / total if total > 0 else 0.0
    parts.append(
        Text(
            f"total: {total:,.0f} slice-seconds over {len(slice_seconds)} pod type(s), "
            f"{share:.1f}% productive",
            style="bold",
        )
    )
    parts.append(
        Text(
            "productive: busy with a gang that sent heartbeats in the last report; busy: in "
            "use with no recent heartbeat (starting, saving, hung, or work that does not call "
            "tpuslice.heartbeat()); idle: every host free",
            style="dim",
        )
    )
    if since_s > BUCKETS_KEPT_S:
        parts.append(
            Text(
                f"the cluster keeps the last {since_label(BUCKETS_KEPT_S)} of slice-seconds: "
                "older time is not counted",
                style="dim",
            )
        )
    return Group(*parts)
