"""Ray 2.60's cluster-reading TPU functions, same names and signatures, on our cluster view.

Unlike Ray, a host whose TPUs are all in use counts as busy, and a slice counts only if
its shape (pod type, topology, TPU per host) matches exactly.
"""

from __future__ import annotations

from typing import Any

import ray

from tpuslice.cluster import SliceState, node_labels_of, read_snapshot
from tpuslice.compat import resolve_resource_per_chip
from tpuslice.labels import SLICE_NAME_LABEL
from tpuslice.topology import slice_shape


def get_tpu_slice_name_from_node(node: dict[str, Any]) -> str | None:
    """The slice-name label of a ``ray.nodes()`` record, or ``None``."""
    return node_labels_of(node).get(SLICE_NAME_LABEL)


def get_tpu_nodes_for_slice(
    slice_name: str, nodes: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Alive nodes of the slice; ``[]`` when Ray is not initialised and no nodes are given."""
    if nodes is None:
        if not ray.is_initialized():
            return []
        nodes = ray.nodes()
    return [n for n in nodes if n.get("Alive") and get_tpu_slice_name_from_node(n) == slice_name]


def _count(
    topology: str, accelerator_type: str, per_chip: int | None, states: set[SliceState]
) -> int:
    if not ray.is_initialized():
        return 0
    shape = slice_shape(topology, accelerator_type)
    resolved = resolve_resource_per_chip(per_chip)
    snapshot = read_snapshot(resolved)
    return sum(1 for s in snapshot.matching(shape, resolved) if s.state in states)


def get_num_ready_tpu_slices(
    topology: str, accelerator_type: str, tpu_resource_per_chip: int | None = None
) -> int:
    """Slices of this shape that are whole and idle (every TPU free); 0 without Ray."""
    return _count(topology, accelerator_type, tpu_resource_per_chip, {SliceState.READY})


def get_num_tpu_slices(
    topology: str, accelerator_type: str, tpu_resource_per_chip: int | None = None
) -> int:
    """Slices of this shape that are whole (idle or busy); 0 without Ray."""
    return _count(
        topology, accelerator_type, tpu_resource_per_chip, {SliceState.READY, SliceState.BUSY}
    )
