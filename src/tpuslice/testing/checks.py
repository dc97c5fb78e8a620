"""Checks for tests on a (simulated) cluster: no placement group left, every slice idle."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import ray

from tpuslice._reserve.groups import live_placement_groups

if TYPE_CHECKING:
    from tpuslice._view.cluster import SliceInfo

__all__ = [
    "assert_no_placement_groups",
    "assert_slices_ready",
    "live_placement_groups",
    "remove_placement_groups",
]


def assert_no_placement_groups(timeout: float = 10.0) -> None:
    """Fail if any placement group is still alive after a bounded wait, removing the
    leftovers so one leaky test does not fail the ones after it.

    Args:
        timeout: Seconds to wait for groups being removed to go.

    Raises:
        AssertionError: groups are still alive after ``timeout``; the message lists them.
    """
    deadline = time.monotonic() + timeout
    while (live := live_placement_groups()) and time.monotonic() < deadline:
        time.sleep(0.05)
    if not live:
        return
    remove_placement_groups(live)
    described = "; ".join(
        f"{pg['placement_group_id'][:12]} {pg['state']} bundles={list(pg['bundles'].values())}"
        for pg in live
    )
    raise AssertionError(f"{len(live)} placement group(s) left behind: {described}")


def assert_slices_ready(names: Iterable[str] | None = None, timeout: float = 30.0) -> None:
    """Wait (bounded) until every slice is ready. A hand-back ends before Ray's view of
    the freed hosts catches up, so the next test could otherwise find a slice busy.

    Args:
        names: The slices to wait for; ``None`` for every slice Ray knows.
        timeout: Seconds to wait.

    Raises:
        AssertionError: some slice is still not ready; the message says why.
    """
    waiting = slices_not_ready(names, timeout)
    if waiting:
        raise AssertionError(f"slices not ready after {timeout:.0f} s: {describe(waiting)}")


def slices_not_ready(names: Iterable[str] | None = None, timeout: float = 30.0) -> list[SliceInfo]:
    """Wait as :func:`assert_slices_ready` does; return the slices still not ready."""
    from tpuslice._view.cluster import SliceState, read_snapshot

    wanted = None if names is None else set(names)
    deadline = time.monotonic() + timeout
    while True:
        waiting = [
            s
            for s in read_snapshot().slices.values()
            if s.state is not SliceState.READY and (wanted is None or s.name in wanted)
        ]
        if not waiting or time.monotonic() > deadline:
            return waiting
        time.sleep(0.05)


TPUSLICE_IDLE_ACTORS = frozenset({"HostAgent"})
"""tpuslice's actors that hold no Ray resources outside a placement group."""


def holders(info: SliceInfo) -> list[str]:
    """The live actors on a slice's hosts but tpuslice's resource-free ones (with no
    placement group alive, whatever holds its resources), as ``Squatter pid 42 on host 1``."""
    from tpuslice._tpu import _ray

    workers = {h.node_id: w for w, h in info.hosts.items()}
    return [
        f"{name} pid {pid} on host {workers[node]}"
        for name, node, pid in _ray.alive_actors_on(workers)
        if name not in TPUSLICE_IDLE_ACTORS
    ]


def held_by_nothing(info: SliceInfo) -> bool:
    """Whether a slice is busy only in Ray's count: no TPU owner and no :func:`holders`.
    With no group alive, Ray still counts a removed group's resources (removed while
    being placed, or its clean-up failed); only restarting the hosts frees them."""
    from tpuslice._view.cluster import SliceState

    if info.state is not SliceState.BUSY or any(h.tpu_owner for h in info.hosts.values()):
        return False
    return not holders(info)


def describe(slices: Iterable[SliceInfo]) -> str:
    """``v4-16-a busy: 2/2 hosts in use; ...``: each slice with its state and reason."""
    return "; ".join(f"{s.name} {s.state.value}: {s.reason}" for s in slices)


def remove_placement_groups(groups: Iterable[dict[str, Any]] | None = None) -> int:
    """Remove the given placement groups, for cleaning up after code that leaks them.

    Args:
        groups: Rows of ``ray.util.placement_group_table()``; ``None`` for every live one.

    Returns:
        How many groups were removed.
    """
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    rows = list(live_placement_groups() if groups is None else groups)
    for row in rows:
        remove_placement_group(
            PlacementGroup(ray.PlacementGroupID.from_hex(row["placement_group_id"]))
        )
    return len(rows)
