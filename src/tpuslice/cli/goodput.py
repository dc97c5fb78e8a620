"""``tpuslice goodput``: where one run's wall time went, or where the cluster's slice-seconds
went over a window (``--cluster``). :mod:`tpuslice.cli.goodput_view` draws it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

import click
from rich.console import Console

from tpuslice.cli import goodput_view as view
from tpuslice.cli.connect import UsageError, address_option, connected
from tpuslice.record import goodput
from tpuslice.record.goodput import Account

__all__ = ["goodput_command"]

console = Console()

SINCE_FORM = re.compile(rf"^(\d+)([{''.join(view.SINCE_UNITS)}])$")
SINCE_FORMS = "a whole number and a unit: 30s, 15m, 1h or 2d"
DEFAULT_SINCE_S = 3600.0
SHOWN_IDS = 5
"""How many run ids a refusal lists."""
NO_ACCOUNTS = (
    "no run has ended on this cluster yet, so there is no goodput account to show; runs keep "
    "an account when they end (run_resilient, run_on_slice, SliceActorGroup, tpuslice run)"
)


def _find_account(accounts: Sequence[Account], run_id: str | None) -> Account:
    """The newest account of the run with this id or unique prefix (``None``: the newest run).

    ``accounts`` are oldest first. A ClickException if there is none; a UsageError, naming
    run ids, if no run or several match.
    """
    if not accounts:
        raise click.ClickException(NO_ACCOUNTS)
    if run_id is None:
        return accounts[-1]
    exact = [a for a in accounts if a.run_id == run_id]
    matches = exact or [a for a in accounts if a.run_id.startswith(run_id)]
    ids = list(dict.fromkeys(a.run_id for a in reversed(matches)))
    if len(ids) == 1:
        return matches[-1]
    if ids:
        raise UsageError(
            f"run id prefix {run_id!r} matches {len(ids)} runs: {_listed(ids)}; give more of the id"
        )
    newest = list(dict.fromkeys(a.run_id for a in reversed(accounts)))
    raise UsageError(
        f"no run {run_id!r} among the {len(newest)} run(s) with a goodput account on this "
        f"cluster (newest first: {_listed(newest)}); `tpuslice goodput` with no argument "
        "shows the newest run"
    )


def _listed(ids: Sequence[str]) -> str:
    return ", ".join(ids[:SHOWN_IDS]) + (", ..." if len(ids) > SHOWN_IDS else "")


def _since_option(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """``--since`` in seconds: a whole number above 0 of a unit (``30s``, ``15m``, ``1h``)."""
    if value is None:
        return None
    match = SINCE_FORM.match(value.strip())
    if match is None or int(match[1]) == 0:
        raise click.BadParameter(f"{value!r} is not a window; give {SINCE_FORMS}")
    return float(int(match[1]) * view.SINCE_UNITS[match[2]])


@click.command(name="goodput")
@click.argument("run_id", required=False, metavar="[RUN_ID]")
@click.option(
    "--cluster",
    "whole_cluster",
    is_flag=True,
    help="Show the cluster's slice-seconds by state over a window instead of one run.",
)
@click.option(
    "--since",
    "since_s",
    default=None,
    callback=_since_option,
    metavar="WINDOW",
    help="With --cluster: the window, 30s, 15m, 1h or 2d (default 1h).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@address_option
def goodput_command(
    run_id: str | None,
    whole_cluster: bool,
    since_s: float | None,
    as_json: bool,
    address: str | None,
) -> None:
    """Show a run's goodput, or the cluster's.

    A run's account: where its wall time went (queued, reserving, starting, productive,
    checkpointing, lost, recovering, handing back), for RUN_ID (a run id or a unique
    prefix of one) or else the newest run that ended. With --cluster: the cluster's
    slice-seconds by state over the last --since."""
    if whole_cluster:
        if run_id is not None:
            raise UsageError(
                f"--cluster shows the whole cluster, not one run: drop {run_id!r} or drop --cluster"
            )
        _show_cluster(DEFAULT_SINCE_S if since_s is None else since_s, as_json, address)
        return
    if since_s is not None:
        raise UsageError("--since sets the window of --cluster: add --cluster, or drop --since")
    with connected(address):
        account = _find_account(goodput.read_accounts(), run_id)
    if as_json:
        click.echo(json.dumps(account.to_dict(), indent=2))
    else:
        console.print(view.render_account(account, console.width))


def _show_cluster(since_s: float, as_json: bool, address: str | None) -> None:
    """Read and show the cluster's slice-seconds by state over the last ``since_s``."""
    from tpuslice.record.slice_seconds import read_slice_seconds

    with connected(address):
        found = read_slice_seconds(since_s)
    if as_json:
        click.echo(json.dumps({"since_s": since_s, "slice_seconds": found}, indent=2))
    else:
        console.print(view.render_cluster(found, since_s))
