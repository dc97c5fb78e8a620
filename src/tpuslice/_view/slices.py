"""Ray 2.60's cluster-reading TPU functions, same names and signatures, on our cluster view.
Unlike Ray's, a host whose TPUs are all in use is busy, a slice counts only if its shape
matches exactly, and invalid arguments raise where Ray logs a warning and returns 0.
"""

from __future__ import annotations

from typing import Any

import ray

from tpuslice._tpu.compat import resolve_resource_per_chip
from tpuslice._tpu.labels import SLICE_NAME_LABEL
from tpuslice._tpu.topology import slice_shape
from tpuslice._view.cluster import SliceState, node_labels_of, read_snapshot


def get_tpu_slice_name_from_node(node: dict[str, Any]) -> str | None:
    """The slice-name label of a ``ray.nodes()`` record, or ``None``.

    Args:
        node: One record of ``ray.nodes()``.

    Returns:
        The ``ray.io/tpu-slice-name`` label; ``None``, not an error, if it has none.
    """
    return node_labels_of(node).get(SLICE_NAME_LABEL)


def get_tpu_nodes_for_slice(
    slice_name: str, nodes: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Alive nodes of the slice; ``[]`` when Ray is not initialised and no nodes are given.

    Args:
        slice_name: The slice's name.
        nodes: Node records to search (default: ``ray.nodes()``).

    Returns:
        The records of the slice's live nodes, in the order given.
    """
    if nodes is None:
        if not ray.is_initialized():
            return []
        nodes = ray.nodes()
    return [n for n in nodes if n.get("Alive") and get_tpu_slice_name_from_node(n) == slice_name]


_WHOLE = (SliceState.READY, SliceState.BUSY, SliceState.SUSPECT)


def _count(
    topology: str, accelerator_type: str, per_chip: int | None, states: tuple[SliceState, ...]
) -> int:
    """Slices of this shape in these states; 0 without Ray (as in Ray)."""
    if not ray.is_initialized():
        return 0
    shape = slice_shape(topology, accelerator_type)
    resolved = resolve_resource_per_chip(per_chip)
    snapshot = read_snapshot(resolved)
    return sum(1 for s in snapshot.matching(shape, resolved) if s.state in states)


def get_num_ready_tpu_slices(
    topology: str, accelerator_type: str, tpu_resource_per_chip: int | None = None
) -> int:
    """Slices of this shape that are whole and idle, none with a suspect host.

    Args:
        topology: The slice's chip grid (``"4x4"``).
        accelerator_type: Its TPU generation, in any accepted spelling.
        tpu_resource_per_chip: ``TPU`` units per chip (default ``RAY_TPU_RESOURCE_PER_CHIP`` or 1).

    Returns:
        The count; 0 when Ray is not initialised (as in Ray).

    Raises:
        InvalidAcceleratorError: the generation is unknown.
        InvalidTopologyError: the topology is malformed or not offered for it.
        InvalidArgumentError: the TPU units per chip is not a positive integer.
    """
    return _count(topology, accelerator_type, tpu_resource_per_chip, (SliceState.READY,))


def get_num_tpu_slices(
    topology: str, accelerator_type: str, tpu_resource_per_chip: int | None = None
) -> int:
    """Slices of this shape that are whole (idle or busy, suspect hosts or not).

    Args:
        topology: The slice's chip grid (``"4x4"``).
        accelerator_type: Its TPU generation, in any accepted spelling.
        tpu_resource_per_chip: ``TPU`` units per chip (default ``RAY_TPU_RESOURCE_PER_CHIP`` or 1).

    Returns:
        The count; 0 when Ray is not initialised (as in Ray).

    Raises:
        InvalidAcceleratorError: the generation is unknown.
        InvalidTopologyError: the topology is malformed or not offered for it.
        InvalidArgumentError: the TPU units per chip is not a positive integer.
    """
    return _count(topology, accelerator_type, tpu_resource_per_chip, _WHOLE)
