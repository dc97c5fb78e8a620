"""``tpuslice`` command line: a thin layer over the library (click + rich).

Errors from the library become one red line and an exit code: 2 for bad input
(click's usage code), 1 for anything the cluster refused.
"""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table

import tpuslice
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
