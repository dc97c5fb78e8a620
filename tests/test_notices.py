"""Notices from a host's metadata (tpuslice._host.notices): what counts as one, and the watch
loop, against a scripted long-poll and against the simulator's metadata server. No Ray."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from clusterutil import wait_for
from tpuslice._host.metadata import Watched, watch
from tpuslice._host.notices import (
    MAINTENANCE_PATH,
    PREEMPTED_PATH,
    Notice,
    notice_kind,
    notice_period,
    watch_value,
)
from tpuslice._sim.metadata_server import MetadataServer, host_values


def make(kind: str, event: str, since: float) -> Notice:
    deadline = since + (30.0 if kind == "preemption" else 60.0)
    return Notice(kind, event, since, deadline, "n1", "v4-16-a", 1)


def test_what_counts_as_a_notice() -> None:
    assert notice_kind(PREEMPTED_PATH, "TRUE") == "preemption"
    assert notice_kind(PREEMPTED_PATH, "FALSE") is None
    assert notice_kind(MAINTENANCE_PATH, "NONE") is None
    assert notice_kind(MAINTENANCE_PATH, "TERMINATE_ON_HOST_MAINTENANCE") == "maintenance"
    assert notice_kind(MAINTENANCE_PATH, None) is None
    assert (notice_period("preemption"), notice_period("maintenance")) == (30.0, 60.0)


def test_a_notice_says_what_where_and_how_long_is_left() -> None:
    notice = make("preemption", "TRUE", 100.0)
    assert notice.state == "PREEMPTING"
    assert notice.left(110.0) == 20.0 and notice.left(500.0) == 0.0
    assert notice.describe(106.0) == (
        "preemption notice on v4-16-a host 1 (instance/preempted=TRUE), 24 s left"
    )
    assert Notice.from_json(notice.to_json()) == notice
    with pytest.raises(ValueError, match="not a notice"):
        Notice.from_json(b'{"kind": "preemption"}')


class Script:
    """A long-poll that answers from a list, then ends the watch."""

    def __init__(self, answers: list[Watched], stop: threading.Event) -> None:
        self.answers = answers
        self.asked: list[str] = []
        self.stop = stop

    def __call__(self, path: str, etag: str, timeout: float) -> Watched:
        self.asked.append(etag)
        answer = self.answers.pop(0)
        if not self.answers:
            self.stop.set()
        return answer


def run(answers: list[Watched]) -> tuple[list[Notice | None], Script]:
    stop = threading.Event()
    script = Script(answers, stop)
    seen: list[Notice | None] = []
    watch_value(
        PREEMPTED_PATH,
        lambda path, notice: seen.append(notice),
        stop,
        describe=lambda kind, event, since: make(kind, event, since),
        poll=script,
        clock=lambda: 100.0,
    )
    return seen, script


def test_each_change_is_recorded_once_and_each_request_names_the_last_version() -> None:
    seen, script = run(
        [
            Watched("FALSE", "e1", True),
            Watched("FALSE", "e1", True),  # held until the timeout: unchanged
            Watched("TRUE", "e2", True),
            Watched("TRUE", "e2", True),
        ]
    )
    assert seen == [None, make("preemption", "TRUE", 100.0)]
    assert script.asked == ["", "e1", "e1", "e2"]


def test_no_metadata_server_ends_the_watch_at_once() -> None:
    seen, script = run([Watched(None, "", False), Watched("TRUE", "e2", True)])
    assert seen == [] and script.asked == [""]


@pytest.fixture
def server() -> Iterator[MetadataServer]:
    running = MetadataServer(host_values("v4-16-a", 1, "v4-16", "2x2x2")).start()
    try:
        yield running
    finally:
        running.close()


def test_the_watch_follows_the_simulators_server_without_busy_polling(
    server: MetadataServer,
) -> None:
    root = f"http://{server.host}/computeMetadata/v1/"
    stop = threading.Event()
    seen: list[Notice | None] = []
    calls: list[str] = []

    def poll(path: str, etag: str, timeout: float) -> Watched:
        calls.append(etag)
        return watch(path, etag, timeout, root=root)

    thread = threading.Thread(
        target=watch_value,
        args=(PREEMPTED_PATH, lambda path, notice: seen.append(notice), stop),
        kwargs={"describe": lambda kind, event, since: make(kind, event, since), "poll": poll},
        daemon=True,
    )
    thread.start()
    wait_for(lambda: server.held() == 1, 10, "the watch to be held by the server")
    server.set(PREEMPTED_PATH, "TRUE")
    wait_for(lambda: len(seen) == 2, 10, "the notice")
    assert seen[0] is None and seen[1] is not None and seen[1].kind == "preemption"
    stop.set()
    server.close()  # answers the held request; the loop sees stop
    thread.join(10)
    assert not thread.is_alive()
    assert len(calls) <= 4  # one request per change (and the first), not a busy loop


def test_the_cluster_view_drops_notices_left_by_hosts_long_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A preempted host's agent dies with it and cannot delete its record: a reader
    deletes a notice STALE_S past its deadline (and keeps a fresh one)."""
    import time

    from tpuslice._host.notices import STALE_S
    from tpuslice._tpu import _ray
    from tpuslice._view import agents

    now = time.time()
    old = Notice("preemption", "TRUE", now - STALE_S - 60, now - STALE_S - 30, "n1", "s", 0)
    fresh = make("maintenance", "TERMINATE_ON_HOST_MAINTENANCE", now)
    store = {"tpu-notice/n1": old.to_json(), "tpu-notice/n2": fresh.to_json()}
    monkeypatch.setattr(_ray, "kv_list", lambda prefix, ns: sorted(store))
    monkeypatch.setattr(
        _ray, "kv_get_many", lambda keys, ns: {k: store[k] for k in keys if k in store}
    )
    monkeypatch.setattr(_ray, "kv_delete", lambda key, ns: store.pop(key))
    notes = agents.recorded_notes()
    assert notes.owners == {} and notes.notices == {"n2": fresh} and notes.suspects == {}
    assert list(store) == ["tpu-notice/n2"]


def test_a_server_that_cannot_hold_requests_is_asked_every_retry_s_not_in_a_loop() -> None:
    """No ETag (a 404 from a metadata server without the value, as GKE's may be): every
    answer, changed or not, is followed by a RETRY_S pause."""
    from tpuslice._host.notices import RETRY_S

    class Stop(threading.Event):
        def __init__(self) -> None:
            super().__init__()
            self.waits: list[float] = []

        def wait(self, timeout: float | None = None) -> bool:
            self.waits.append(timeout or 0.0)
            return self.is_set()

    stop = Stop()
    answers = [Watched(None, "", True)] * 4
    seen: list[Notice | None] = []

    def poll(path: str, etag: str, timeout: float) -> Watched:
        if len(answers) == 1:
            stop.set()
        return answers.pop()

    watch_value(
        PREEMPTED_PATH,
        lambda path, notice: seen.append(notice),
        stop,
        describe=lambda kind, event, since: make(kind, event, since),
        poll=poll,
    )
    assert seen == [None]  # recorded once
    assert stop.waits == [RETRY_S] * 4  # paused after every answer
