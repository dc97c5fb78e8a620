"""Ranges of slices, ``num_slices=(min, max)``, on the simulator, through every API: each
takes as many idle slices as there are up to ``max``, tells how many it got, and sets
``MEGASCALE_*`` and the host context for that count; a resilient run shrinks when a slice
is lost with none idle to replace it, and grows back at the next restart."""

from __future__ import annotations

import os
import re
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import pytest
import ray
from click.testing import CliRunner

import tpuslice
from clusterutil import hold_host, markers_written, wait_for
from tpuslice import AttemptEvent
from tpuslice.cli.commands import main
from tpuslice.testing import SimulatedCluster, assert_no_placement_groups

pytestmark = pytest.mark.cluster

V4 = {"topology": "2x2x2", "accelerator_version": "v4"}
TASK_BOUND_S = 120.0


@ray.remote
def gang_view() -> tuple[int, int, str, str]:
    """rank, num_slices (host context), MEGASCALE_NUM_SLICES ("-" if unset), slice."""
    host = tpuslice.current_host()
    return host.rank, host.num_slices, os.environ.get("MEGASCALE_NUM_SLICES", "-"), host.slice_name


def test_a_reservation_with_a_range_takes_what_is_idle_and_says_how_many(
    tpu_cluster: SimulatedCluster,
) -> None:
    with hold_host("v4-16-d", 1):
        with tpuslice.SlicePlacementGroup(**V4, num_slices=(1, 4)) as spg:
            assert spg.num_slices == 3
            assert spg.num_hosts == 6 and spg.num_bundles == 6
            assert spg.slice_names == ["v4-16-a", "v4-16-b", "v4-16-c"]
            views = ray.get(tpuslice.run_on_slice(gang_view, tpu_slice=spg), timeout=60)
        assert [v[0] for v in views] == list(range(6))
        assert {v[1:3] for v in views} == {(3, "3")}
        refs = tpuslice.run_on_slice(gang_view, **V4, num_slices=(2, 3))  # one-shot
        views = ray.get(refs, timeout=60)
        assert len(views) == 6 and {v[1:3] for v in views} == {(3, "3")}
    wait_for(lambda: tpuslice.get_num_ready_tpu_slices("2x2x2", "v4") == 4, 30, "slices back")
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
        hold_host("v4-16-b", 1),
        hold_host("v4-16-c", 1),
        tpuslice.SliceActorGroup.create(member_class(), **V4, num_slices=(1, 2)) as group,
    ):
        views = group.get(group.call("view"), timeout=60)
    assert [v[0] for v in views] == [0, 1]
    assert {(v[1], v[3]) for v in views} == {(1, "v4-16-d")}
    assert {v[2] for v in views} <= {"", "-"}  # no MEGASCALE_NUM_SLICES for one slice
    assert_no_placement_groups()


def test_tpuslice_run_takes_a_range(tpu_cluster: SimulatedCluster) -> None:
    script = 'echo "rank=$TPUSLICE_RANK of $TPUSLICE_WORLD_SIZE slices=$TPUSLICE_NUM_SLICES"'
    with hold_host("v4-16-a", 1), hold_host("v4-16-b", 1):
        result = CliRunner().invoke(
            main,
            ["run", "--topology", "2x2x2", "--accelerator", "v4", "--slices", "1..3", "--", script],
            env={"COLUMNS": "100"},
        )
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if "rank=" in line]
    assert len(lines) == 4 and all(line.endswith("of 4 slices=2") for line in lines)
    assert all(re.match(r"\[v4-16-[cd]/[01]\]", line) for line in lines)
    bad = CliRunner().invoke(
        main,
        ["run", "--topology", "2x2x2", "--accelerator", "v4", "--slices", "3..1", "--", "true"],
    )
    assert bad.exit_code == 2 and "MIN <= MAX" in bad.output
    assert_no_placement_groups()


@ray.remote
def mark_and_wait(marker_dir: str, go: str) -> tuple[str, int, str]:
    """A marker ``<slice> <MEGASCALE_NUM_SLICES>``, then wait for the test's go file."""
    host = tpuslice.current_host()
    megascale = os.environ.get("MEGASCALE_NUM_SLICES", "-")
    hidden = Path(marker_dir, f".{uuid.uuid4().hex}")
    hidden.write_text(f"{host.slice_name} {megascale} {host.num_slices}")
    hidden.rename(Path(marker_dir, hidden.name[1:]))
    deadline = time.monotonic() + TASK_BOUND_S
    while not Path(go).exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the test never said go")
        time.sleep(0.02)
    return host.slice_name, host.rank, megascale


def test_a_resilient_run_shrinks_when_a_slice_is_lost_and_grows_back(
    tpu_cluster: SimulatedCluster, tmp_path: Path
) -> None:
    """(1, 3) slices with two of four busy: attempt 1 runs on 2. A host of one dies and
    no slice is idle: attempt 2 runs on the 1 left (MEGASCALE unset, one slice). The
    busy slices are freed and a host of that one dies too: attempt 3 grows to the 2
    idle, with MEGASCALE_NUM_SLICES=2 on every host."""
    marks, go = tmp_path / "marks", tmp_path / "go"
    marks.mkdir()
    events: list[AttemptEvent] = []
    lost: list[str] = []
    stack = ExitStack()
    stack.enter_context(hold_host("v4-16-c", 1))
    stack.enter_context(hold_host("v4-16-d", 1))
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            future = pool.submit(
                tpuslice.run_resilient,
                mark_and_wait,
                str(marks),
                str(go),
                **V4,
                num_slices=(1, 3),
                head_reservation_timeout_s=60,
                backoff_s=(0.1, 0.2),
                on_event=events.append,
            )
            try:
                first = wait_for(lambda: markers_written(marks, 4), 60, "attempt 1 on two slices")
                assert sorted(first) == ["v4-16-a 2 2"] * 2 + ["v4-16-b 2 2"] * 2
                lost.append("v4-16-b")
                tpu_cluster.kill_host("v4-16-b", 1)
                second = wait_for(lambda: markers_written(marks, 6), 60, "attempt 2 on one slice")
                assert sorted(set(second) - set(first)) == ["v4-16-a - 1"]
                stack.close()  # c and d are idle now
                lost.append("v4-16-a")
                tpu_cluster.kill_host("v4-16-a", 0)
                third = wait_for(lambda: markers_written(marks, 10), 60, "attempt 3 on two slices")
                assert sorted(set(third) - set(second)) == [
                    "v4-16-c 2 2",
                    "v4-16-d 2 2",
                ]
            finally:
                go.touch()
            results = future.result(timeout=60)
    finally:
        stack.close()
        for name in lost:
            tpu_cluster.restore_slice(name)
    assert [r[1] for r in results] == [0, 1, 2, 3]
    assert {r[2] for r in results} == {"2"}
    started = [e.slice_names for e in events if e.kind == "started"]
    assert started == [("v4-16-a", "v4-16-b"), ("v4-16-a",), ("v4-16-c", "v4-16-d")]
    wait_for(lambda: tpuslice.get_num_ready_tpu_slices("2x2x2", "v4") == 4, 60, "slices back")
    assert_no_placement_groups()
