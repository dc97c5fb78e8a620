"""Goodput accounts: where a run's wall time went, from its moments. Pure: an account is a
function of the moments the driver saw and the progress the gang published, and a
resilient run's loop is driven here with a fake reservation, a fake watch and a fake
wall clock. (The same account from a real run on the simulator is test_goodput_live's.)
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
from ray import exceptions as rex

from tpuslice._host import heartbeats
from tpuslice._host.heartbeats import BEAT_ENV, Progress
from tpuslice._reserve.request import SliceRequest
from tpuslice._run.observe import Outcome
from tpuslice._run.resilient import GangBrokenError, ResilientRun, RetryPolicy
from tpuslice._tpu.clock import Clock
from tpuslice._tpu.keys import SLICE_SECONDS_KEY_PREFIX
from tpuslice.errors import InvalidArgumentError, ReservationTimeoutError, RetriesExhaustedError
from tpuslice.record import goodput, slice_seconds
from tpuslice.record.goodput import CATEGORIES, Account, AttemptTimes, GangProgress, account_of


def spent(account: Account) -> dict[str, float]:
    """The account's non-zero categories, rounded to the millisecond."""
    return {c: round(s, 3) for c, s in account.seconds.items() if s > 1e-9}


def sums_to_wall(account: Account) -> bool:
    return math.isclose(sum(account.seconds.values()), account.wall_s, abs_tol=1e-9) and (
        math.isclose(sum(account.lost.values()), account.seconds["lost"], abs_tol=1e-9)
    )


def test_a_clean_run_splits_into_waiting_start_up_work_saving_and_the_hand_back() -> None:
    attempt = AttemptTimes(
        asked=100.0,
        queued_s=2.0,
        held=102.5,
        ended=120.0,
        hand_back=120.0,
        handed_back=120.4,
        outcome="success",
        progress=GangProgress(first_beat=105.5, checkpoint_at=115.0, checkpoint_s=1.5),
    )
    account = account_of("r1", "resilient", [attempt])
    assert spent(account) == {
        "queued": 2.0,
        "reserving": 0.5,
        "starting": 3.0,
        "checkpointing": 1.5,
        "productive": 13.0,
        "handing_back": 0.4,
    }
    assert account.wall_s == pytest.approx(20.4) and sums_to_wall(account)
    assert account.goodput == pytest.approx(13.0 / 20.4)
    assert account.notes == () and account.outcome == "success"


def test_the_scripted_history_queue_checkpoint_preemption_hang_success() -> None:
    """The history of the live test, by the numbers: queued behind another job, a
    checkpoint, a notice answered with a checkpoint, a hang with work after its last
    checkpoint, then a success."""
    first = AttemptTimes(
        asked=0.0,
        queued_s=4.0,
        held=4.5,
        ended=12.0,  # the notice's hook saved at 11.5, then the run left
        hand_back=12.1,
        handed_back=12.5,
        outcome="preemption",
        progress=GangProgress(first_beat=5.5, checkpoint_at=11.5, checkpoint_s=1.0),
    )
    second = AttemptTimes(
        asked=13.0,
        held=13.2,
        ended=20.0,  # the hang is judged at 20: the work after its checkpoint at 16 is lost
        hand_back=20.2,
        handed_back=20.5,
        outcome="hang",
        progress=GangProgress(first_beat=14.0, checkpoint_at=16.0, checkpoint_s=0.5),
    )
    third = AttemptTimes(
        asked=21.0,
        held=21.1,
        ended=25.0,
        hand_back=25.0,
        handed_back=25.3,
        outcome="success",
        progress=GangProgress(first_beat=22.0),
    )
    account = account_of("r2", "resilient", [first, second, third], outcome="success")
    assert spent(account) == {
        "queued": 4.0,
        "reserving": 0.5,
        "starting": 1.0,
        "checkpointing": 1.5,
        "productive": 5.0 + 1.5 + 3.0,
        "lost": 0.5 + 4.0,
        "recovering": 0.1 + (0.5 + 0.2 + 0.8) + 0.2 + (0.5 + 0.1 + 0.9),
        "handing_back": 0.4 + 0.3 + 0.3,
    }
    assert {c: round(s, 3) for c, s in account.lost.items() if s} == {
        "preemption": 0.5,
        "hang": 4.0,
    }
    assert account.wall_s == pytest.approx(25.3) and sums_to_wall(account)
    assert account.attempts == 3 and account.checkpoints == 0  # counts come from ranks


def test_without_heartbeats_a_call_is_start_up_and_a_failed_call_is_lost_and_said() -> None:
    failed = AttemptTimes(0.0, 0.0, 1.0, 6.0, 6.0, 6.5, "host_failure")
    succeeded = AttemptTimes(7.0, 0.0, 7.5, 10.0, 10.0, 10.5, "success")
    account = account_of("r3", "resilient", [failed, succeeded])
    assert spent(account) == {
        "reserving": 1.0,
        "lost": 5.0,
        "handing_back": 1.0,
        "recovering": 0.5 + 0.5 + 2.5,
    }
    assert account.lost["host_failure"] == 5.0 and sums_to_wall(account)
    assert "no heartbeats" in account.notes[0] and "heartbeat()" in account.notes[0]


def test_a_failure_with_beats_but_no_checkpoint_loses_all_its_work_and_says_so() -> None:
    failed = AttemptTimes(0.0, 0.0, 1.0, 9.0, 9.0, 9.0, "failure", GangProgress(first_beat=2.0))
    account = account_of("r4", "resilient", [failed], outcome="gave_up")
    assert spent(account) == {"reserving": 1.0, "starting": 1.0, "lost": 7.0}
    assert account.outcome == "gave_up"
    assert "no checkpoints marked" in account.notes[0]


def test_an_actor_group_starts_until_its_first_call_returns_when_it_sends_no_beats() -> None:
    group = AttemptTimes(0.0, 0.0, 1.0, 30.0, 30.0, 31.0, "success", first_return=5.0)
    group.only_call = False
    account = account_of("r5", "actor_group", [group])
    assert spent(account) == {
        "reserving": 1.0,
        "starting": 4.0,
        "productive": 25.0,
        "handing_back": 1.0,
    }
    assert "no heartbeats" in account.notes[0]


def test_a_retry_that_cannot_reserve_ends_the_account_in_recovery() -> None:
    failed = AttemptTimes(0.0, 0.0, 1.0, 5.0, 5.0, 5.5, "preemption", GangProgress(2.0))
    timed_out = AttemptTimes(asked=6.0, ended=16.0)
    account = account_of("r6", "resilient", [failed, timed_out], outcome="gave_up")
    assert spent(account) == {
        "reserving": 1.0,
        "starting": 1.0,
        "lost": 3.0,
        "handing_back": 0.5,
        "recovering": 0.5 + 10.0,
    }
    assert account.attempts == 1 and sums_to_wall(account)


def test_moments_out_of_order_still_sum_to_the_wall_time() -> None:
    """Hosts' clocks differ from the driver's: a first beat before the hold, or a
    checkpoint after the end, is clipped to its attempt, never counted twice."""
    early = AttemptTimes(10.0, 50.0, 11.0, 20.0, 19.0, 21.0, "hang", GangProgress(5.0, 25.0, 100.0))
    account = account_of("r7", "resilient", [early])
    assert account.wall_s == pytest.approx(11.0) and sums_to_wall(account)
    assert all(s >= 0 for s in account.seconds.values())
    assert spent(account) == {"queued": 1.0, "checkpointing": 9.0, "handing_back": 1.0}


def test_an_account_reads_back_as_written_and_needs_an_attempt() -> None:
    attempt = AttemptTimes(1.0, 0.5, 2.0, 3.0, 3.0, 3.5, "success", GangProgress(2.5))
    account = account_of("r8", "one_shot", [attempt], what="1 x v4 2x2x2", slices=["v4-16-a"])
    data = account.to_dict()
    assert set(data["seconds"]) == set(CATEGORIES)
    assert data["goodput"] == pytest.approx(account.goodput)
    assert Account.from_dict(data) == account
    with pytest.raises(ValueError, match="at least one attempt"):
        account_of("r9", "resilient", [])


def test_the_gang_takes_the_earliest_start_and_the_newest_checkpoint() -> None:
    assert GangProgress.of([None, None]) == GangProgress()
    gang = GangProgress.of(
        [Progress(9.0, 3.0, 8.0, 1.0, 2, 7), None, Progress(9.0, 2.0, 6.0, 1.5, 1, None)]
    )
    assert gang == GangProgress(2.0, 8.0, 1.5, 2, 7)


# --- the worker's side: checkpointed() --------------------------------------------------


def test_a_checkpoint_counts_the_time_since_the_last_beat_and_wakes_the_publisher(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the publisher's period set to a minute, the mark still arrives at once."""
    import tpuslice
    from clusterutil import wait_for

    puts: list[bytes] = []
    monkeypatch.setattr(heartbeats, "BEATS", heartbeats.Beats())
    monkeypatch.setattr(heartbeats, "PUBLISH_S", 60.0)
    monkeypatch.setattr(heartbeats._ray, "kv_put", lambda key, value, ns: puts.append(value))
    monkeypatch.setenv(BEAT_ENV, "beat/run/0")
    tpuslice.heartbeat()
    wait_for(lambda: puts, 5, "the first beat published")
    tpuslice.checkpointed(step=40)
    wait_for(lambda: len(puts) == 2, 5, "the checkpoint published without waiting a period")
    beat, mark = Progress.decode(puts[0]), Progress.decode(puts[1])
    assert beat is not None and mark is not None
    assert mark.first == beat.first and mark.last == mark.checkpoint_at > beat.last
    assert mark.checkpoint_s == pytest.approx(mark.last - beat.last)
    assert (mark.checkpoints, mark.step) == (1, 40)


@pytest.mark.parametrize("step", [-1, 1.5, True, "7"])
def test_a_checkpoint_step_must_be_a_whole_number(step: Any) -> None:
    import tpuslice

    with pytest.raises(InvalidArgumentError, match=r"step must be a whole number"):
        tpuslice.checkpointed(step=step)


def test_a_checkpoint_outside_a_run_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    import tpuslice

    monkeypatch.delenv(BEAT_ENV, raising=False)
    monkeypatch.setattr(heartbeats, "BEATS", heartbeats.Beats())
    tpuslice.checkpointed(3)
    assert heartbeats.BEATS.latest == {}


@pytest.mark.parametrize("raw", [None, b"", b"x", b"1.0 2.0 - 0.0 one -"])
def test_an_unreadable_record_reads_as_none(raw: bytes | None) -> None:
    assert Progress.decode(raw) is None


# --- a resilient run keeps its account ---------------------------------------------------


class Wall:
    """A wall clock that moves only when told (the run's sleeps move it too)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Held:
    def __init__(self, name: str) -> None:
        self.slice_names, self.num_hosts = [name], 2

    def __enter__(self) -> Held:
        return self

    def __exit__(self, *exc: object) -> None:
        WALL.now += 0.5  # the hand-back takes half a second


class Watch:
    def __init__(self, progress: GangProgress) -> None:
        self._progress = progress

    def close(self) -> None:
        pass

    def progress(self) -> GangProgress:
        return self._progress


WALL = Wall()
REQUEST = SliceRequest(topology="2x2x2", accelerator_version="v4")


def run_with(outcomes: list[BaseException | None], *, fail_reserve_on: int = 0) -> ResilientRun:
    """A run whose reservation takes 1 s, whose gang beats 2 s after the hold and works
    10 s, failing with each of ``outcomes`` in turn (None: success)."""
    WALL.now = 1000.0
    script = iter(outcomes)
    count = 0

    def reserve(request: SliceRequest) -> Held:
        nonlocal count
        count += 1
        WALL.now += 1.0
        if count == fail_reserve_on:
            raise ReservationTimeoutError("no v4-16 within 1 s")
        return Held(f"s{count}")

    def watch(config: object, spg: Held, notice_event: object) -> Watch:
        return Watch(GangProgress(first_beat=WALL.now + 2.0))

    def body(spg: Held, watch: object) -> list[str]:
        WALL.now += 12.0
        error = next(script)
        if error is None:
            return ["r0", "r1"]
        if not isinstance(error, Exception):
            raise error  # an interrupt
        raise GangBrokenError(Outcome.HOST_FAILURE, "lost") from error

    def sleep(seconds: float) -> None:
        WALL.now += seconds

    return ResilientRun(
        body,
        REQUEST,
        RetryPolicy(max_retries_preemption=1, backoff_s=(3.0, 3.0)),
        clock=Clock(sleep=sleep),
        reserve=reserve,  # type: ignore[arg-type]
        make_watch=watch,  # type: ignore[arg-type]
        wall=WALL,
    )


def test_a_resilient_run_keeps_an_account_that_sums_to_its_wall_time() -> None:
    run = run_with([rex.NodeDiedError("gone"), None])
    told: list[Account] = []

    def tell(account: Account) -> None:
        told.append(account)
        raise RuntimeError("a user's callback that fails")  # logged; the run still ends

    run.on_account = tell
    assert run.until_done() == ["r0", "r1"]
    account = run.account
    assert account is not None and account.run_id == run.run_id and told == [account]
    assert spent(account) == {
        "reserving": 1.0,
        "starting": 2.0,
        "lost": 10.0,
        "handing_back": 1.0,
        "recovering": 3.0 + 1.0 + 2.0,
        "productive": 10.0,
    }
    assert account.wall_s == pytest.approx(30.0) and account.outcome == "success"
    assert account.lost["host_failure"] == 10.0 and account.attempts == 2
    assert account.slices == ("s2",)  # where it last ran


def test_a_run_that_gives_up_carries_its_account_on_the_error() -> None:
    run = run_with([rex.NodeDiedError("gone"), rex.NodeDiedError("gone again")])
    with pytest.raises(RetriesExhaustedError) as info:
        run.until_done()
    account = info.value.account
    assert account is run.account and account.outcome == "gave_up"
    assert account.seconds["lost"] == 20.0 and sums_to_wall(account)


def test_a_run_whose_retry_cannot_reserve_is_accounted_to_the_timeout() -> None:
    run = run_with([rex.NodeDiedError("gone")], fail_reserve_on=2)
    with pytest.raises(ReservationTimeoutError):
        run.until_done()
    assert run.account is not None and run.account.outcome == "gave_up"
    assert run.account.seconds["recovering"] == pytest.approx(3.0 + 1.0)
    assert run.account.wall_s == pytest.approx(13.5 + 3.0 + 1.0)


def test_an_interrupted_run_is_accounted_up_to_the_interrupt() -> None:
    run = run_with([KeyboardInterrupt()])
    with pytest.raises(KeyboardInterrupt):
        run.until_done()
    assert run.account is not None and run.account.outcome == "interrupted"
    # Interrupted at 13 s: the work so far counts (nothing failed), then the hand-back.
    assert spent(run.account) == {
        "reserving": 1.0,
        "starting": 2.0,
        "productive": 10.0,
        "handing_back": 0.5,
    }
    assert sums_to_wall(run.account) and run.account.notes == ()


# --- the cluster's slice-seconds ---------------------------------------------------------


class Store:
    """Ray's KV store, in memory, as the slice-second count uses it."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def put(self, key: str, value: bytes, namespace: str | None) -> bool:
        existed = key in self.data
        self.data[key] = value
        return existed

    def get(self, key: str, namespace: str | None) -> bytes | None:
        return self.data.get(key)

    def get_many(self, keys: list[str], namespace: str | None) -> dict[str, bytes]:
        return {k: self.data[k] for k in keys if k in self.data}

    def list(self, prefix: str, namespace: str | None) -> list[str]:
        return [k for k in self.data if k.startswith(prefix)]

    def delete(self, key: str, namespace: str | None, *, prefix: bool = False) -> None:
        self.data.pop(key, None)


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Store:
    kv = Store()
    for name, fake in [
        ("kv_put", kv.put),
        ("kv_get", kv.get),
        ("kv_get_many", kv.get_many),
        ("kv_list", kv.list),
        ("kv_delete", kv.delete),
    ]:
        monkeypatch.setattr(slice_seconds._ray, name, fake)
    return kv


def test_a_busy_slice_is_productive_only_while_its_gang_beats() -> None:
    from test_status import mixed_snapshot

    snapshot = mixed_snapshot()  # v6e-16: a, ready; b, busy; c, notice; d, suspect and idle
    fresh, stale = Progress(995.0, 990.0).encode(), Progress(980.0, 970.0).encode()
    beating = slice_seconds.beating_slices(
        {"beat/x/0@v6e-16-b": fresh, "beat/y/0@v5p-32-a": stale, "beat/z/0": fresh}, 1000.0
    )
    assert beating == {"v6e-16-b"}
    states = {n: slice_seconds.slice_state(i, beating) for n, i in snapshot.slices.items()}
    assert [states[f"v6e-16-{x}"] for x in "abcd"] == ["idle", "productive", "notice", "idle"]
    assert states["v5p-32-a"] == "broken"
    assert slice_seconds.slice_state(snapshot.slices["v6e-16-b"], set()) == "busy"
    counted = slice_seconds.slice_seconds_of(snapshot, beating, 5.0)
    assert counted["v6e-16"] == {"idle": 10.0, "productive": 5.0, "notice": 5.0}


def test_slice_seconds_add_up_per_minute_and_read_back_over_a_window(store: Store) -> None:
    from test_status import mixed_snapshot

    wall = Wall()
    wall.now = 60_000.0
    keeper = slice_seconds.SliceSeconds(clock=wall)
    snapshot = mixed_snapshot()
    keeper.add(snapshot, 5.0)
    keeper.add(snapshot, 5.0)
    wall.now += 60.0
    slice_seconds.SliceSeconds(clock=wall).add(snapshot, 5.0)  # a restarted queue: a new keeper
    assert len(store.list(SLICE_SECONDS_KEY_PREFIX, None)) == 2
    wall.now += 30.0
    both = slice_seconds._read_slice_seconds(120.0, wall.now)
    assert both["v6e-16"]["idle"] == 30.0 and both["v6e-16"]["productive"] == 0.0
    assert (
        slice_seconds._read_slice_seconds(30.0, wall.now)["v6e-16"]["idle"] == 10.0
    )  # this minute only
    assert (
        slice_seconds._read_slice_seconds(31.0, wall.now)["v6e-16"]["idle"] == 30.0
    )  # the last one whole
    wall.now += slice_seconds.BUCKETS_KEPT_S + 60.0
    keeper.add(snapshot, 5.0)  # a new minute, a day later: the old minutes go
    assert len(store.list(SLICE_SECONDS_KEY_PREFIX, None)) == 1
    with pytest.raises(ValueError, match="since_s must be above 0"):
        slice_seconds.read_slice_seconds(0)


# --- a one-shot's account, taken before its hand-back ------------------------------------


class FakeReservation:
    """Stands in for a one-shot's reservation: its hand-back forgets what it waited, as a
    real reservation's does."""

    def __init__(self) -> None:
        self.slice_names = ["v4-16-a"]
        self.queued, self.shut = 2.5, False

    def shutdown(self) -> None:
        self.slice_names, self.queued, self.shut = [], 0.0, True


def fake_record(spg: FakeReservation) -> SimpleNamespace:
    """What a one-shot reads of its reservation's record."""
    return SimpleNamespace(request=REQUEST, asked_at=100.0, held_at=103.0, queued_s=spg.queued)


def test_a_one_shot_counts_its_queue_wait_though_its_hand_back_forgets_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tpuslice._run import observe, run

    kept: list[Account] = []
    deleted: list[str] = []
    monkeypatch.setattr(observe, "record_of", fake_record)
    monkeypatch.setattr(goodput, "keep", kept.append)
    monkeypatch.setattr(goodput, "read_progress", lambda keys: GangProgress(first_beat=104.0))
    monkeypatch.setattr(
        observe._ray, "kv_delete", lambda key, ns, prefix=False: deleted.append(key)
    )
    monkeypatch.setattr(observe, "run_ended", lambda *args: None)
    spg = FakeReservation()
    job = run._OneShot([], spg, ("beat/x/", ("beat/x/0@v4-16-a",)))  # type: ignore[arg-type]
    keep = job.hand_back("success")
    assert spg.shut and kept == []  # handed back; the account comes after
    keep()
    (account,) = kept
    assert account.seconds["queued"] == 2.5 and account.seconds["reserving"] == 0.5
    assert account.seconds["starting"] == 1.0 and account.slices == ("v4-16-a",)
    assert deleted == ["beat/x/"]


def test_a_one_shot_whose_moments_cannot_be_read_is_handed_back_all_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tpuslice._run import observe, run

    def unreadable(spg: object) -> object:
        raise RuntimeError("the reservation's record is gone")

    kept: list[Account] = []
    monkeypatch.setattr(observe, "record_of", unreadable)
    monkeypatch.setattr(goodput, "keep", kept.append)
    monkeypatch.setattr(observe, "run_ended", lambda *args: None)
    spg = FakeReservation()
    job = run._OneShot([], spg, ("beat/x/", ("beat/x/0",)))  # type: ignore[arg-type]
    job.hand_back("success")()
    assert spg.shut and kept == []
