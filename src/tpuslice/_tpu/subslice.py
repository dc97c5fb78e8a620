"""Sub-slices of a TPU slice: which hosts form each smaller slice. Pure: no Ray.

4-chip hosts tile the chip grid in a *worker grid*; a host's smallest chip coordinate over
its block is its *physical position* (not its worker id). A sub-slice is a box of the
worker grid, numbered row-major. As Ray 2.60, so each reads what the other learned:
topology ``AxB`` is ``(y, x)``, chip coordinates ``[x, y(, z)]``."""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Mapping, Sequence

from tpuslice._tpu.labels import CallEnv
from tpuslice._tpu.topology import GENERATIONS, SliceShape, grid_position, parse_dims
from tpuslice.errors import InvalidTopologyError, listing

SUBSLICE_LABEL_PREFIX = "ray.io/tpu-subslice-"
HOST_BLOCK = {2: (2, 2), 3: (2, 2, 1)}
"""Chips of one 4-chip host along each side (Ray assumes 4-chip multi-host slices)."""


def kv_key(slice_name: str) -> bytes:
    """Ray's KV key for a slice's sub-slice labels: ``tpu_subslice/<slice name>``."""
    return f"tpu_subslice/{slice_name}".encode()


def label_key(subslice_topology: str) -> str:
    """``ray.io/tpu-subslice-<topology>``."""
    return f"{SUBSLICE_LABEL_PREFIX}{subslice_topology}"


@functools.lru_cache(maxsize=512)
def worker_dims(topology: str) -> tuple[int, ...]:
    """Hosts along each side of ``topology`` made of 4-chip hosts: ``4x8`` -> ``(2, 4)``;
    InvalidTopologyError if a side is not a whole number of hosts."""
    dims = parse_dims(topology)
    block = HOST_BLOCK[len(dims)]
    if any(d % b for d, b in zip(dims, block, strict=True)):
        raise InvalidTopologyError(
            f"topology '{topology}' is not a grid of 4-chip hosts "
            f"({'x'.join(map(str, block))} chips each), so it has no worker grid"
        )
    return tuple(d // b for d, b in zip(dims, block, strict=True))


@functools.lru_cache(maxsize=4)
def _known_topologies(ndim: int) -> tuple[str, ...]:
    """Every known ``ndim``-sided topology 4-chip hosts tile, by host count then sides."""
    found = set()
    for gen in GENERATIONS.values():
        for topology in gen.topologies:
            dims = parse_dims(topology)
            block = HOST_BLOCK[len(dims)]
            if len(dims) == ndim and all(d % b == 0 for d, b in zip(dims, block, strict=True)):
                found.add(topology)
    return tuple(sorted(found, key=lambda t: (math.prod(worker_dims(t)), worker_dims(t))))


def subslice_topologies(parent_topology: str) -> list[str]:
    """Smaller topologies whose worker grid fits in the parent's, fewest hosts first."""
    return list(_subslice_topologies(parent_topology))


@functools.lru_cache(maxsize=512)
def _subslice_topologies(parent_topology: str) -> tuple[str, ...]:
    parent = worker_dims(parent_topology)
    count = math.prod(parent)
    return tuple(
        t
        for t in _known_topologies(len(parent))
        if math.prod(sub := worker_dims(t)) < count
        and all(s <= p for s, p in zip(sub, parent, strict=True))
    )


def physical_position(coordinates: Sequence[Sequence[int]], parent_topology: str) -> int:
    """A host's physical position (row-major in the parent's worker grid) from its chips'
    ``[x, y(, z)]`` as libtpu reports them; InvalidTopologyError if none or outside."""
    if not coordinates:
        raise InvalidTopologyError("a host reported no chip coordinates")
    grid = worker_dims(parent_topology)
    chips = parse_dims(parent_topology)
    # Ray's reading: sides are (y, x) or (z, y, x); coordinates are [x, y(, z)].
    axis_of_coordinate = [len(grid) - 1 - i for i in range(len(grid))]  # x, y, z -> side
    position = [0] * len(grid)
    for coordinate_index, side in enumerate(axis_of_coordinate):
        lowest = min(c[coordinate_index] if len(c) > coordinate_index else 0 for c in coordinates)
        block = max(1, chips[side] // grid[side])
        position[side] = lowest // block
    if any(p >= g for p, g in zip(position, grid, strict=True)):
        raise InvalidTopologyError(
            f"chip coordinates {list(map(list, coordinates))} put a host at {position}, "
            f"outside the {'x'.join(map(str, grid))} worker grid of '{parent_topology}'"
        )
    return _row_major(position, grid)


def chip_coordinates(
    physical: int, parent_topology: str, grid: Sequence[int] | None = None
) -> list[list[int]]:
    """The ``[x, y(, z)]`` of each chip of the host at ``physical``: the inverse of
    :func:`physical_position`, for the simulator. ``grid`` defaults to 4-chip hosts."""
    grid = tuple(grid) if grid is not None else worker_dims(parent_topology)
    chips = parse_dims(parent_topology)
    block = [c // g for c, g in zip(chips, grid, strict=True)]
    corner = [p * b for p, b in zip(grid_position(physical, grid), block, strict=True)]
    sides = [range(c, c + b) for c, b in zip(corner, block, strict=True)]
    return [list(reversed(chip)) for chip in itertools.product(*sides)]


def _row_major(position: Sequence[int], grid: Sequence[int]) -> int:
    index = 0
    for p, g in zip(position, grid, strict=True):
        index = index * g + p
    return index


def subslice_index(physical: int, parent_topology: str, subslice_topology: str) -> int:
    """Which sub-slice of ``subslice_topology`` holds the host at ``physical``."""
    grid = worker_dims(parent_topology)
    sub = worker_dims(subslice_topology)
    position = grid_position(physical, grid)
    boxes = [g // s for g, s in zip(grid, sub, strict=True)]
    return _row_major([p // s for p, s in zip(position, sub, strict=True)], boxes)


def host_labels(physical: int, parent_topology: str) -> dict[str, str]:
    """The host's sub-slice labels, one per sub-topology: ``{label key: index}``."""
    return {
        label_key(sub): str(subslice_index(physical, parent_topology, sub))
        for sub in subslice_topologies(parent_topology)
    }


def physical_from_labels(labels: Mapping[str, str], parent_topology: str) -> int | None:
    """A host's physical position from labels Ray discovered (its one-host sub-slice's index)."""
    smallest = subslice_topologies(parent_topology)
    if not smallest or math.prod(worker_dims(smallest[0])) != 1:
        return None
    raw = labels.get(label_key(smallest[0]))
    return int(raw) if raw is not None and raw.isdecimal() else None


def members(
    physical_by_worker: Mapping[int, int],
    parent_topology: str,
    subslice_topology: str,
) -> dict[int, list[int]]:
    """Each whole sub-slice's hosts by index, from each worker id's physical position."""
    size = math.prod(worker_dims(subslice_topology))
    grid, sub = worker_dims(parent_topology), worker_dims(subslice_topology)
    boxes = [g // s for g, s in zip(grid, sub, strict=True)]
    found: dict[int, list[int]] = {}
    for worker, physical in physical_by_worker.items():
        box = [p // s for p, s in zip(grid_position(physical, grid), sub, strict=True)]
        if any(b >= n for b, n in zip(box, boxes, strict=True)):
            continue  # in the ragged rest of a side (Ray gives it a whole box's index)
        found.setdefault(_row_major(box, boxes), []).append(worker)
    return {i: sorted(ws) for i, ws in sorted(found.items()) if len(ws) == size}


def valid_parents(subslice_topology: str, topologies: Sequence[str]) -> list[str]:
    """Which of ``topologies`` (not the sub-slice's own) can hold a ``subslice_topology``,
    fewest hosts first; InvalidTopologyError if it is no grid of 4-chip hosts."""
    try:
        sub = worker_dims(subslice_topology)
    except InvalidTopologyError as exc:
        valid = [t for n in (2, 3) for t in _known_topologies(n)]
        raise InvalidTopologyError(
            f"sub-slice topology '{subslice_topology}' is not a grid of 4-chip hosts; "
            f"valid: {listing(valid)}"
        ) from exc
    parents = []
    for topology in set(topologies):
        if topology == subslice_topology:
            continue
        try:
            grid = worker_dims(topology)
        except InvalidTopologyError:
            continue
        if len(grid) == len(sub) and all(g >= s for g, s in zip(grid, sub, strict=True)):
            parents.append(topology)
    return sorted(parents, key=lambda t: (math.prod(worker_dims(t)), worker_dims(t)))


def subslice_env(shape: SliceShape, hosts: list[str], worker: int) -> CallEnv:
    """What host ``worker`` of a sub-slice (``hosts`` in rank order) needs set so libtpu and
    JAX treat it as the slice (Ray 2.60 sets none). The metadata server describes the parent
    (so skip it), and JAX takes ``TPU_PROCESS_ADDRESSES``, even empty, before host names."""
    grid = list(worker_dims(shape.topology))
    bounds = ",".join(map(str, [*grid, 1][:3] if len(grid) == 2 else grid))
    chips = ",".join(map(str, HOST_BLOCK[3]))
    return {
        "TPU_WORKER_ID": str(worker),
        "CLOUD_TPU_TASK_ID": str(worker),
        "TPU_WORKER_HOSTNAMES": ",".join(hosts),
        "TPU_PROCESS_ADDRESSES": None,
        "TPU_ACCELERATOR_TYPE": shape.pod_type,
        "TPU_TOPOLOGY": shape.topology,
        "TPU_HOST_BOUNDS": bounds,
        "TPU_PROCESS_BOUNDS": bounds,
        "TPU_CHIPS_PER_HOST_BOUNDS": chips,
        "TPU_CHIPS_PER_PROCESS_BOUNDS": chips,
        "TPU_TOPOLOGY_WRAP": "false,false,false",
        "TPU_SKIP_MDS_QUERY": "true",
    }
