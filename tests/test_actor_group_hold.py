"""One actor group per held slice: the hold is taken under a lock, before any actor
starts, so two groups made at once cannot both own the slice's TPUs. No Ray."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from tpuslice._reserve.reserve import Plumbing
from tpuslice.errors import InvalidArgumentError


def held() -> Any:
    return SimpleNamespace(_actor_group=None, _actor_group_lock=threading.Lock())


def test_a_second_group_is_refused_until_the_first_drops_its_hold() -> None:
    spg = held()
    plumbing, first, second = Plumbing(spg), object(), object()
    plumbing.hold_for_actor_group(first)
    with pytest.raises(InvalidArgumentError, match="already has a SliceActorGroup"):
        plumbing.hold_for_actor_group(second)
    plumbing.drop_actor_group(second)  # not its hold: left alone
    assert plumbing.actor_group is first
    plumbing.drop_actor_group(first)
    plumbing.drop_actor_group(first)  # idempotent
    plumbing.hold_for_actor_group(second)
    assert plumbing.actor_group is second


def test_of_many_groups_made_at_once_exactly_one_holds_the_slice() -> None:
    spg = held()
    won: list[object] = []
    start = threading.Barrier(8)

    def make() -> None:
        me = object()
        start.wait()
        try:
            Plumbing(spg).hold_for_actor_group(me)
        except InvalidArgumentError:
            return
        won.append(me)

    threads = [threading.Thread(target=make) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert len(won) == 1 and spg._actor_group is won[0]
