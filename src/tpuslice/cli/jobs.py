"""The CLI commands that start or use clusters: ``simulate``, ``run`` and ``demo``.

All three are thin: the work is in the simulator, :mod:`tpuslice._run.shell` and
:mod:`tpuslice._run.run`.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

import click
import ray
from rich.box import HEAVY_HEAD
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tpuslice._host.context import HostContext, current_host
from tpuslice._reserve.groups import live_placement_groups
from tpuslice._reserve.observe import describe_request
from tpuslice._reserve.request import SliceRequest
from tpuslice._reserve.reserve import SliceHandle
from tpuslice._run import observe
from tpuslice._run.observe import AttemptEvent, Outcome
from tpuslice._run.resilient import GangBrokenError, ResilientRun, RetryPolicy, judged
from tpuslice._run.run import run_on_slice
from tpuslice._run.shell import HostResult, program_name, run_command, worst_exit_code
from tpuslice._run.watchdog import AttemptWatch
from tpuslice._sim.simulated import SimulatedCluster, SliceSpec
from tpuslice._tpu._connection import close_connection
from tpuslice._tpu.compat import DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S
from tpuslice._view import cluster
from tpuslice._view.quotas import check_tenant
from tpuslice.cli import status
from tpuslice.cli.connect import UsageError, address_option, connect_or_none
from tpuslice.cli.waiting import WaitLine, in_cli_terms
from tpuslice.errors import InvalidArgumentError, RetriesExhaustedError, TPUSliceError
from tpuslice.record import events

__all__ = ["demo", "run", "simulate"]

console = Console()
err_console = Console(stderr=True)


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C for the block, so both clean up the same way."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _start_simulator(specs: list[SliceSpec], *, auth: bool = False) -> SimulatedCluster:
    """Start a SimulatedCluster (not connected), showing its progress on stderr."""
    total = sum(spec.shape().num_hosts * spec.count for spec in specs)
    with err_console.status(f"starting a simulated cluster ({total} TPU hosts)") as spinner:

        def progress(message: str) -> None:
            spinner.update(f"{escape(message)} [dim](of {total} TPU hosts)[/dim]")

        sim = SimulatedCluster(specs, auth=auth, progress=progress)
        sim.start()
    err_console.print(
        f"[green]simulated cluster ready[/green] in {sim.startup_seconds:.1f} s: "
        f"{', '.join(sim.slices)}"
    )
    return sim


def _parse_specs(texts: tuple[str, ...], default: str) -> list[SliceSpec]:
    """The validated ``--slices`` values (``default`` if none); a UsageError if one is bad."""
    try:
        specs = [SliceSpec.parse(t) for t in (texts or (default,))]
        for spec in specs:
            spec.shape()
    except InvalidArgumentError as exc:
        raise click.UsageError(str(exc)) from exc
    return specs


# --- simulate ----------------------------------------------------------------------------


@click.command()
@click.option(
    "--slices",
    "slice_texts",
    multiple=True,
    metavar="GEN:TOPOLOGY[:COUNT[:CHIPS_PER_VM]]",
    help="Slices to simulate (repeatable). Default: v6e:4x4:2.",
)
@click.option(
    "--auth",
    is_flag=True,
    help="Require Ray's token authentication; prints what a driver must set.",
)
def simulate(slice_texts: tuple[str, ...], auth: bool) -> None:
    """Start a simulated TPU cluster in the foreground; Ctrl-C stops it."""
    specs = _parse_specs(slice_texts, "v6e:4x4:2")
    with sigterm_as_interrupt():
        sim = _start_simulator(specs, auth=auth)
        try:
            console.print(f"address: [bold]{sim.address}[/bold]")
            if sim.auth_env:
                settings = " ".join(f"{k}={shlex.quote(v)}" for k, v in sim.auth_env.items())
                console.print(f"token:   [bold]export {escape(settings)}[/bold]", soft_wrap=True)
            console.print(f'connect: [bold]ray.init(address="{sim.address}")[/bold]')
            console.print(f"status:  [bold]tpuslice status --address {sim.address}[/bold]")
            console.print(f"web:     [bold]tpuslice dashboard --address {sim.address}[/bold]")
            sim.connect()
            _status_line_until_interrupted()
        except KeyboardInterrupt:
            pass
        finally:
            err_console.print("shutting down the simulated cluster ...")
            sim.shutdown()
            err_console.print("[green]stopped[/green]: no Ray process of ours is left")


def _status_line_until_interrupted() -> None:
    with err_console.status("") as line:
        while True:
            line.update(
                f"{status.summary_line(cluster.read_snapshot())}; "
                f"{len(live_placement_groups())} placement group(s) — Ctrl-C to stop"
            )
            time.sleep(1.0)


# --- run ---------------------------------------------------------------------------------


def _slice_count(ctx: click.Context, param: click.Parameter, value: str) -> int | tuple[int, int]:
    """``--slices``: ``N`` (an int) or ``MIN..MAX`` (a tuple), with 1 <= MIN <= MAX."""
    text = value.strip()
    low, sep, high = text.partition("..")
    try:
        bounds = (int(low), int(high)) if sep else (int(text), int(text))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not N or MIN..MAX (e.g. 2 or 1..4)") from None
    if not 1 <= bounds[0] <= bounds[1]:
        raise click.BadParameter(f"{text!r}: need 1 <= MIN <= MAX")
    return bounds if sep else bounds[0]


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--topology", required=True, help="Slice topology, e.g. 4x4.")
@click.option("--accelerator", required=True, help="TPU generation, e.g. v6e.")
@click.option(
    "--slices",
    "num_slices",
    default="1",
    callback=_slice_count,
    metavar="N|MIN..MAX",
    show_default=True,
    help="Slices: N, or MIN..MAX to take as many as are idle (at least MIN).",
)
@address_option
@click.option("--simulate", is_flag=True, help="Without a cluster, start a simulated one.")
@click.option(
    "--timeout",
    default=DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S,
    type=click.FloatRange(min=0),
    show_default=True,
    help="Seconds to wait for idle slices.",
)
@click.option(
    "--retries",
    default=0,
    type=click.IntRange(min=0),
    show_default=True,
    help="Rerun the whole gang on fresh slices up to N times after a host loss or a failure.",
)
@click.option(
    "--priority",
    default=0,
    type=int,
    show_default=True,
    help="Place in the cluster's queue when slices are short: higher first.",
)
@click.option(
    "--tenant",
    default=None,
    help="Whom the slices are charged to, for quotas and fair share "
    "[default: $TPUSLICE_TENANT, else your user name].",
)
@click.option(
    "--preemptible",
    is_flag=True,
    help="Whether the cluster's queue may preempt the run, with notice, for higher "
    "priority or a tenant taking back its quota.",
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(
    topology: str,
    accelerator: str,
    num_slices: int | tuple[int, int],
    address: str | None,
    simulate: bool,
    timeout: float,
    retries: int,
    priority: int,
    tenant: str | None,
    preemptible: bool,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND on every host of N slices (--slices); exit with the worst exit code.

    Example: tpuslice run --topology 4x4 --accelerator v6e -- hostname
    """
    try:
        most = num_slices[1] if isinstance(num_slices, tuple) else num_slices
        shape_spec = SliceSpec(accelerator, topology, most)
        shape_spec.shape()
        if tenant is not None:
            check_tenant(tenant)
    except InvalidArgumentError as exc:
        raise UsageError(str(exc)) from exc
    sim = None
    with sigterm_as_interrupt():
        ours = connect_or_none(address)
        try:
            if ours is None:
                sim = _offer_simulator(shape_spec, simulate)
                sim.connect()
            request = SliceRequest.for_run(
                topology, accelerator, num_slices, None, timeout, priority, tenant, preemptible
            )
            code = _run_everywhere(request, command, retries)
        except KeyboardInterrupt:
            err_console.print("[yellow]interrupted[/yellow]: commands cancelled, slices freed")
            code = 130
        finally:
            events.flush()  # the timeline outlives this driver
            if sim is not None:
                sim.shutdown()
            elif ours:
                close_connection()
                ray.shutdown()
    sys.exit(code)


def _offer_simulator(spec: SliceSpec, simulate: bool) -> SimulatedCluster:
    if not simulate and not (
        sys.stdin.isatty()
        and click.confirm("No Ray cluster is running. Start a simulated one?", err=True)
    ):
        raise click.ClickException(
            "no running Ray cluster; pass --simulate to start a simulated one, "
            "start one with `tpuslice simulate`, or pass --address"
        )
    return _start_simulator([spec])


def _run_everywhere(request: SliceRequest, command: tuple[str, ...], retries: int) -> int:
    """Run the command through the resilient-run loop; print the last attempt's exit codes
    and return the worst."""
    # One argument is a shell command line (as with gcloud --command); several are argv.
    text = command[0] if len(command) == 1 else shlex.join(command)
    last: list[HostResult] = []

    def attempt(spg: SliceHandle, watch: AttemptWatch) -> list[HostResult]:
        last[:] = run_command(spg, text, _print_line())
        _raise_if_broken(spg, last, watch)
        return last

    policy = RetryPolicy(max_retries_failure=retries, max_retries_preemption=retries)
    waiting = WaitLine(
        err_console, describe_request(request)[0], request.head_reservation_timeout_s
    )

    def on_event(event: AttemptEvent) -> None:
        if event.kind == "started":
            waiting.stop()  # the commands' own output follows
        if retries:
            err_console.print(f"[yellow]{escape(event.describe())}[/yellow]")

    started, outcome = time.monotonic(), "failure"
    try:
        try:
            with waiting:
                ResilientRun(attempt, request, policy, on_event, kind="command").until_done()
        except RetriesExhaustedError as exc:
            if retries:
                err_console.print(f"[red]{escape(in_cli_terms(str(exc)))}[/red]")
        except TPUSliceError as exc:
            raise click.ClickException(in_cli_terms(str(exc))) from exc
        if not worst_exit_code(last):
            outcome = "success"
    except KeyboardInterrupt:
        outcome = "interrupted"
        raise
    finally:
        if last:  # commands ran (not, say, a reservation that timed out)
            slices = list(dict.fromkeys(r.context.slice_name for r in last))
            seconds = time.monotonic() - started
            observe.run_ended("command", outcome, seconds, slices, program_name(text))
    console.print(_summary(last))
    return worst_exit_code(last)


def _raise_if_broken(spg: SliceHandle, results: list[HostResult], watch: AttemptWatch) -> None:
    """Raise GangBrokenError for a lost host (judged by the watch's evidence) or a non-zero
    exit code: the resilient loop's signal to retry."""
    for result in results:
        if result.exception is not None:
            broken = GangBrokenError.from_task(spg, result.context.rank, result.exception)
            raise judged(broken, watch)
    worst = worst_exit_code(results)
    if worst:
        ranks = [r.context.rank for r in results if r.exit_code]
        raise GangBrokenError(Outcome.FAILURE, f"exit code {worst} (ranks {ranks})")


def _print_line() -> Callable[[HostContext, str], None]:
    lock = threading.Lock()

    def show(context: HostContext, line: str) -> None:
        with lock:
            console.print(
                f"[cyan]{escape(f'[{context.slice_name}/{context.worker_id}]')}[/cyan] "
                f"{escape(line)}",
                highlight=False,
                soft_wrap=True,
            )

    return show


def _summary(results: list[HostResult]) -> Table:
    columns = ("rank", "slice", "worker", "exit", "seconds", "error")
    table = status.new_table("exit codes", columns, frame=HEAVY_HEAD)
    for r in results:
        colour = "green" if r.exit_code == 0 else "red"
        table.add_row(
            str(r.context.rank),
            r.context.slice_name,
            str(r.context.worker_id),
            f"[{colour}]{r.exit_code}[/{colour}]",
            f"{r.seconds:.1f}",
            escape(r.error),
        )
    return table


# --- demo --------------------------------------------------------------------------------


TPU_KEYS = ("TPU_NAME", "TPU_WORKER_ID")
MEGASCALE_KEYS = ("MEGASCALE_NUM_SLICES", "MEGASCALE_SLICE_ID", "MEGASCALE_COORDINATOR_ADDRESS")


def _where_am_i() -> dict[str, str]:
    """What one host sees: its place in the gang and its TPU / MEGASCALE environment."""
    host = current_host()
    return {
        "rank": str(host.rank),
        "slice": host.slice_name,
        "worker": str(host.worker_id),
        "pid": str(os.getpid()),
        **{k: os.environ.get(k, "-") for k in TPU_KEYS + MEGASCALE_KEYS},
    }


_where = ray.remote(_where_am_i)


@click.command()
def demo() -> None:
    """Tour tpuslice on a simulated cluster of two v4 2x2x2 slices (about half a minute)."""
    started = time.monotonic()
    with sigterm_as_interrupt():
        sim = _start_simulator([SliceSpec("v4", "2x2x2", 2)])  # 2 hosts each: quick to start
        try:
            sim.connect()
            _demo_steps()
        finally:
            sim.shutdown()
    console.print(f"[green]done[/green] in {time.monotonic() - started:.0f} s; cluster stopped.")


def _demo_steps() -> None:
    console.rule("1. the cluster, as tpuslice sees it")
    console.print(status.render_status(cluster.read_snapshot(), console.width))
    console.rule("2. one function on every host of one slice (refs in rank order)")
    rows = ray.get(run_on_slice(_where, topology="2x2x2", accelerator_version="v4"))
    console.print(_rows_table(rows, ("rank", "slice", "worker", *TPU_KEYS)))
    console.rule("3. a two-slice job: MEGASCALE_* set on every host")
    rows = ray.get(run_on_slice(_where, topology="2x2x2", accelerator_version="v4", num_slices=2))
    console.print(_rows_table(rows, ("rank", "slice", "worker", *MEGASCALE_KEYS)))
    console.rule("4. everything given back")
    snapshot = _wait_until_idle(timeout=10)
    console.print(f"placement groups left: {len(live_placement_groups())}")
    console.print(status.render_status(snapshot, console.width))


def _wait_until_idle(timeout: float) -> cluster.ClusterSnapshot:
    """Poll (bounded) until no group is left and every slice's hosts show free again: Ray's
    resource view trails a removal by a resource report."""
    deadline = time.monotonic() + timeout
    while True:
        snapshot = cluster.read_snapshot()
        idle = all(s.idle for s in snapshot.slices.values())  # suspect or not
        if (idle and not live_placement_groups()) or time.monotonic() > deadline:
            return snapshot
        time.sleep(0.05)


def _rows_table(rows: list[dict[str, str]], columns: tuple[str, ...]) -> Table:
    short = [
        c.replace("MEGASCALE_", "MS_").replace("COORDINATOR_ADDRESS", "COORD") for c in columns
    ]
    table = status.new_table(None, short, frame=HEAVY_HEAD)
    for row in rows:
        table.add_row(*(row[c] for c in columns))
    return table
