"""The reservation's handle and its record, without Ray: a handle pickles and compares by
its record; a copy in another process hands back only its groups; one actor group per
held slice, its hold taken under a lock before any actor starts."""

from __future__ import annotations

import dataclasses
import pickle
import threading
from collections.abc import Iterator

import pytest

from tpuslice._reserve import reserve
from tpuslice._reserve.request import SliceRequest
from tpuslice._reserve.reserve import (
    Hold,
    Reserved,
    SliceHandle,
    actor_group_of,
    drop_actor_group,
    hold_for_actor_group,
)
from tpuslice._tpu._connection import connection
from tpuslice.errors import InvalidArgumentError


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[Reserved]:
    """A record this process holds, with no slices (nothing of Ray is touched)."""
    request = SliceRequest(topology="2x2x2", accelerator_version="v4")
    record = Reserved(
        key="k1",
        home=reserve.PROCESS,
        request=dataclasses.replace(request, resources_per_bundle={"CPU": 1, "TPU": 4}),
        plan=request.plan,
        slices=(),
        combined_pg=None,
        asked_at=0.0,
        held_at=0.0,
        queued_s=0.0,
        arrival=None,
        recorded=False,
    )
    monkeypatch.setitem(connection().part(reserve.Holds), record.key, Hold())
    yield record


def test_a_second_group_is_refused_until_the_first_drops_its_hold(held: Reserved) -> None:
    first, second = object(), object()
    hold_for_actor_group(held, first)
    with pytest.raises(InvalidArgumentError, match="already has a SliceActorGroup"):
        hold_for_actor_group(held, second)
    drop_actor_group(held, second)  # not its hold: left alone
    assert actor_group_of(held) is first
    drop_actor_group(held, first)
    drop_actor_group(held, first)  # idempotent
    hold_for_actor_group(held, second)
    assert actor_group_of(held) is second


def test_of_many_groups_made_at_once_exactly_one_holds_the_slice(held: Reserved) -> None:
    won: list[object] = []
    start = threading.Barrier(8)

    def make() -> None:
        me = object()
        start.wait()
        try:
            hold_for_actor_group(held, me)
        except InvalidArgumentError:
            return
        won.append(me)

    threads = [threading.Thread(target=make) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert len(won) == 1 and actor_group_of(held) is won[0]


def test_a_handle_pickles_with_its_record_and_compares_by_it(held: Reserved) -> None:
    handle = SliceHandle(held)
    copy = pickle.loads(pickle.dumps(handle))
    assert copy == handle and hash(copy) == hash(handle) and copy is not handle
    assert copy.num_hosts == 2 and not copy.is_shut_down  # this process holds it
    assert copy.slice_names == [] and dict(held.request.resources_per_bundle or {})["TPU"] == 4
    assert SliceHandle(dataclasses.replace(held, key="k2")) != handle


def test_a_copy_from_another_process_is_read_only_and_its_hand_back_never_raises(
    held: Reserved,
) -> None:
    copy = dataclasses.replace(held, key="k3", home="another process")
    SliceHandle(copy).shutdown()  # Ray is not connected here: nothing to remove, no error
    assert SliceHandle(copy).is_shut_down  # unknown without Ray: taken as given back
    hold_for_actor_group(copy, object())  # no hold in this process: nothing to take
    assert actor_group_of(copy) is None and reserve.hold_of(held) is not None


def test_a_hand_back_takes_the_hold_out_so_a_second_does_nothing(
    held: Reserved, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reserve.ray, "is_initialized", lambda: False)
    SliceHandle(held).shutdown()
    assert reserve.hold_of(held) is None and SliceHandle(held).is_shut_down
    SliceHandle(held).shutdown()  # idempotent
