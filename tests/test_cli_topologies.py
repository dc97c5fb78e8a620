"""The ``tpuslice topologies`` command, ``--version`` and ``--help``, driven through click's
CliRunner."""

from __future__ import annotations

import pytest
from click.testing import CliRunner, Result

import tpuslice
from tpuslice._tpu import topology as topo
from tpuslice._tpu.compat import DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S
from tpuslice.cli.commands import main


def invoke(*args: str, columns: int = 200) -> Result:
    """Run the CLI as if in a terminal ``columns`` wide (rich reads COLUMNS)."""
    return CliRunner(env={"COLUMNS": str(columns)}).invoke(main, list(args))


def table_rows(output: str) -> list[list[str]]:
    """The body rows of every rich table in the output, as lists of stripped cells."""
    return [
        [cell.strip() for cell in line.strip().strip("│").split("│")]
        for line in output.splitlines()
        if line.startswith("│")
    ]


# Documented facts (Google Cloud TPU docs, ../shared/REFERENCE.md), written out here so the
# CLI's table is checked against the documentation rather than against its own code path.
CORES_PER_CHIP = {"v2": 2, "v3": 2, "v4": 2, "v5p": 2, "v5litepod": 1, "v6e": 1, "v7x": 2}
LARGEST_ONE_VM_SLICE = {"v5litepod": 8, "v6e": 8}  # chips; 4 for every other generation
CHIPS_PER_MULTI_HOST_VM = 4


def documented_row(generation: str, topology: str) -> list[str]:
    """The row the docs predict: topology, chips, hosts, pod type, head resource."""
    chips = 1
    for side in topology.split("x"):
        chips *= int(side)
    one_vm = chips <= LARGEST_ONE_VM_SLICE.get(generation, 4)
    hosts = 1 if one_vm else chips // CHIPS_PER_MULTI_HOST_VM
    pod_type = f"{generation}-{chips * CORES_PER_CHIP[generation]}"
    return [topology, str(chips), str(hosts), pod_type, f"TPU-{pod_type}-head"]


def check_table(rows: list[list[str]], gen: topo.Generation) -> None:
    """Every valid topology once, each row as documented, ordered by chip count."""
    assert sorted(row[0] for row in rows) == sorted(gen.topologies)
    assert [documented_row(gen.name, row[0]) for row in rows] == rows
    chips = [int(row[1]) for row in rows]
    assert chips == sorted(chips)


def test_topologies_v6e_prints_pod_types_and_head_resources() -> None:
    result = invoke("topologies", "v6e")
    assert result.exit_code == 0, result.output
    assert "v6e: 1 TensorCore(s)/chip, pod type counts chips, 2D" in result.output
    for header in ("topology", "chips", "hosts", "pod type", "head resource"):
        assert header in result.output
    check_table(table_rows(result.output), topo.GENERATIONS["v6e"])
    assert ["4x4", "16", "4", "v6e-16", "TPU-v6e-16-head"] in table_rows(result.output)
    assert ["2x4", "8", "1", "v6e-8", "TPU-v6e-8-head"] in table_rows(result.output)


@pytest.mark.parametrize(
    ("spelling", "name"),
    [("TPU-V6E", "v6e"), ("v5e", "v5litepod"), ("tpu7x", "v7x"), ("trillium", "v6e")],
)
def test_topologies_accepts_any_generation_spelling(spelling: str, name: str) -> None:
    result = invoke("topologies", spelling)
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"{name}:")
    check_table(table_rows(result.output), topo.GENERATIONS[name])


def test_topologies_without_argument_prints_every_generation() -> None:
    result = invoke("topologies")
    assert result.exit_code == 0, result.output
    titles = [line.split(":")[0] for line in result.output.splitlines() if "TensorCore" in line]
    assert titles == list(topo.GENERATIONS)
    rows = table_rows(result.output)
    for gen in topo.GENERATIONS.values():
        check_table([row for row in rows if row[3].startswith(f"{gen.name}-")], gen)
    assert len(rows) == sum(len(gen.topologies) for gen in topo.GENERATIONS.values())
    assert ["2x2x2", "8", "2", "v4-16", "TPU-v4-16-head"] in rows


@pytest.mark.parametrize("bad", ["v9", "gpu", "v6e-16", "4x4"])
def test_bad_generation_exits_2_with_one_clear_message(bad: str) -> None:
    result = invoke("topologies", bad)
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    assert f"unknown TPU accelerator version '{bad}'" in errors[0]
    assert "valid: v2, v3, v4, v5p, v5litepod, v6e, v7x" in errors[0]
    assert result.output.count("unknown TPU accelerator version") == 1
    assert "Traceback" not in result.output
    assert table_rows(result.output) == []


def test_tables_are_not_truncated_at_80_columns() -> None:
    result = invoke("topologies", "v5litepod", columns=80)
    assert result.exit_code == 0
    assert "…" not in result.output
    check_table(table_rows(result.output), topo.GENERATIONS["v5litepod"])


def test_version_prints_the_package_version() -> None:
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.output == f"tpuslice, version {tpuslice.__version__}\n"


def test_help_lists_the_topologies_command() -> None:
    result = invoke("--help")
    assert result.exit_code == 0
    assert "topologies" in result.output


def test_run_help_shows_the_default_timeout_of_every_reservation() -> None:
    result = invoke("run", "--help")
    assert result.exit_code == 0
    assert f"[default: {DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S}" in result.output
