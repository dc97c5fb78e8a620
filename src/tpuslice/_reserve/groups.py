"""Small helpers over Ray placement groups: remove idempotently, wait for several."""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from tpuslice._host.context import HostContext

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RankPlacement:
    """Where one rank of a held reservation runs: its context, its bundle, and the TPU
    the bundle holds. Tasks, actor groups and owners all place a rank from this.

    Attributes:
        context: The rank's slice context.
        group: The placement group holding its bundle.
        bundle: The bundle's index in ``group``.
        tpu: ``TPU`` resources the bundle holds.
    """

    context: HostContext
    group: PlacementGroup
    bundle: int
    tpu: float

    def strategy(self) -> PlacementGroupSchedulingStrategy:
        """Ray's scheduling strategy that puts work in this rank's bundle.

        Returns:
            The strategy.
        """
        return PlacementGroupSchedulingStrategy(
            placement_group=self.group, placement_group_bundle_index=self.bundle
        )


def live_placement_groups() -> list[dict[str, Any]]:
    """Placement groups of the connected cluster that are not removed.

    Returns:
        Their rows of ``ray.util.placement_group_table()``.
    """
    table = ray.util.placement_group_table()
    return [pg for pg in table.values() if pg.get("state") != "REMOVED"]


def hosts_taken_by_groups(node_ids: Collection[str], resources: Collection[str]) -> set[str]:
    """Of these hosts, those on which a placed group holds one of ``resources``.

    After a hand-back removed its groups, such a group is someone else's: it proves the
    hand-back's hold gone even if Ray's resource view never showed the host free between
    the two (the placement group table is the GCS's own record, with no report lag).

    Args:
        node_ids: The hosts.
        resources: Resource names (``TPU``, a head resource).

    Returns:
        The node ids with a bundle of a placed group that asks for any of them.
    """
    wanted, names = set(node_ids), set(resources)
    taken: set[str] = set()
    for pg in ray.util.placement_group_table().values():
        if pg.get("state") != "CREATED":
            continue
        bundles = pg.get("bundles") or {}
        for index, node in (pg.get("bundles_to_node_id") or {}).items():
            asks = bundles.get(index) or {}
            if node in wanted and any(asks.get(name, 0) > 0 for name in names):
                taken.add(node)
    return taken


def remove_group(pg: PlacementGroup | None) -> None:
    """Remove a placement group; a group already gone is fine (idempotent).

    Args:
        pg: The group; ``None`` does nothing.
    """
    if pg is None:
        return
    try:
        remove_placement_group(pg)
    except (ValueError, ray.exceptions.RaySystemError) as exc:  # already removed / cluster gone
        logger.debug("placement group %s already removed: %s", pg.id.hex(), exc)


def wait_all(pgs: Sequence[PlacementGroup], timeout: float) -> list[bool]:
    """Wait until every group is placed or ``timeout`` passes; return which are ready.

    Args:
        pgs: The groups.
        timeout: Seconds to wait at most (a negative value waits not at all).

    Returns:
        Whether each group is placed, in the order of ``pgs``.
    """
    if not pgs:
        return []
    refs = [pg.ready() for pg in pgs]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=max(0.0, timeout))
    done = set(ready)
    return [ref in done for ref in refs]
