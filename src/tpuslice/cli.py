"""``tpuslice`` command line: a thin layer over the library (click + rich).

Errors from the library become one red line and an exit code: 2 for bad input
(click's usage code), 1 for anything the cluster refused.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import click
import ray
from rich.console import Console
from rich.live import Live
from rich.table import Table

import tpuslice
from tpuslice import cluster, status
from tpuslice import topology as topo
from tpuslice.errors import InvalidArgumentError, TPUSliceError

console = Console()


class UsageError(click.UsageError):
    """A library ``ValueError`` shown as a click usage error (exit code 2)."""


def fail_on_bad_input(exc: InvalidArgumentError) -> UsageError:
    return UsageError(str(exc))


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
        raise fail_on_bad_input(exc) from exc
    for gen in gens:
        table = Table(
            title=f"{gen.name}: {gen.cores_per_chip} TensorCore(s)/chip, "
            f"pod type counts {gen.pod_type_counts}, {gen.dims}D",
            title_justify="left",
        )
        for column in ("topology", "chips", "hosts", "pod type", "head resource"):
            table.add_column(
                column,
                justify="right" if column in ("chips", "hosts") else "left",
                overflow="fold",
            )
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


def run_cli_errors(exc: TPUSliceError) -> click.ClickException:
    """Map a library error that is not bad input to a one-line exit-code-1 error."""
    return click.ClickException(str(exc))


# --- connecting to a running cluster ------------------------------------------------------

NO_CLUSTER_HINT = "start one with `tpuslice simulate`, or pass --address HOST:PORT"


class NoClusterError(click.ClickException):
    """There is no running Ray cluster to connect to (exit code 1)."""


def connect(address: str | None) -> bool:
    """Join a running Ray cluster: ``address``, else ``RAY_ADDRESS``, else one running on
    this machine. Never starts one. Returns whether this call connected, in which case
    the caller owns the ``ray.shutdown()`` (see :func:`connected`)."""
    if ray.is_initialized():
        return False
    target = address or os.environ.get("RAY_ADDRESS") or "auto"
    if target == "local":
        raise UsageError(
            "address 'local' would start a new Ray cluster; pass HOST:PORT of a running one, "
            "or leave --address out to find the one on this machine"
        )
    if target != "auto":
        _probe(target)
    try:
        # "auto" (not None): with no cluster found, None would start a new local one.
        ray.init(address=target, log_to_driver=False, logging_level=logging.WARNING)
    except ConnectionError as exc:  # Ray's "no running instance" / "failed to connect"
        where = "on this machine" if target == "auto" else f"at {target}"
        raise NoClusterError(f"no running Ray cluster {where}; {NO_CLUSTER_HINT}") from exc
    except ValueError as exc:  # a malformed address: the only argument the user gave
        raise UsageError(f"Ray address {target!r} is not valid: {exc}") from exc
    return True


def connect_or_none(address: str | None) -> bool | None:
    """Like :func:`connect`, but ``None`` (not an error) when no cluster is running and
    no address was given. An address that does not answer is still an error."""
    try:
        return connect(address)
    except NoClusterError:
        if address or os.environ.get("RAY_ADDRESS"):
            raise
        return None


def _probe(target: str, timeout: float = 3.0) -> None:
    """Fail fast when nothing listens at ``target`` (Ray itself retries for minutes)."""
    host, _, port = target.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"Ray address {target!r} is not valid: expected HOST:PORT")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as exc:
        raise NoClusterError(
            f"no running Ray cluster at {target} ({exc}); {NO_CLUSTER_HINT}"
        ) from exc


@contextmanager
def connected(address: str | None) -> Iterator[None]:
    """Be connected for the block; disconnect afterwards only if we connected."""
    ours = connect(address)
    try:
        yield
    finally:
        if ours:
            ray.shutdown()


# --- status ----------------------------------------------------------------------------------


def pause(seconds: float) -> None:
    """The wait between ``--watch`` refreshes (a seam for tests)."""
    time.sleep(seconds)


def watch(show: Callable[[], None], interval: float) -> None:
    """Call ``show`` now and then every ``interval`` seconds, until Ctrl-C."""
    while True:
        show()
        pause(interval)


@main.command(name="status")
@click.option(
    "--address",
    default=None,
    help="Ray cluster address (default: RAY_ADDRESS, else the cluster running on this machine).",
)
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
def status_command(
    address: str | None, as_json: bool, interval: float | None, tpu_resource_per_chip: int | None
) -> None:
    """Show every TPU slice: state, hosts and free TPUs, and each slice's host grid."""
    with connected(address):

        def read() -> cluster.ClusterSnapshot:
            return cluster.read_snapshot(tpu_resource_per_chip)

        if interval is None:
            _print_status(read(), as_json)
            return
        try:
            if as_json:
                watch(lambda: click.echo(json.dumps(status.status_dict(read()))), interval)
            else:
                _watch_live(read, interval)
        except KeyboardInterrupt:
            pass  # Ctrl-C is how a watch ends


def _print_status(snapshot: cluster.ClusterSnapshot, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(status.status_dict(snapshot), indent=2))
    else:
        console.print(status.render_status(snapshot, console.width))


def _watch_live(read: Callable[[], cluster.ClusterSnapshot], interval: float) -> None:
    """Redraw the status screen in place (rich Live) every ``interval`` seconds."""
    with Live(console=console, auto_refresh=False) as live:
        watch(
            lambda: live.update(status.render_status(read(), console.width), refresh=True),
            interval,
        )


def _register_job_commands() -> None:
    """``simulate``, ``run`` and ``demo`` live in :mod:`tpuslice.cli_jobs`."""
    from tpuslice.cli_jobs import register

    register(main)


_register_job_commands()


if __name__ == "__main__":
    main()
