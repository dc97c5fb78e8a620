"""The cluster-wide ``claiming/<slice>`` records as Ray's operations keep them, against a
KV store in memory (the test-and-set is Ray's: a put that leaves an existing key)."""

from __future__ import annotations

import pytest

from tpuslice import _ray
from tpuslice._reserve.ops import RAY_OPS, ClaimingRecord
from tpuslice._tpu.keys import CLAIMING_KEY_PREFIX

KEY = CLAIMING_KEY_PREFIX + "v6e-16-a"


class Store:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.data: dict[str, bytes] = {}
        self.on_get: list[str] = []
        monkeypatch.setattr(_ray, "kv_put", self.put)
        monkeypatch.setattr(_ray, "kv_get", self.get)
        monkeypatch.setattr(_ray, "kv_delete", lambda key, ns: self.data.pop(key, None))

    def put(self, key: str, value: bytes, ns: str | None, *, overwrite: bool = True) -> bool:
        existed = key in self.data
        if overwrite or not existed:
            self.data[key] = value
        return existed

    def get(self, key: str, ns: str | None) -> bytes | None:
        if self.on_get:
            self.data.pop(self.on_get.pop(), None)  # deleted between the put and the read
        return self.data.get(key)

    def by(self) -> str:
        record = ClaimingRecord.parse(self.data.get(KEY))
        assert record is not None
        return record.by


def test_the_first_claim_stands_and_a_second_one_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = Store(monkeypatch)
    assert RAY_OPS.mark_claiming("v6e-16-a", "mine", 10.0)
    assert not RAY_OPS.mark_claiming("v6e-16-a", "theirs", 10.0)
    assert RAY_OPS.mark_claiming("v6e-16-a", "mine", 10.0)  # its own record
    assert store.by() == "mine"
    RAY_OPS.unmark_claiming("v6e-16-a", "mine")
    assert store.data == {}


@pytest.mark.parametrize("standing", [ClaimingRecord("dead", 0.0).to_json(), b"not json"])
def test_a_stale_or_unreadable_record_is_taken_over(
    monkeypatch: pytest.MonkeyPatch, standing: bytes
) -> None:
    store = Store(monkeypatch)
    store.data[KEY] = standing
    assert RAY_OPS.mark_claiming("v6e-16-a", "mine", 10.0)
    assert store.by() == "mine"


def test_a_record_deleted_between_the_put_and_the_read_is_written_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = Store(monkeypatch)
    store.data[KEY] = ClaimingRecord("theirs", 1e12).to_json()  # fresh for a long while
    store.on_get.append(KEY)
    assert RAY_OPS.mark_claiming("v6e-16-a", "mine", 10.0)
    assert store.by() == "mine"


def test_without_a_store_the_claim_goes_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    def unreachable(*args: object, **kwargs: object) -> bool:
        raise ConnectionError("Ray is not connected")

    monkeypatch.setattr(_ray, "kv_put", unreachable)
    monkeypatch.setattr(_ray, "kv_delete", unreachable)
    assert RAY_OPS.mark_claiming("v6e-16-a", "mine", 10.0)
    RAY_OPS.unmark_claiming("v6e-16-a", "mine")  # no error either
