"""Checks for tests that use a (simulated) cluster: no placement group left behind."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import ray

from tpuslice._reserve.groups import live_placement_groups

__all__ = ["assert_no_placement_groups", "live_placement_groups", "remove_placement_groups"]


def assert_no_placement_groups(timeout: float = 10.0) -> None:
    """Fail if any placement group is still alive after a bounded wait; removes the
    leftovers first so one leaky test does not fail the ones after it.

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


def remove_placement_groups(groups: Iterable[dict[str, Any]] | None = None) -> int:
    """Remove the given placement-group table rows (default: every live one); return how
    many. For cleaning up after code that leaks, such as Ray 2.60's one-shot run_on_slice.

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
