"""What a running gang is watched for (tpuslice._run.watchdog), and how the resilient loop uses
it: hangs from heartbeats, notices with the user's hook, evidence for a lost host. Pure:
the KV readers are replaced and the clock is a counter."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

import pytest

from tpuslice._host.heartbeats import BEAT_ENV, Progress
from tpuslice._host.notices import Notice
from tpuslice._reserve.request import SliceRequest
from tpuslice._run.observe import AttemptEvent, Outcome
from tpuslice._run.resilient import (
    GangBrokenError,
    ResilientRun,
    RetryPolicy,
    judged,
    watched,
)
from tpuslice._run.watchdog import (
    CHECK_S,
    NOTICE_MARGIN_S,
    AttemptWatch,
    Broken,
    WatchConfig,
    find_hang,
)
from tpuslice._tpu.clock import Clock
from tpuslice.errors import InvalidArgumentError
from tpuslice.record.goodput import GangProgress

# --- find_hang ----------------------------------------------------------------------------


def test_no_hang_while_every_rank_beats_or_nothing_is_watched() -> None:
    assert find_hang([99.0, 98.0], 100.0, 0.0, 5.0, None) is None
    assert find_hang([10.0, None], 100.0, 0.0, None, None) is None


def test_a_rank_silent_past_the_timeout_while_others_beat_is_a_hang() -> None:
    hang = find_hang([99.0, 90.0, 98.5], 100.0, 0.0, 5.0, None)
    assert hang is not None and hang.ranks == (1,) and not hang.startup
    assert hang.reason == (
        "1 rank(s) silent for up to 10.0 s (heartbeat_timeout_s=5) while 2 other(s) still beat"
    )


def test_every_rank_silent_is_a_hang_too() -> None:
    """A collective stuck on one host blocks the others: all go silent together."""
    hang = find_hang([80.0, 81.0], 100.0, 0.0, 5.0, None)
    assert hang is not None and hang.ranks == (0, 1)
    assert hang.reason.endswith("as did every other rank")


def test_a_rank_that_never_beats_is_stuck_starting_only_after_the_startup_timeout() -> None:
    assert find_hang([99.0, None], 100.0, 90.0, 5.0, 20.0) is None  # 10 s in: still starting
    assert find_hang([99.0, None], 100.0, 90.0, 5.0, None) is None  # not watched
    hang = find_hang([99.0, None], 100.0, 70.0, 5.0, 20.0)
    assert hang is not None and hang.ranks == (1,) and hang.startup
    assert "startup_timeout_s=20" in hang.reason


@pytest.mark.parametrize("value", [0, -1.0, float("inf"), float("nan"), "5", True])
def test_bad_timeouts_are_refused(value: object) -> None:
    with pytest.raises(InvalidArgumentError, match="heartbeat_timeout_s must be"):
        WatchConfig(heartbeat_timeout_s=value)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="startup_timeout_s must be"):
        WatchConfig(startup_timeout_s=value)  # type: ignore[arg-type]


# --- AttemptWatch ---------------------------------------------------------------------------


class World:
    """The KV store as the watch reads it, and a clock."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.notices: dict[str, Notice] = {}
        self.beats: dict[str, bytes] = {}
        self.forgotten: list[str] = []
        self.events: list[Notice] = []

    def read_notices(self, nodes: Sequence[str]) -> Mapping[str, Notice]:
        return {n: self.notices[n] for n in nodes if n in self.notices}

    def read_beats(self, keys: Sequence[str]) -> Mapping[str, bytes]:
        return {k: self.beats[k] for k in keys if k in self.beats}

    def watch(self, config: WatchConfig) -> AttemptWatch:
        def on_event(notice: Notice) -> str:
            self.events.append(notice)
            return f"event for {notice.slice_name}"

        return AttemptWatch(
            config,
            ["n0", "n1"],
            ["rank 0 (v4-16-a host 0)", "rank 1 (v4-16-a host 1)"],
            on_event,
            read_notices=self.read_notices,
            read_beats=self.read_beats,
            forget=self.forgotten.append,
            clock=lambda: self.now,
        )


def notice(node: str = "n1", left: float = 30.0, now: float = 1000.0) -> Notice:
    return Notice("preemption", "TRUE", now, now + left, node, "v4-16-a", 1)


def test_every_rank_gets_a_key_but_only_a_watched_gang_can_hang() -> None:
    """The keys serve the goodput account as well, so they are always given; a gang whose
    run set no timeout is never judged hung, however long it is silent."""
    world = World()
    unwatched = world.watch(WatchConfig())
    keys = [unwatched.rank_env(r)[BEAT_ENV] for r in (0, 1)]
    assert keys[0].startswith(unwatched.prefix) and keys[1].endswith("/1")
    world.beats = {keys[0]: b"1000.0", keys[1]: b"1000.0"}
    world.now += 3600
    unwatched.check()  # no hang
    assert unwatched.progress().first_beat == 1000.0  # read for the goodput account
    unwatched.close()
    assert world.forgotten == [unwatched.prefix]


def test_an_unwatched_gang_that_published_nothing_deletes_nothing() -> None:
    world = World()
    quiet = world.watch(WatchConfig())
    assert quiet.progress() == GangProgress()
    quiet.close()  # no key was written: no call to the store
    assert world.forgotten == []


def test_the_gang_progress_takes_the_earliest_first_beat_and_the_newest_checkpoint() -> None:
    world = World()
    watch = world.watch(WatchConfig())
    keys = [watch.rank_env(r)[BEAT_ENV] for r in (0, 1)]
    assert watch.progress() == GangProgress()  # nothing published yet
    world.beats = {
        keys[0]: Progress(1010.0, 1002.0, 1008.0, 1.5, 2, 200).encode(),
        keys[1]: Progress(1010.0, 1001.0, 1007.0, 2.0, 2, 100).encode(),
    }
    assert watch.progress() == GangProgress(1001.0, 1008.0, 2.0, 2, 200)
    world.beats[keys[1]] = b"1011.0"  # a bare beat, as an older writer publishes it
    assert watch.progress() == GangProgress(1002.0, 1008.0, 1.5, 2, 200)


def test_a_silent_rank_breaks_the_gang_naming_its_host() -> None:
    world = World()
    watch = world.watch(WatchConfig(heartbeat_timeout_s=5.0))
    beat = {r: watch.rank_env(r)[BEAT_ENV] for r in (0, 1)}
    world.beats = {beat[0]: b"1000.0", beat[1]: b"1000.0"}
    watch.check()  # both beat
    world.now += 10
    world.beats[beat[0]] = b"1009.5"
    with pytest.raises(Broken) as info:
        watch.check()
    assert info.value.kind == "hang"
    assert info.value.cause == "silent: rank 1 (v4-16-a host 1)"
    assert "while 1 other(s) still beat" in info.value.evidence


def test_checks_are_spaced_by_check_s() -> None:
    world = World()
    watch = world.watch(WatchConfig())
    watch.check()
    world.notices = {"n1": notice()}
    world.now += CHECK_S / 2
    watch.check()  # too soon to read again
    world.now += CHECK_S
    with pytest.raises(Broken):
        watch.check()


def test_a_notice_emits_the_event_runs_the_hook_then_leaves() -> None:
    world = World()
    hooked: list[object] = []
    watch = world.watch(WatchConfig(on_notice=hooked.append))
    world.notices = {"n1": notice()}
    with pytest.raises(Broken) as info:
        watch.check()
    assert world.events == [notice()]
    assert hooked == ["event for v4-16-a"]
    assert info.value.kind == "notice" and "30 s left" in info.value.cause


def test_a_slow_hook_is_left_at_the_deadline_less_the_margin() -> None:
    world = World()
    release = threading.Event()
    watch = world.watch(WatchConfig(on_notice=lambda event: release.wait(60)))
    world.notices = {"n0": notice("n0", left=NOTICE_MARGIN_S + 0.2)}
    clock = Clock()
    started = clock.now()
    with pytest.raises(Broken):
        watch.check()
    waited = clock.now() - started
    release.set()
    assert 0.1 < waited < 5  # about 0.2 s, not the hook's 60


def test_a_hook_that_raises_does_not_stop_the_run_from_leaving() -> None:
    world = World()

    def broken_hook(event: object) -> None:
        raise RuntimeError("checkpoint failed")

    watch = world.watch(WatchConfig(on_notice=broken_hook))
    world.notices = {"n0": notice("n0")}
    with pytest.raises(Broken, match="left before the hosts go"):
        watch.check()


def test_a_lost_host_is_a_preemption_only_with_a_notice() -> None:
    world = World()
    watch = world.watch(WatchConfig())
    lost = GangBrokenError(Outcome.HOST_FAILURE, "rank 1 (v4-16-a host 1): NodeDiedError")
    plain = judged(lost, watch)
    assert plain.outcome is Outcome.HOST_FAILURE
    assert plain.evidence == "no preemption or maintenance notice on any host of the attempt"
    world.notices = {"n1": notice(left=30.0, now=990.0)}  # recorded before the host died
    warned = judged(lost, watch)
    assert warned.outcome is Outcome.PREEMPTION and warned.cause == lost.cause
    assert warned.evidence.startswith("notice before the loss: preemption notice on v4-16-a")
    user = GangBrokenError(Outcome.FAILURE, "ValueError: bad")
    assert judged(user, watch) is user


# --- the loop with a watch ------------------------------------------------------------------


class FakeSlices:
    def __init__(self, name: str) -> None:
        self.slice_names, self.num_hosts = [name], 2

    def __enter__(self) -> FakeSlices:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def test_the_loop_reports_a_notice_then_retries_it_as_a_preemption_with_evidence() -> None:
    """Attempt 1: a notice stands; the run emits ``notice``, calls on_notice, leaves
    (preemption, evidence: the metadata value); attempt 2 hangs; attempt 3 succeeds."""
    world = World()
    events: list[AttemptEvent] = []
    notices: list[AttemptEvent] = []
    count = [0]

    def reserve(request: SliceRequest) -> FakeSlices:
        count[0] += 1
        return FakeSlices(f"s{count[0]}")

    def body(spg: FakeSlices, watch: AttemptWatch) -> list[str]:
        if spg.slice_names == ["s1"]:
            world.notices = {"n1": notice()}
        elif spg.slice_names == ["s2"]:
            world.notices = {}
            world.now += 60  # nobody beat: stuck starting
        else:
            return ["ok"]
        world.now += CHECK_S
        watched(watch)
        raise AssertionError("the watch should have broken the gang")

    run = ResilientRun(
        body,  # type: ignore[arg-type]
        SliceRequest(topology="2x2x2", accelerator_version="v4"),
        RetryPolicy(max_retries_preemption=1, max_retries_hang=1),
        events.append,
        Clock(sleep=lambda s: None),
        reserve=reserve,  # type: ignore[arg-type]
        watching=WatchConfig(startup_timeout_s=30.0, on_notice=notices.append),
        make_watch=lambda config, spg, notice_event: world.watch(config),  # type: ignore[arg-type]
    )
    world.events = []
    assert run.until_done() == ["ok"]
    assert [(e.kind, e.outcome) for e in events] == [
        ("started", None),
        ("failed", Outcome.PREEMPTION),
        ("started", None),
        ("failed", Outcome.HANG),
        ("started", None),
        ("succeeded", None),
    ]
    assert [r.outcome for r in run.history] == [Outcome.PREEMPTION, Outcome.HANG]
    assert run.history[0].evidence == "TRUE"
    assert run.history[1].cause == (
        "stuck starting: rank 0 (v4-16-a host 0), rank 1 (v4-16-a host 1)"
    )
    assert len(notices) == 1  # the hook got the run's event


def test_run_resilient_hands_its_watch_and_budgets_to_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What run_resilient is given reaches the loop: the heartbeat and start-up bounds
    and the hook its gangs are watched with, and each outcome's budget."""
    import ray

    import tpuslice

    @ray.remote
    def work() -> int:
        return 1

    def hook(event: object) -> None:
        pass

    runs: list[ResilientRun] = []

    def until_done(run: ResilientRun) -> list[str]:
        runs.append(run)
        return ["ok"]

    monkeypatch.setattr(ResilientRun, "until_done", until_done)
    assert tpuslice.run_resilient(
        work,
        topology="2x2x2",
        accelerator_version="v4",
        max_retries_failure=4,
        max_retries_preemption=3,
        max_retries_host_failure=1,
        max_retries_hang=2,
        on_notice=hook,
        heartbeat_timeout_s=2.0,
        startup_timeout_s=8.0,
    ) == ["ok"]
    (run,) = runs
    assert run.watching == WatchConfig(
        heartbeat_timeout_s=2.0, startup_timeout_s=8.0, on_notice=hook
    )
    outcomes = (Outcome.FAILURE, Outcome.PREEMPTION, Outcome.HOST_FAILURE, Outcome.HANG)
    assert [run.policy.budget(o) for o in outcomes] == [4, 3, 1, 2]


def test_the_notice_event_describes_itself() -> None:
    event = AttemptEvent(
        "notice",
        1,
        ("v4-16-a",),
        Outcome.PREEMPTION,
        "preemption notice on v4-16-a host 1 (instance/preempted=TRUE), 30 s left",
        "on_notice, then leave the slices and retry on others",
        4.0,
        evidence="TRUE on v4-16-a host 1",
    )
    assert event.describe() == (
        "attempt 1 on v4-16-a: notice: preemption notice on v4-16-a host 1 "
        "(instance/preempted=TRUE), 30 s left; next: on_notice, then leave the slices and "
        "retry on others"
    )
    failed = AttemptEvent(
        "failed", 1, ("a",), Outcome.HOST_FAILURE, "x", "retry", 1.0, evidence="no notice"
    )
    assert failed.describe().endswith("[evidence: no notice]")


# --- tpuslice.heartbeat -----------------------------------------------------------------------


def test_heartbeat_is_the_function_and_does_nothing_outside_a_watched_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import tpuslice
    from tpuslice._host import heartbeats

    assert tpuslice.heartbeat is heartbeats.heartbeat  # not shadowed by a module
    monkeypatch.delenv(BEAT_ENV, raising=False)
    monkeypatch.setattr(heartbeats, "BEATS", heartbeats.Beats())
    tpuslice.heartbeat()
    assert heartbeats.BEATS.latest == {}


def test_a_beat_is_noted_in_memory_and_published_in_the_background(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import tpuslice
    from clusterutil import wait_for
    from tpuslice._host import heartbeats

    puts: list[tuple[str, bytes, str | None]] = []
    monkeypatch.setattr(heartbeats, "BEATS", heartbeats.Beats())
    monkeypatch.setattr(
        heartbeats._ray, "kv_put", lambda key, value, ns: puts.append((key, value, ns))
    )
    monkeypatch.setenv(BEAT_ENV, "beat/run/0")
    tpuslice.heartbeat()
    assert list(heartbeats.BEATS.latest) == ["beat/run/0"]  # noted at once, no call made
    wait_for(lambda: puts, 5, "the beat published")
    assert puts[0][0] == "beat/run/0" and puts[0][2] == "tpuslice"
    assert heartbeats.Progress.decode(puts[0][1]) == heartbeats.BEATS.latest["beat/run/0"]


def test_a_beat_of_a_call_that_ended_is_not_published(monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver deletes an attempt's keys when it ends; a late publish would leave
    one behind, so beats of ended calls are forgotten instead."""
    from tpuslice._host import heartbeats

    puts: list[str] = []
    beats = heartbeats.Beats()
    beats.latest.update(
        {
            "beat/a/0": heartbeats.Progress(1.0e12, 1.0e12),
            "beat/b/0": heartbeats.Progress(1.0e12, 1.0e12),
        }
    )
    monkeypatch.setattr(heartbeats._ray, "kv_put", lambda key, value, ns: puts.append(key))
    monkeypatch.setenv(BEAT_ENV, "beat/b/0")  # the call of beat/a/0 has ended
    sent: dict[str, heartbeats.Progress] = {}
    beats.publish_due(sent)
    beats.publish_due(sent)  # unchanged: not published again
    assert puts == ["beat/b/0"] and list(beats.latest) == ["beat/b/0"]
