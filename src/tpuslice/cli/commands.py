"""``tpuslice`` command line: a thin layer over the library (click + rich).

Library errors become one red line and an exit code: 2 for bad input, 1 for a refusal.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import click
from rich.box import HEAVY_HEAD
from rich.console import Console, RenderableType
from rich.live import Live

import tpuslice
from tpuslice._reserve.queue import actor as queue_actor
from tpuslice._reserve.queue.agents import describe_errors, probe_owners
from tpuslice._tpu import topology as topo
from tpuslice._view import cluster, layouts
from tpuslice.cli import dashboard as cli_dashboard
from tpuslice.cli import goodput as cli_goodput
from tpuslice.cli import health as cli_health
from tpuslice.cli import jobs as cli_jobs
from tpuslice.cli import owners as cli_owners
from tpuslice.cli import quota as cli_quota
from tpuslice.cli import status
from tpuslice.cli.connect import UsageError, address_option, connected
from tpuslice.errors import InvalidArgumentError, QueueUnreachableError
from tpuslice.record import events

__all__ = ["main"]

console = Console()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(tpuslice.__version__, prog_name="tpuslice")
def main() -> None:
    """Run SPMD work on whole TPU slices with Ray (or on a simulated cluster)."""


@main.command()
@click.argument("generation", required=False)
def topologies(generation: str | None) -> None:
    """List valid slice shapes: chips, hosts, pod type and head resource.

    GENERATION may be any accepted spelling (v6e, TPU-V6E, v5e, tpu7x, ...).
    """
    try:
        gens = [topo.generation(generation)] if generation else list(topo.GENERATIONS.values())
    except InvalidArgumentError as exc:
        raise UsageError(str(exc)) from exc
    for gen in gens:
        title = (
            f"{gen.name}: {gen.cores_per_chip} TensorCore(s)/chip, "
            f"pod type counts {gen.pod_type_counts}, {gen.dims}D"
        )
        columns = ("topology", "chips", "hosts", "pod type", "head resource")
        table = status.new_table(title, columns, right=("chips", "hosts"), frame=HEAVY_HEAD)
        for name in gen.sorted_topologies():
            shape = topo.slice_shape(name, gen.name)
            table.add_row(
                name,
                str(shape.chips),
                str(shape.num_hosts),
                shape.pod_type,
                shape.head_resource,
            )
        console.print(table)


# --- status ----------------------------------------------------------------------------------


def pause(seconds: float) -> None:
    """The wait between ``--watch`` refreshes (a seam for tests).

    Args:
        seconds: How long to wait.
    """
    time.sleep(seconds)


def watch(show: Callable[[], None], interval: float) -> None:
    """Call ``show`` now and then every ``interval`` seconds, until Ctrl-C.

    Args:
        show: Draws one refresh.
        interval: Seconds between refreshes.
    """
    while True:
        show()
        pause(interval)


@main.command(name="status")
@address_option
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print JSON for scripts (one object per line with --watch).",
)
@click.option(
    "--watch",
    "interval",
    type=click.FloatRange(min=0.1),
    is_flag=False,
    flag_value=2.0,
    default=None,
    metavar="[SECONDS]",
    help="Refresh every SECONDS (default 2) until Ctrl-C.",
)
@click.option(
    "--tpu-resource-per-chip",
    type=click.IntRange(min=1),
    default=None,
    help="Ray TPU resource units per chip (default: RAY_TPU_RESOURCE_PER_CHIP or 1).",
)
@click.option(
    "--owners",
    is_flag=True,
    help="Ask every TPU host which process owns its TPU (pid, command, Ray job) and show it.",
)
@click.option(
    "--events",
    "event_count",
    type=click.IntRange(min=1, max=events.MAX_EVENTS),
    is_flag=False,
    flag_value=50,
    default=None,
    metavar="[N]",
    help="Show the last N (default 50) events of the slice timeline instead: reservations, "
    "waits, hand-backs, runs, notices, host losses and retries, from any driver.",
)
def status_command(
    address: str | None,
    as_json: bool,
    interval: float | None,
    tpu_resource_per_chip: int | None,
    owners: bool,
    event_count: int | None,
) -> None:
    """Show every TPU slice: state, hosts and free TPUs, and each slice's host grid."""
    if event_count is not None and (interval is not None or owners):
        raise click.UsageError("--events shows the timeline alone: drop --watch and --owners")
    with connected(address):
        if event_count is not None:
            history = events.read_events(event_count)
            if as_json:
                click.echo(json.dumps({"events": [e.to_dict() for e in history]}, indent=2))
            else:
                console.print(status.timeline_table(history))
            return

        def read() -> cluster.ClusterSnapshot:
            snapshot = cluster.read_snapshot(tpu_resource_per_chip)
            if owners:  # the agents record what they see; read again to show it
                _ask_owners(snapshot)
                snapshot = cluster.read_snapshot(tpu_resource_per_chip)
            return snapshot

        if interval is None:
            snapshot = read()
            if as_json:
                click.echo(json.dumps(_status_json(snapshot), indent=2))
            else:
                console.print(_render(snapshot))
                if owners:
                    console.print(status.owners_table(snapshot))
            return
        try:
            if as_json:
                watch(lambda: click.echo(json.dumps(_status_json(read()))), interval)
            else:
                with Live(console=console, auto_refresh=False) as live:
                    watch(lambda: live.update(_render(read()), refresh=True), interval)
        except KeyboardInterrupt:
            pass  # Ctrl-C is how a watch ends


def _ask_owners(snapshot: cluster.ClusterSnapshot) -> None:
    """Have every live TPU host's agent look for its TPU's owner now (they record it)."""
    nodes = [h.node_id for s in snapshot.slices.values() for h in s.hosts.values() if h.alive]
    with console.status(f"asking {len(nodes)} TPU host(s) who owns their TPU"):
        failed = describe_errors(probe_owners(nodes))
    for line in failed:
        console.print(f"[yellow]no answer from {line}[/yellow]")


def _status_json(snapshot: cluster.ClusterSnapshot) -> dict[str, object]:
    return status.status_dict(snapshot, layouts.load_all(snapshot))


def _render(snapshot: cluster.ClusterSnapshot) -> RenderableType:
    return status.render_status(snapshot, console.width, layouts.load_all(snapshot))


# --- queue -----------------------------------------------------------------------------------


@main.group(name="queue")
def queue_group() -> None:
    """The cluster's slice queue, which admits every whole-slice reservation."""


@queue_group.command(name="start")
@address_option
@click.option(
    "--timeout",
    type=float,
    default=queue_actor.START_WAIT_S,
    show_default=True,
    help="Seconds to wait for it to answer.",
)
def start_queue(address: str | None, timeout: float) -> None:
    """Start the queue if it is not running, and wait until it answers.

    A step of a cluster's set-up (after the head node starts): the first reservations
    then need not wait for it.
    """
    with connected(address):
        try:
            queue_actor.start_queue(timeout)
        except QueueUnreachableError as exc:
            raise click.ClickException(str(exc)) from exc
    console.print("the slice queue is running")


for _command in (
    cli_jobs.simulate,
    cli_jobs.run,
    cli_jobs.demo,
    cli_owners.release_tpu,
    cli_health.health_command,
    cli_goodput.goodput_command,
    cli_quota.quota_group,
    cli_dashboard.dashboard_command,
):
    main.add_command(_command)
