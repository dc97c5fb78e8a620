"""Ranges of slices, ``num_slices=(min, max)``, on the simulator, through every API: each
takes as many idle slices as there are up to ``max``, tells how many it got, and sets
``MEGASCALE_*`` and the host context for that count. (A resilient run over a range,
shrinking when a slice is lost and growing back, is test_resilient_pure's; a resilient
run taking a range on the cluster is test_preemption's.)"""

from __future__ import annotations

import os
import re

import pytest
import ray
from click.testing import CliRunner

import tpuslice
from clusterutil import hold_host, wait_for
from tpuslice.cli.commands import main
from tpuslice.testing import SimulatedCluster, assert_no_placement_groups

pytestmark = pytest.mark.cluster

V4 = {"topology": "2x2x2", "accelerator_version": "v4"}


@ray.remote
def gang_view() -> tuple[int, int, str, str]:
    """rank, num_slices (host context), MEGASCALE_NUM_SLICES ("-" if unset), slice."""
    host = tpuslice.current_host()
    return host.rank, host.num_slices, os.environ.get("MEGASCALE_NUM_SLICES", "-"), host.slice_name


def test_a_reservation_with_a_range_takes_what_is_idle_and_says_how_many(
    tpu_cluster: SimulatedCluster,
) -> None:
    with hold_host("v4-16-b", 1):
        with tpuslice.SlicePlacementGroup(**V4, num_slices=(1, 3)) as spg:
            assert spg.num_slices == 1
            assert spg.num_hosts == 2 and spg.num_bundles == 2
            assert spg.slice_names == ["v4-16-a"]
            views = ray.get(tpuslice.run_on_slice(gang_view, tpu_slice=spg), timeout=60)
        assert [v[0] for v in views] == [0, 1]
        assert {(v[1], v[3]) for v in views} == {(1, "v4-16-a")}
        assert {v[2] for v in views} <= {"", "-"}  # no MEGASCALE_NUM_SLICES for one slice
    wait_for(lambda: tpuslice.get_num_ready_tpu_slices("2x2x2", "v4") == 2, 30, "slices back")
    refs = tpuslice.run_on_slice(gang_view, **V4, num_slices=(2, 3))  # one-shot
    views = ray.get(refs, timeout=60)
    assert [v[0] for v in views] == list(range(4))
    assert {v[1:3] for v in views} == {(2, "2")}
    assert_no_placement_groups()


def member_class() -> type:
    """Defined in a function so Ray pickles it by value (workers cannot import tests)."""

    class Member:
        def view(self) -> tuple[int, int, str, str]:
            host = tpuslice.current_host()
            megascale = os.environ.get("MEGASCALE_NUM_SLICES", "-")
            return host.rank, host.num_slices, megascale, host.slice_name

    return Member


def test_an_actor_group_with_a_range(tpu_cluster: SimulatedCluster) -> None:
    with (
        hold_host("v4-16-a", 1),
        tpuslice.SliceActorGroup.create(member_class(), **V4, num_slices=(1, 2)) as group,
    ):
        views = group.get(group.call("view"), timeout=60)
    assert [v[0] for v in views] == [0, 1]
    assert {(v[1], v[3]) for v in views} == {(1, "v4-16-b")}
    assert {v[2] for v in views} <= {"", "-"}  # no MEGASCALE_NUM_SLICES for one slice
    assert_no_placement_groups()


def test_tpuslice_run_takes_a_range(tpu_cluster: SimulatedCluster) -> None:
    script = 'echo "rank=$TPUSLICE_RANK of $TPUSLICE_WORLD_SIZE slices=$TPUSLICE_NUM_SLICES"'
    with hold_host("v4-16-a", 1):
        result = CliRunner().invoke(
            main,
            ["run", "--topology", "2x2x2", "--accelerator", "v4", "--slices", "1..3", "--", script],
            env={"COLUMNS": "100"},
        )
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if "rank=" in line]
    assert len(lines) == 2 and all(line.endswith("of 2 slices=1") for line in lines)
    assert all(re.match(r"\[v4-16-b/[01]\]", line) for line in lines)
    bad = CliRunner().invoke(
        main,
        ["run", "--topology", "2x2x2", "--accelerator", "v4", "--slices", "3..1", "--", "true"],
    )
    assert bad.exit_code == 2 and "MIN <= MAX" in bad.output
    assert_no_placement_groups()
