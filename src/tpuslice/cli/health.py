"""``tpuslice health``: check slices' hosts now, or trust a slice again by hand.

A failed host keeps its slice suspect until its cool-down ends or a check passes;
``--clear`` trusts it at once, and ``--cooldown`` sets the cool-down for the cluster.
"""

from __future__ import annotations

import json
from dataclasses import asdict

import click
from rich.console import Console
from rich.markup import escape

from tpuslice._run.health import SliceHealth, check_slice
from tpuslice._view import cluster
from tpuslice.cli.connect import UsageError, address_option, connected
from tpuslice.errors import InvalidArgumentError, ReservationTimeoutError

__all__ = ["health_command"]

console = Console()


def _pick(snapshot: cluster.ClusterSnapshot, names: tuple[str, ...], every: bool) -> list[str]:
    """The slices named, or with ``--all`` every slice with a shape; a UsageError listing the
    slices if a name is not one, or if neither or both were given."""
    if bool(names) == every:
        raise UsageError("name the slices to check, or give --all (not both)")
    known = sorted(n for n, s in snapshot.slices.items() if s.shape is not None)
    if every:
        return known
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(
            f"no slice {', '.join(map(repr, unknown))}; slices: {', '.join(known) or 'none'}"
        )
    return list(names)


@click.command(name="health")
@click.argument("slices", nargs=-1, metavar="[SLICE]...")
@click.option("--all", "every", is_flag=True, help="Check every slice (busy ones are skipped).")
@click.option(
    "--clear",
    is_flag=True,
    help="Trust the named slices again now (delete their suspect records); no check runs.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="Seconds to wait for a named slice to be idle.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the verdicts as JSON.")
@click.option(
    "--cooldown",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="SECONDS",
    help="Set how long hosts marked suspect from now on stay suspect, for the whole "
    "cluster (default 600); give it alone: no check runs.",
)
@address_option
def health_command(
    slices: tuple[str, ...],
    every: bool,
    clear: bool,
    timeout: float,
    as_json: bool,
    cooldown: float | None,
    address: str | None,
) -> None:
    """Check every host of SLICE (answers, TPU starts, peers reach rank 0), record the
    verdict for the whole cluster, and exit 1 if a host failed."""
    from tpuslice._reserve.suspects import clear_slice

    if cooldown is not None:
        if slices or every or clear:
            raise UsageError("--cooldown sets the cluster's cool-down: give it alone")
        _set_cooldown(cooldown, address)
        return
    with connected(address):
        snapshot = cluster.read_snapshot()
        names = _pick(snapshot, slices, every)
        if clear:
            if every:
                raise UsageError("--clear needs the slices named, not --all")
            for name in names:
                cleared = clear_slice(name, "tpuslice health --clear")
                hosts = ", ".join(str(r.worker_id) for r in cleared) or "none was suspect"
                console.print(f"{name}: trusted again (hosts: {hosts})")
            return
        results, skipped = _check_all(snapshot, names, timeout, every)
    if as_json:
        out = {"slices": [_to_dict(r) for r in results], "skipped": skipped}
        click.echo(json.dumps(out, indent=2))
    else:
        for result in results:
            style = "green" if result.ok else "red"
            console.print(f"[{style}]{escape(result.describe())}[/{style}]")
        for name, why in skipped.items():
            console.print(f"[yellow]{name}: not checked: {escape(why)}[/yellow]")
    if not all(r.ok for r in results):
        raise SystemExit(1)


def _set_cooldown(seconds: float, address: str | None) -> None:
    """Set the cluster's suspect cool-down and say what it was."""
    from tpuslice._host import suspects

    try:
        suspects.check_cooldown(seconds)
    except InvalidArgumentError as exc:
        raise UsageError(str(exc)) from exc
    with connected(address):
        before = suspects.cooldown()
        suspects.set_cooldown(seconds)
    console.print(
        f"hosts marked suspect from now on stay suspect for {seconds:g} s "
        f"(was {before:g} s); hosts already suspect keep their end time"
    )


def _check_all(
    snapshot: cluster.ClusterSnapshot, names: list[str], timeout: float, every: bool
) -> tuple[list[SliceHealth], dict[str, str]]:
    """Check the slices in turn; return the verdicts and, with why, the slices not checked.

    With ``--all`` a busy slice is skipped (a check must not wait behind work); a named one
    is waited for.
    """
    results: list[SliceHealth] = []
    skipped: dict[str, str] = {}
    for name in names:
        info = snapshot.slices[name]
        if every and not info.idle:
            skipped[name] = f"{info.state.value}: {info.reason}" if info.reason else "busy"
            continue
        with console.status(f"checking {name} ({len(info.hosts)} host(s))"):
            try:
                results.append(check_slice(name, timeout_s=timeout))
            except ReservationTimeoutError as exc:
                skipped[name] = f"not idle within {timeout:g} s: {exc}"
    return results, skipped


def _to_dict(result: SliceHealth) -> dict[str, object]:
    return {
        "slice": result.slice_name,
        "ok": result.ok,
        "seconds": round(result.seconds, 3),
        "hosts": [asdict(h) for h in result.hosts],
    }
