"""Notices, maintenance and hangs on the simulator (issue 16).

Each simulated host has a GCE metadata server; its TPU agent long-polls
``instance/preempted`` and ``instance/maintenance-event``. A resilient run hears a notice
on its slice, runs ``on_notice`` while the hosts live, and finishes on another slice
before they die; a maintenance event shows in the cluster view and new reservations skip
the slice; a hung host (its work blocked, as in a stuck collective) is caught by
heartbeats; a worker that survives a shrink sees no stale ``MEGASCALE_*``.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import ray

import tpuslice
from clusterutil import hold_host, markers_written, run_in_background, wait_for
from tpuslice import AttemptEvent, Outcome
from tpuslice._host.suspects import SuspectReason
from tpuslice._reserve.suspects import clear_slice
from tpuslice._sim.procs import pid_alive
from tpuslice._sim.simulated import MIGRATE_ON_MAINTENANCE
from tpuslice._tpu import _ray
from tpuslice._view.cluster import SliceState, read_snapshot
from tpuslice.cli.status import state_label
from tpuslice.testing import SimulatedCluster, assert_no_placement_groups

pytestmark = pytest.mark.cluster

V4 = {"topology": "2x2x2", "accelerator_version": "v4"}
V4_SLICES = ["v4-16-a", "v4-16-b"]
TASK_BOUND_S = 120.0


@ray.remote
def beat_until_go(marker_dir: str, go: str) -> tuple[str, int]:
    """A marker naming the slice, then a heartbeat every 50 ms until the go file exists."""
    host = tpuslice.current_host()
    hidden = Path(marker_dir, f".{uuid.uuid4().hex}")
    hidden.write_text(host.slice_name)
    hidden.rename(Path(marker_dir, hidden.name[1:]))
    deadline = time.monotonic() + TASK_BOUND_S
    while not Path(go).exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the test never said go")
        tpuslice.heartbeat()
        time.sleep(0.05)
    return host.slice_name, host.rank


def all_back() -> None:
    wait_for(
        lambda: all(read_snapshot().slices[n].state is SliceState.READY for n in V4_SLICES),
        60,
        "every v4 slice idle, with no notice",
    )
    assert_no_placement_groups()


def test_a_preemption_notice_runs_the_hook_and_the_run_moves_before_the_hosts_die(
    tpu_cluster: SimulatedCluster, tmp_path: Path
) -> None:
    markers, go = tmp_path / "started", tmp_path / "go"
    markers.mkdir()
    events: list[AttemptEvent] = []
    hooked: list[AttemptEvent] = []
    seen_in_status: list[str] = []
    dying: list[threading.Thread] = []
    alive_when_left: list[bool] = []
    victim = ""

    def on_notice(event: AttemptEvent) -> None:
        # While the hosts live: the cluster view shows the slice preempting.
        info = wait_for(
            lambda: (s := read_snapshot().slices[victim]).state is SliceState.NOTICE and s,
            5,
            "the notice in the cluster view",
        )
        seen_in_status.append(f"{state_label(info)}: {info.reason}")
        hooked.append(event)

    def on_event(event: AttemptEvent) -> None:
        events.append(event)
        if event.kind == "failed":  # the run has left the slice: do its hosts still live?
            alive_when_left.append(bool(dying) and dying[0].is_alive())

    try:
        with run_in_background(
            beat_until_go,
            str(markers),
            str(go),
            **V4,
            head_reservation_timeout_s=60,
            on_event=on_event,
            on_notice=on_notice,
            go=go,
        ) as future:
            first = wait_for(lambda: markers_written(markers, 2), 60, "attempt 1 running")
            victim = first[0]
            thread = tpu_cluster.preempt_slice(victim, notice_s=6, wait=False)
            assert thread is not None
            dying.append(thread)
            second = wait_for(lambda: markers_written(markers, 4), 30, "attempt 2 running")
            go.touch()
            results = future.result(timeout=60)
        finished_before_death = dying[0].is_alive()
        dying[0].join(30)
    finally:
        if victim:
            for thread in dying:
                thread.join(30)
            tpu_cluster.restore_slice(victim)
    other = results[0][0]
    assert other != victim and sorted(set(second)) == sorted({victim, other})
    assert alive_when_left == [True] and finished_before_death
    assert [e.kind for e in events] == ["started", "notice", "failed", "started", "succeeded"]
    notice, failed = events[1], events[2]
    assert notice.slice_names == (victim,) and notice.notice is not None
    assert notice.notice.kind == "preemption" and notice.notice.slice_name == victim
    assert hooked == [notice]
    assert seen_in_status and seen_in_status[0].startswith("PREEMPTING: preemption notice on")
    assert failed.outcome is Outcome.PREEMPTION and failed.evidence == "TRUE"
    assert failed.cause.startswith("left before the hosts go: preemption notice on " + victim)
    all_back()


def test_a_maintenance_event_shows_and_new_reservations_skip_the_slice(
    tpu_cluster: SimulatedCluster,
) -> None:
    """Maintenance announced on a host of a held slice: the reservation lists the notice,
    the cluster view shows MAINTENANCE, a new reservation takes the other slice. After
    the migration the value is NONE again and the slice is idle."""
    with tpuslice.SlicePlacementGroup(**V4) as held:
        target = held.slice_names[0]
        assert held.notices() == []
        thread = tpu_cluster.schedule_maintenance(
            target, 1, notice_s=4, event=MIGRATE_ON_MAINTENANCE, wait=False
        )
        assert thread is not None
        try:
            notices = wait_for(held.notices, 30, "the notice on the reservation")
            assert [(n.kind, n.slice_name, n.worker_id) for n in notices] == [
                ("maintenance", target, 1)
            ]
            info = read_snapshot().slices[target]
            assert info.state is SliceState.NOTICE and state_label(info) == "MAINTENANCE"
            assert info.reason.startswith(
                f"maintenance notice on {target} host 1 "
                "(instance/maintenance-event=MIGRATE_ON_HOST_MAINTENANCE)"
            )
            held.shutdown()  # given back while under notice: still not reservable
            assert tpuslice.get_num_ready_tpu_slices("2x2x2", "v4") == 1
            with tpuslice.SlicePlacementGroup(**V4) as spg:
                assert target not in spg.slice_names
        finally:
            thread.join(30)
    all_back()


def test_a_hang_is_caught_by_heartbeats_and_the_gang_restarts(
    tpu_cluster: SimulatedCluster, tmp_path: Path
) -> None:
    """Attempt 1 beats, then one host's work hangs (its main thread blocks): the other
    beats on, the silent one is named, the gang cancelled, and that host marked suspect,
    so attempt 2 runs on another slice. Attempt 2 finishes, and the run's heartbeat keys
    go with it. (A gang stuck starting, with no beat at all, is
    test_watchdog's: the same watch, with no key to read.)"""
    markers, go = tmp_path / "started", tmp_path / "go"
    markers.mkdir()
    events: list[AttemptEvent] = []
    hung: list[int] = []
    with run_in_background(
        beat_until_go,
        str(markers),
        str(go),
        **V4,
        head_reservation_timeout_s=60,
        heartbeat_timeout_s=2.0,
        max_retries_hang=1,
        backoff_s=(0.1, 0.2),
        on_event=events.append,
        go=go,
    ) as future:
        wait_for(lambda: markers_written(markers, 2), 60, "attempt 1 running")
        first = wait_for(lambda: events and events[0].slice_names[0], 30, "attempt 1 started")
        wait_for(lambda: len(_ray.kv_list("beat/", "tpuslice")) == 2, 30, "two beats")
        hung = tpu_cluster.hang_host(first, 1)
        assert hung, "nothing to hang"
        wait_for(lambda: markers_written(markers, 4), 60, "attempt 2 running")
        go.touch()
        results = future.result(timeout=60)
    # The hung process was ended by the gang's cancellation (nothing else would).
    wait_for(lambda: not any(pid_alive(p) for p in hung), 30, "the hung process gone")
    wait_for(lambda: _ray.kv_list("beat/", "tpuslice") == [], 30, "the run's beat keys gone")
    kinds = [(e.kind, e.outcome) for e in events]
    assert kinds == [
        ("started", None),
        ("failed", Outcome.HANG),
        ("started", None),
        ("succeeded", None),
    ]
    silent = events[1]
    assert silent.cause == f"silent: rank 1 ({first} host 1)"
    assert "while 1 other(s) still beat" in silent.evidence
    assert len(results) == 2
    assert events[2].slice_names != (first,)  # trusted slices were idle: not the suspect one
    info = read_snapshot().slices[first]
    assert info.state is SliceState.SUSPECT and info.idle
    (record,) = info.suspects
    assert (record.worker_id, record.reason) == (1, SuspectReason.HANG)
    assert record.evidence.startswith(f"rank 1 ({first} host 1) silent: ")
    assert [r.worker_id for r in clear_slice(first, "the test is over")] == [1]
    all_back()


def test_a_hung_actor_is_named_by_the_group(tpu_cluster: SimulatedCluster, tmp_path: Path) -> None:
    class Stepper:  # defined here so Ray ships it by value (workers cannot import tests)
        """An actor whose method beats every 50 ms until the go file exists."""

        def steps(self, go: str) -> int:
            count = 0
            deadline = time.monotonic() + TASK_BOUND_S
            while not Path(go).exists() and time.monotonic() < deadline:
                tpuslice.heartbeat()
                count += 1
                time.sleep(0.05)
            return count

    go = tmp_path / "go"
    group = tpuslice.SliceActorGroup.create(
        Stepper, **V4, heartbeat_timeout_s=2.0, startup_timeout_s=20.0
    )
    hung: list[int] = []
    try:
        refs = group.call("steps", str(go))
        name = group.contexts[1].slice_name
        mine = group._beats  # this group's heartbeat keys, not another run's
        wait_for(lambda: len(_ray.kv_list(mine, "tpuslice")) == 2, 30, "both actors beat")
        hung = tpu_cluster.hang_host(name, 1)
        assert hung, "nothing to hang"
        with pytest.raises(tpuslice.HostHungError, match=rf"silent: rank 1 \({name} host 1\)"):
            group.get(refs, timeout=30)
    finally:
        go.touch()
        group.shutdown()
    assert _ray.kv_list("beat/", "tpuslice") == []
    # The group's shutdown killed the hung actor (nothing else would end it).
    wait_for(lambda: not any(pid_alive(p) for p in hung), 30, "the hung actor killed")
    all_back()


@ray.remote
def env_and_pid() -> tuple[str, int, str, str, dict[str, Any]]:
    """This host's context, pid and MEGASCALE, and the host as node detection finds it
    with no TPU_* variables (a GCE TPU VM): through the metadata server that
    ``GCE_METADATA_HOST`` names."""
    from tpuslice._host import node
    from tpuslice._host.metadata import watch

    host = tpuslice.current_host()
    info = node.detect(env={k: v for k, v in os.environ.items() if not k.startswith("TPU_")})
    found = {
        "slice": info.slice_name,
        "worker": info.worker_id,
        "shape": (info.pod_type, info.topology),
        "source": info.sources.get("slice_name"),
        "preempted": watch("instance/preempted").value,
        "server": os.environ.get("GCE_METADATA_HOST", ""),
        "host": (host.slice_name, host.worker_id),
    }
    megascale = os.environ.get("MEGASCALE_NUM_SLICES", "-")
    return host.slice_name, os.getpid(), megascale, str(host.num_slices), found


def test_hosts_find_themselves_through_their_metadata_servers_and_no_env_goes_stale(
    tpu_cluster: SimulatedCluster,
) -> None:
    """Each host's node detection, with no TPU_* variables, reads its own metadata server.
    Two slices, then one: the same worker processes run the second call (Ray reuses
    them), and they see the one-slice context with no MEGASCALE_* left over."""
    wide = ray.get(tpuslice.run_on_slice(env_and_pid, **V4, num_slices=2), timeout=60)
    with hold_host("v4-16-b", 1):
        narrow = tpuslice.run_resilient(env_and_pid, **V4, num_slices=(1, 2))
    assert {(r[0], r[2], r[3]) for r in wide} == {("v4-16-a", "2", "2"), ("v4-16-b", "2", "2")}
    assert {(r[0], r[2], r[3]) for r in narrow} == {("v4-16-a", "-", "1")}
    survivors = {r[1] for r in wide} & {r[1] for r in narrow}
    assert survivors, "no worker survived: the test did not exercise a reused process"
    found = [r[4] for r in wide]
    assert [(f["slice"], f["worker"]) for f in found] == [f["host"] for f in found]
    assert {(f["shape"], f["source"], f["preempted"]) for f in found} == {
        (("v4-16", "2x2x2"), "metadata:instance-id", "FALSE")
    }
    servers = [f["server"] for f in found]
    assert all(s.startswith("127.0.0.1:") for s in servers)
    assert len(set(servers)) == len(servers)  # one server per host
    assert_no_placement_groups()
