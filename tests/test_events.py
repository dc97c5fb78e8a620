"""The slice timeline's pure parts: events, keys, trimming, and the background writer
against an in-memory store."""

from __future__ import annotations

import threading

import pytest

from tpuslice.record import events
from tpuslice.record.events import EventWriter, SliceEvent, event_key, keys_to_trim


class Store:
    """A dict standing in for Ray's KV store; ``fail`` makes every call raise."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.fail = False
        self.lock = threading.Lock()

    def put(self, key: str, value: bytes) -> None:
        self._check()
        with self.lock:
            self.data[key] = value

    def list(self, prefix: str) -> list[str]:
        self._check()
        with self.lock:
            return [k for k in self.data if k.startswith(prefix)]

    def delete(self, key: str) -> None:
        self._check()
        with self.lock:
            self.data.pop(key, None)

    def _check(self) -> None:
        if self.fail:
            raise ConnectionError("GCS unreachable")

    def writer(self) -> EventWriter:
        return EventWriter(self.put, self.list, self.delete)

    def events(self) -> list[SliceEvent]:
        import json

        return [SliceEvent.from_dict(json.loads(self.data[k])) for k in sorted(self.data)]


def test_an_event_survives_its_round_trip() -> None:
    event = SliceEvent(
        12.5, "reserved", ("v4-16-a",), "1 x v4 2x2x2", "01000000", 0.25, "granted", "x"
    )
    assert SliceEvent.from_dict(event.to_dict()) == event


@pytest.mark.parametrize(
    ("event", "line"),
    [
        (
            SliceEvent(0, "reserved", ("v4-16-a",), "1 x v4 2x2x2", seconds=0.4, outcome="granted"),
            "reserved v4-16-a (1 x v4 2x2x2) after 0.4 s: granted",
        ),
        (
            SliceEvent(0, "released", ("a", "b"), seconds=12.0),
            "released a, b held 12.0 s",
        ),
        (
            SliceEvent(
                0, "timed_out", what="2 x v6e 4x4", seconds=5, outcome="timed_out", detail="3rd"
            ),
            "timed out (2 x v6e 4x4) after 5.0 s; 3rd",
        ),
    ],
)
def test_describe_reads_as_one_line(event: SliceEvent, line: str) -> None:
    assert event.describe() == line


def test_keys_sort_by_time_even_across_writers() -> None:
    early = event_key(SliceEvent(99.5, "run"), "ffff", 7)
    late = event_key(SliceEvent(100.0, "run"), "0000", 0)
    assert sorted([late, early]) == [early, late]
    assert event_key(SliceEvent(5.0, "run"), "ab", 2) < event_key(SliceEvent(5.0, "run"), "ab", 10)


def test_only_the_oldest_beyond_the_limit_are_trimmed() -> None:
    keys = [f"event/{i:03d}" for i in (5, 1, 4, 2, 3)]
    assert keys_to_trim(keys, keep=3) == ["event/001", "event/002"]
    assert keys_to_trim(keys, keep=10) == []


def test_the_writer_writes_in_order_and_flush_waits_for_it() -> None:
    store = Store()
    writer = store.writer()
    for n in range(5):
        writer.record(SliceEvent(float(n), "run", detail=str(n)))
    assert writer.flush(timeout_s=10)
    assert [e.detail for e in store.events()] == ["0", "1", "2", "3", "4"]


def test_the_store_is_kept_to_the_newest_events() -> None:
    store = Store()
    writer = EventWriter(store.put, store.list, store.delete, keep=4, trim_every_s=0)
    for n in range(10):
        writer.record(SliceEvent(float(n), "run", detail=str(n)))
    assert writer.flush(timeout_s=10)
    assert [e.detail for e in store.events()] == ["6", "7", "8", "9"]


def test_an_unreachable_store_drops_events_without_raising() -> None:
    store = Store()
    store.fail = True
    writer = store.writer()
    writer.record(SliceEvent(1.0, "run"))
    assert writer.flush(timeout_s=10)  # done: dropped, not stuck
    store.fail = False
    writer.record(SliceEvent(2.0, "run", detail="after"))
    assert writer.flush(timeout_s=10)
    assert [e.detail for e in store.events()] == ["after"]


def test_a_put_failing_any_way_drops_that_event_and_the_writer_lives_on() -> None:
    store = Store()
    calls = []

    def put(key: str, value: bytes) -> None:
        calls.append(key)
        if len(calls) == 1:  # what Ray raises when its worker was shut down
            raise AttributeError("'NoneType' object has no attribute 'internal_kv_put'")
        store.put(key, value)

    writer = EventWriter(put, store.list, store.delete)
    writer.record(SliceEvent(1.0, "run", detail="lost"))
    assert writer.flush(timeout_s=10)
    writer.record(SliceEvent(2.0, "run", detail="kept"))
    assert writer.flush(timeout_s=10)
    assert [e.detail for e in store.events()] == ["kept"]
    assert writer.dropped == 1


def test_observing_never_raises_into_the_work(monkeypatch: pytest.MonkeyPatch) -> None:
    from tpuslice._reserve import observe as reserve_observe
    from tpuslice._run import observe as run_observe

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(events, "record", broken)
    reserve_observe.released(["v4-16-a"], 3.0)  # e.g. in the middle of a hand-back
    run_observe.run_ended("one_shot", "success", 1.0)  # no exception from either


def test_record_rejects_an_unknown_kind() -> None:
    with pytest.raises(ValueError, match="not one of"):
        events.record("exploded")


def test_read_events_rejects_a_bad_limit() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        events.read_events(0)


def test_a_closed_writer_wrote_what_was_pending_and_its_thread_ended() -> None:
    store = Store()
    writer = store.writer()
    writer.record(SliceEvent(1.0, "run", detail="pending"))
    thread = writer._thread
    writer.close()
    assert [e.detail for e in store.events()] == ["pending"]
    assert thread is not None
    thread.join(timeout=10)
    assert not thread.is_alive()
    writer.record(SliceEvent(2.0, "run", detail="late"))  # its connection is gone
    assert writer.dropped == 1 and writer._thread is thread


def test_a_dropped_writer_writes_nothing_more() -> None:
    store = Store()
    writer = store.writer()
    writer.drop()
    writer.record(SliceEvent(1.0, "run"))
    assert writer.flush(timeout_s=1) and store.events() == [] and writer.dropped == 1
