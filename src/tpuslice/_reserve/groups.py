"""Small helpers over Ray placement groups: remove idempotently, wait for several."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from tpuslice._host.context import HostContext

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RankPlacement:
    """Where one rank of a held reservation runs: its context, its bundle (index
    ``bundle`` in ``group``), and the ``TPU`` the bundle holds."""

    context: HostContext
    group: PlacementGroup
    bundle: int
    tpu: float

    def strategy(self) -> PlacementGroupSchedulingStrategy:
        """Ray's scheduling strategy that puts work in this rank's bundle."""
        return PlacementGroupSchedulingStrategy(
            placement_group=self.group, placement_group_bundle_index=self.bundle
        )

    def task_options(self) -> dict[str, Any]:
        """Ray's options for one task of this rank, as Ray 2.60's ``run_on_slice`` gives
        them; never retried (a retried task would run outside its gang)."""
        return {
            "num_cpus": 0,
            "resources": {"TPU": self.tpu},
            "max_retries": 0,
            "scheduling_strategy": self.strategy(),
        }


def live_placement_groups() -> list[dict[str, Any]]:
    """Placement groups of the connected cluster that are not removed.

    Returns:
        Their rows of ``ray.util.placement_group_table()``.
    """
    table = ray.util.placement_group_table()
    return [pg for pg in table.values() if pg.get("state") != "REMOVED"]


def remove_group(pg: PlacementGroup | None) -> None:
    """Remove a placement group; one already gone, or ``None``, is fine."""
    if pg is None:
        return
    try:
        remove_placement_group(pg)
    except (ValueError, ray.exceptions.RaySystemError) as exc:  # already removed / cluster gone
        logger.debug("placement group %s already removed: %s", pg.id.hex(), exc)


def wait_all(pgs: Sequence[PlacementGroup], timeout: float) -> list[bool]:
    """Whether each group (in order) is placed within ``timeout`` seconds (negative: no
    wait)."""
    if not pgs:
        return []
    refs = [pg.ready() for pg in pgs]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=max(0.0, timeout))
    done = set(ready)
    return [ref in done for ref in refs]
