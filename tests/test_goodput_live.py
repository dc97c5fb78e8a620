"""A resilient run's goodput account on the simulator, against the phases its script
makes known: it waits in the queue behind another reservation, saves a checkpoint, is
warned of preemption and saves again before it leaves, hangs on its second slice after a
checkpoint, and succeeds on its third try. The account must sum to the run's wall time and
match each phase the script controls; ``tpuslice goodput RUN_ID --json`` must show the
same numbers. (The rules themselves are test_goodput's, without Ray.)"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TypeVar

import pytest
import ray
from click.testing import CliRunner

import tpuslice
from clusterutil import run_in_background, wait_for
from tpuslice import AttemptEvent, Outcome
from tpuslice._reserve.suspects import clear_slice
from tpuslice._view.cluster import SliceState, read_snapshot
from tpuslice.cli.commands import main
from tpuslice.record import goodput
from tpuslice.testing import SimulatedCluster, assert_no_placement_groups

pytestmark = pytest.mark.cluster

V4 = {"topology": "2x2x2", "accelerator_version": "v4"}
V4_SLICES = ["v4-16-a", "v4-16-b"]
SAVE_S = 0.3
"""How long each of the script's checkpoints takes to save."""
STEP_S = 0.05
WORK_BEFORE_SAVE_S = 1.0
HEARTBEAT_TIMEOUT_S = 2.0
TASK_BOUND_S = 120.0
T = TypeVar("T")


def marks(directory: Path, prefix: str) -> dict[str, float]:
    """The markers named ``<prefix>-...``, with their times."""
    return {
        p.name: float(p.read_text()) for p in directory.iterdir() if p.name.startswith(prefix + "-")
    }


@ray.remote
def train(marker_dir: str) -> str:
    """Beat every step; save once after a second of work, and again when the slice's
    save flag appears (the run's ``on_notice`` sets it); stop when the go file exists."""

    # Helpers are nested: Ray ships this function by value, and a module-level one would
    # be imported by name on the host, where this test module is not importable.
    def mark(directory: Path, name: str, at: float) -> None:
        """A marker file whose text is a time (written whole: renamed into place)."""
        hidden = directory / f".{uuid.uuid4().hex}"
        hidden.write_text(repr(at))
        hidden.rename(directory / name)

    host = tpuslice.current_host()
    here = Path(marker_dir)
    me = f"{host.slice_name}-{host.rank}-{uuid.uuid4().hex[:6]}"
    tpuslice.heartbeat()
    began = time.time()
    mark(here, f"beat0-{me}", began)
    saved = saved_on_notice = False
    deadline = time.monotonic() + TASK_BOUND_S
    while not (here / "go").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the test never said go")
        if not saved and time.time() - began >= WORK_BEFORE_SAVE_S:
            time.sleep(SAVE_S)  # the save
            tpuslice.checkpointed(step=1)
            mark(here, f"ckpt-{me}", time.time())
            saved = True
        if not saved_on_notice and (here / f"save-{host.slice_name}").exists():
            time.sleep(SAVE_S)
            tpuslice.checkpointed(step=2)
            mark(here, f"noticeckpt-{me}", time.time())
            saved_on_notice = True
        tpuslice.heartbeat()
        time.sleep(STEP_S)
    mark(here, f"done-{me}", time.time())
    return host.slice_name


def still(future: Future[list[str]], predicate: Callable[[], T]) -> Callable[[], T | bool]:
    """``predicate``, or True once the run has ended (its error is then raised, instead
    of the wait timing out)."""

    def check() -> T | bool:
        if future.done():
            future.result()  # raises what ended the run
            return True
        return predicate()

    return check


def on(slice_name: str, found: dict[str, float]) -> list[float]:
    return [at for name, at in found.items() if f"-{slice_name}-" in name]


def test_a_resilient_runs_account_matches_its_scripted_history(
    tpu_cluster: SimulatedCluster, tmp_path: Path
) -> None:
    here, go = tmp_path, tmp_path / "go"
    events: list[tuple[float, AttemptEvent]] = []
    accounts: list[goodput.Account] = []
    hook_returned: list[float] = []

    def on_notice(event: AttemptEvent) -> None:
        (victim,) = event.slice_names
        (here / f"save-{victim}").touch()
        wait_for(lambda: len(on(victim, marks(here, "noticeckpt"))) == 2, 20, "saved on notice")
        (here / f"save-{victim}").unlink()  # the run's later attempts save only on schedule
        hook_returned.append(time.time())

    blocker = tpuslice.SlicePlacementGroup(**V4, num_slices=2)
    dying: list[threading.Thread] = []
    victim = hung = ""
    try:
        called = time.time()
        with run_in_background(
            train,
            str(here),
            **V4,
            head_reservation_timeout_s=60,
            heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
            max_retries_preemption=1,
            max_retries_hang=1,
            backoff_s=(0.1, 0.1),
            on_event=lambda e: events.append((time.time(), e)),
            on_notice=on_notice,
            on_account=accounts.append,
            go=go,
        ) as future:
            wait_for(still(future, lambda: read_snapshot().queued()), 30, "the run queued")
            blocker.shutdown()
            released = time.time()
            first = wait_for(still(future, lambda: marks(here, "ckpt")), 60, "attempt 1 saved")
            victim = next(iter(first)).removeprefix("ckpt-").rsplit("-", 2)[0]
            thread = tpu_cluster.preempt_slice(victim, notice_s=6, wait=False)
            assert thread is not None
            dying.append(thread)
            other = next(s for s in V4_SLICES if s != victim)
            saved = still(future, lambda: len(on(other, marks(here, "ckpt"))) == 2)
            wait_for(saved, 60, "attempt 2 saved")
            thread.join(30)
            tpu_cluster.restore_slice(victim)  # from this thread, which outlives the hosts
            hung_at = time.time()
            assert tpu_cluster.hang_host(other, 1), "nothing to hang"
            hung = other
            began = still(future, lambda: len(on(victim, marks(here, "beat0"))) == 4)
            wait_for(began, 60, "attempt 3 began")
            go.touch()
            assert future.result(timeout=60) == [victim, victim]
        returned = time.time()
    finally:
        blocker.shutdown()
        for thread in dying:
            thread.join(30)
        if victim:
            tpu_cluster.restore_slice(victim)
        if hung:
            clear_slice(hung, "the test is over")

    kinds = [(e.kind, e.outcome) for _, e in events]
    assert kinds == [
        ("started", None),
        ("notice", Outcome.PREEMPTION),
        ("failed", Outcome.PREEMPTION),
        ("started", None),
        ("failed", Outcome.HANG),
        ("started", None),
        ("succeeded", None),
    ]
    (account,) = accounts
    seconds, lost = account.seconds, account.lost
    assert sum(seconds.values()) == pytest.approx(account.wall_s, rel=0.01)
    assert account.wall_s == pytest.approx(returned - called, abs=0.5)

    # The phases the script controls, each within half a second.
    beats = marks(here, "beat0")
    starts = [at for at, e in events if e.kind == "started"]
    saves, notice_saves, done = marks(here, "ckpt"), marks(here, "noticeckpt"), marks(here, "done")
    on_victim = sorted(on(victim, beats))  # attempt 1's two ranks, then attempt 3's
    first_beats = [on_victim[0], min(on(other, beats)), on_victim[2]]
    save = SAVE_S + STEP_S  # a save, and the step before it, since the last beat
    expected = {
        "queued": released - account.started_at,
        "starting": first_beats[0] - starts[0],
        "checkpointing": 3 * save,
        "productive": (max(on(victim, notice_saves)) - first_beats[0] - 2 * save)
        + (max(on(other, saves)) - first_beats[1] - save)
        + (max(done.values()) - first_beats[2]),
    }
    for category, value in expected.items():
        assert seconds[category] == pytest.approx(value, abs=0.5), (category, dict(seconds))
    assert lost["preemption"] == pytest.approx(
        hook_returned[0] - max(on(victim, notice_saves)), abs=0.5
    )
    # A hang is judged once the silent rank's last published beat is heartbeat_timeout_s
    # old, at the watch's next look: known to within a second (the watch looks every
    # second; a beat is published up to half a second late).
    after_save = hung_at - max(on(other, saves)) + HEARTBEAT_TIMEOUT_S
    assert after_save - 0.6 <= lost["hang"] <= after_save + 1.2, dict(lost)
    assert seconds["recovering"] > 0 and seconds["handing_back"] > 0 and seconds["reserving"] > 0
    assert account.attempts == 3 and account.checkpoints == 3 and account.outcome == "success"
    assert account.slices == (victim,)

    # `tpuslice goodput` shows the same account, from the store.
    assert goodput.flush(timeout_s=10)
    result = CliRunner().invoke(main, ["goodput", account.run_id, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == account.to_dict()

    wait_for(
        lambda: all(read_snapshot().slices[n].state is SliceState.READY for n in V4_SLICES),
        60,
        "every v4 slice idle, with no notice",
    )
    assert_no_placement_groups()


@ray.remote
def beat_for(seconds: float) -> int:
    """Start up for a moment, then beat every step for ``seconds``."""
    time.sleep(0.3)
    end = time.time() + seconds
    while time.time() < end:
        tpuslice.heartbeat()
        time.sleep(STEP_S)
    return tpuslice.current_host().rank


@ray.remote
class Trainer:
    def setup(self) -> int:
        return tpuslice.current_host().rank

    def steps(self, seconds: float) -> None:
        end = time.time() + seconds
        while time.time() < end:
            tpuslice.heartbeat()
            time.sleep(STEP_S)


def test_a_one_shot_and_an_actor_group_keep_accounts_of_their_own(
    tpu_cluster: SimulatedCluster,
) -> None:
    """The one-shot's account is kept after its hand-back, in the background; the actor
    group's when it is shut down. Each starts until its gang's first beat."""
    before = {a.run_id for a in goodput.read_accounts()}
    assert ray.get(tpuslice.run_on_slice(beat_for, 1.0, **V4)) == [0, 1]
    group = tpuslice.SliceActorGroup.create(Trainer, **V4)
    try:
        assert group.get(group.call("setup")) == [0, 1]
        group.get(group.call("steps", 1.0))
    finally:
        group.shutdown()
    assert goodput.flush(timeout_s=10)

    def kept() -> dict[str, goodput.Account]:
        new = [a for a in goodput.read_accounts() if a.run_id not in before]
        return {a.kind: a for a in new} if len(new) == 2 else {}

    accounts = wait_for(kept, 30, "both accounts in the store")
    one_shot, actors = accounts["one_shot"], accounts["actor_group"]
    for account in (one_shot, actors):
        assert sum(account.seconds.values()) == pytest.approx(account.wall_s, rel=0.01)
        assert account.outcome == "success" and account.notes == ()
        assert account.what == "1 x v4 2x2x2" and len(account.slices) == 1
    assert one_shot.seconds["starting"] >= 0.3 and one_shot.seconds["productive"] >= 0.9
    assert actors.seconds["productive"] >= 0.9 and actors.seconds["handing_back"] > 0
    assert_no_placement_groups()
