"""TPU generations, slice topologies and the shape of a slice. Pure: no Ray, no I/O.
A *topology* is a slice's chip grid (``4x4``); a *pod type* names generation and size
(``v6e-16``: 16 chips; ``v4-16``: 16 TensorCores = 8 chips); a *host* is one TPU VM."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from tpuslice.errors import (
    AmbiguousPodTypeError,
    InvalidAcceleratorError,
    InvalidResourceError,
    InvalidTopologyError,
    did_you_mean,
    listing,
)

VALID_CHIPS_PER_VM = (1, 2, 4, 8)
"""Chips one TPU VM may hold (and the chip counts one task may ask for)."""
DEFAULT_CHIPS_PER_MULTI_HOST_VM = 4


def _cube_steps(max_x: int, max_y: int, max_z: int, step: int = 4) -> frozenset[str]:
    """Every ``XxYxZ`` with each side a multiple of ``step`` up to the given maxima."""
    return frozenset(
        f"{x}x{y}x{z}"
        for x in range(step, max_x + 1, step)
        for y in range(step, max_y + 1, step)
        for z in range(step, max_z + 1, step)
    )


_SMALL_3D = frozenset({"2x2x1", "2x2x2", "2x2x4", "2x4x4"})
_LITE_2D = frozenset({"1x1", "2x2", "2x4", "2x8", "4x4", "4x8", "8x8", "8x16", "16x16"})

# Valid slice topologies per generation: Ray 2.60's VALID_TPU_TOPOLOGY, plus shapes Ray
# omits: v2/v3 "2x2" (v2-8, v3-8) and v4's larger shapes (cloud.google.com/tpu/docs),
# v7x's 16x16xN (Google's XPK, system_characteristics.py).
_TOPOLOGIES: dict[str, frozenset[str]] = {
    "v2": frozenset({"2x2", "4x4", "4x8", "8x8", "8x16", "16x16"}),
    "v3": frozenset({"2x2", "4x4", "4x8", "8x8", "8x16", "16x16", "16x32", "32x32"}),
    "v4": _SMALL_3D | _cube_steps(12, 12, 16) | {"4x16x16", "8x16x16", "12x12x24"},
    "v5p": _SMALL_3D | _cube_steps(16, 16, 24),
    "v5litepod": _LITE_2D,
    "v6e": _LITE_2D,
    "v7x": _SMALL_3D
    | {"4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16", "8x16x16"}
    | {"16x16x16", "16x16x24", "16x16x32"},
}


@dataclass(frozen=True)
class Generation:
    """One TPU generation and the facts that shape its slices (as in Ray 2.60)."""

    name: str
    """Canonical spelling, as in pod types and Ray labels (``v5litepod``)."""
    aliases: tuple[str, ...]
    """Other accepted spellings (``v5e``, ``trillium``, ``tpu7x``)."""
    cores_per_chip: int
    dims: int
    """Sides of its topologies: 2 (``4x4``) or 3 (``2x2x2``)."""
    max_chips_single_vm: int
    """Largest slice Google offers as one VM."""
    topologies: frozenset[str]

    @property
    def pod_type_counts(self) -> str:
        """What the number in a pod type counts: ``"cores"`` or ``"chips"``."""
        return "chips" if self.cores_per_chip == 1 else "cores"

    @property
    def accelerator_type(self) -> str:
        """Ray's accelerator type string (``TPU-V6E``)."""
        return f"TPU-{self.name.upper()}"

    def sorted_topologies(self) -> list[str]:
        """Topologies by chip count, then by their sides.

        Returns:
            Every topology, smallest first.
        """
        return sorted(self.topologies, key=lambda t: (chips_in(t), parse_dims(t)))


GENERATIONS: dict[str, Generation] = {
    g.name: g
    for g in (
        Generation("v2", (), 2, 2, 4, _TOPOLOGIES["v2"]),
        Generation("v3", (), 2, 2, 4, _TOPOLOGIES["v3"]),
        Generation("v4", (), 2, 3, 4, _TOPOLOGIES["v4"]),
        Generation("v5p", (), 2, 3, 4, _TOPOLOGIES["v5p"]),
        Generation("v5litepod", ("v5e", "v5lite"), 1, 2, 8, _TOPOLOGIES["v5litepod"]),
        Generation("v6e", ("trillium",), 1, 2, 8, _TOPOLOGIES["v6e"]),
        Generation("v7x", ("tpu7x", "ironwood"), 2, 3, 4, _TOPOLOGIES["v7x"]),
    )
}

_ALIASES: dict[str, str] = {
    spelling: g.name for g in GENERATIONS.values() for spelling in (g.name, *g.aliases)
}

_TOPOLOGY_RE = re.compile(r"^[1-9][0-9]*(x[1-9][0-9]*){1,2}$")


def normalize_generation_name(accelerator: str) -> str:
    """``" TPU-V6E"`` -> ``"v6e"``: lower-case, no ``TPU-``/``TPU`` prefix; not checked."""
    name = accelerator.strip().lower().replace(" ", "")
    if name.startswith("tpu-"):
        name = name[4:]
    if name.startswith("tpu") and name not in _ALIASES:
        name = "v" + name[3:]  # "tpu7x" style: Ray normalises it to "v7x"
    return name


def generation(accelerator: str) -> Generation:
    """The generation any accepted spelling names (``TPU-V6E``, ``v5e``, ``tpu7x``,
    ``Trillium``); InvalidAcceleratorError naming the valid ones if none."""
    if not isinstance(accelerator, str):
        raise InvalidAcceleratorError(
            f"accelerator version must be a string such as 'v6e', got {accelerator!r}"
        )
    name = normalize_generation_name(accelerator)
    if name in _ALIASES:
        return GENERATIONS[_ALIASES[name]]
    pod = re.match(r"^(.*)-\d+$", name)
    hint = (
        f"; '{accelerator}' looks like a pod type: pass the generation ('{pod.group(1)}') "
        "and a topology instead"
        if pod and pod.group(1) in _ALIASES
        else did_you_mean(name, _ALIASES)
    )
    raise InvalidAcceleratorError(
        f"unknown TPU accelerator version {accelerator!r}; valid: "
        f"{', '.join(GENERATIONS)} (also {', '.join(a for a in _ALIASES if a not in GENERATIONS)},"
        f" and 'TPU-' prefixed forms){hint}"
    )


def parse_dims(topology: str) -> tuple[int, ...]:
    """``" 4X4"`` -> ``(4, 4)``: 2 or 3 positive sides, else InvalidTopologyError."""
    if not isinstance(topology, str):
        raise InvalidTopologyError(f"topology must be a string such as '4x4', got {topology!r}")
    text = topology.strip().lower().replace(" ", "")
    if not _TOPOLOGY_RE.match(text):
        raise InvalidTopologyError(
            f"topology {topology!r} is malformed; expected sides joined by 'x', "
            "such as '4x4' or '2x2x2'"
        )
    return tuple(int(side) for side in text.split("x"))


def chips_in(topology: str) -> int:
    """Chips in a topology: the product of its sides."""
    return math.prod(parse_dims(topology))


def _nearest_topology(gen: Generation, topology: str) -> str | None:
    """The smallest topology of ``gen`` holding as many chips (else the largest), closest
    in its sides; ``None`` if ``topology`` is malformed or has another number of sides."""
    try:
        dims = parse_dims(topology)
    except InvalidTopologyError:
        return None
    if len(dims) != gen.dims:
        return None
    wanted = math.prod(dims)
    bigger = [t for t in gen.topologies if chips_in(t) >= wanted] or list(gen.topologies)
    fewest = min(chips_in(t) for t in bigger)

    def distance(candidate: str) -> int:
        return sum(abs(a - b) for a, b in zip(parse_dims(candidate), dims, strict=True))

    return min((t for t in bigger if chips_in(t) == fewest), key=lambda t: (distance(t), t))


def _validate_topology(gen: Generation, topology: str) -> str:
    """The topology as ``gen.topologies`` spells it, or an error naming the valid ones."""
    dims = parse_dims(topology)
    text = "x".join(str(d) for d in dims)
    if text in gen.topologies:
        return text
    shape = "2D (AxB)" if gen.dims == 2 else "3D (AxBxC)"
    nearest = _nearest_topology(gen, text)
    hint = f"; did you mean '{nearest}'?" if nearest else ""
    raise InvalidTopologyError(
        f"topology '{text}' is not valid for {gen.name}; {gen.name} slices are {shape}, "
        f"valid: {listing(gen.sorted_topologies())}{hint}"
    )


def default_chips_per_vm(gen: Generation, topology: str) -> int:
    """Chips per VM by default (as Ray 2.60): the whole slice if it fits one VM, else 4."""
    chips = chips_in(topology)
    return chips if chips <= gen.max_chips_single_vm else DEFAULT_CHIPS_PER_MULTI_HOST_VM


def _validate_chips_per_vm(chips_per_vm: object, chips: int, topology: str) -> int:
    """``chips_per_vm`` if it is 1, 2, 4 or 8 and divides ``chips``, else an error."""
    valid = [c for c in VALID_CHIPS_PER_VM if chips % c == 0]
    if isinstance(chips_per_vm, bool) or not isinstance(chips_per_vm, int):
        raise InvalidResourceError(
            f"chips_per_vm must be an integer, got {chips_per_vm!r}; valid for "
            f"'{topology}': {', '.join(map(str, valid))}"
        )
    if chips_per_vm not in valid:
        nearest = min(valid, key=lambda c: (abs(c - chips_per_vm), -c))
        raise InvalidResourceError(
            f"chips_per_vm={chips_per_vm} is not valid for topology '{topology}' "
            f"({chips} chips): it must be one of 1, 2, 4, 8 and divide the chips; "
            f"valid here: {', '.join(map(str, valid))}; did you mean {nearest}?"
        )
    return chips_per_vm


_HOST_BLOCKS: dict[int, dict[int, tuple[int, ...]]] = {
    # Chips one VM covers in the chip grid, per chips_per_vm (as Google and Ray 2.60).
    2: {1: (1, 1), 2: (1, 2), 4: (2, 2), 8: (2, 4)},
    3: {1: (1, 1, 1), 2: (1, 2, 1), 4: (2, 2, 1), 8: (2, 4, 1)},
}


def _worker_grid(dims: tuple[int, ...], chips_per_vm: int) -> tuple[int, ...]:
    """Hosts along each side of the chip grid; ``(num_hosts,)`` if hosts do not tile it."""
    block = _HOST_BLOCKS[len(dims)][chips_per_vm]
    if all(d % b == 0 for d, b in zip(dims, block, strict=True)):
        return tuple(d // b for d, b in zip(dims, block, strict=True))
    return (math.prod(dims) // chips_per_vm,)


@dataclass(frozen=True)
class SliceShape:
    """A slice of one generation and topology, split into VMs of ``chips_per_host`` chips.
    Build one with :func:`slice_shape`, which validates; the constructor does not."""

    generation: Generation
    topology: str
    chips_per_host: int

    @property
    def dims(self) -> tuple[int, ...]:
        """Sides of the chip grid: ``4x4`` -> ``(4, 4)``."""
        return parse_dims(self.topology)

    @property
    def chips(self) -> int:
        """Chips in the slice."""
        return math.prod(self.dims)

    @property
    def cores(self) -> int:
        """TensorCores in the slice (the size in a v4 or v5p pod type)."""
        return self.chips * self.generation.cores_per_chip

    @property
    def num_hosts(self) -> int:
        """VMs (Ray nodes) in the slice."""
        return self.chips // self.chips_per_host

    @property
    def is_single_host(self) -> bool:
        """Whether the whole slice is one VM."""
        return self.num_hosts == 1

    @property
    def pod_type(self) -> str:
        """``v6e-16``: generation and chips (v5e/v6e) or TensorCores (others)."""
        return f"{self.generation.name}-{self.cores}"

    @property
    def head_resource(self) -> str:
        """The resource Ray puts on worker 0 only: ``TPU-v6e-16-head``."""
        return f"TPU-{self.pod_type}-head"

    @property
    def accelerator_type(self) -> str:
        """Ray's accelerator type string (``TPU-V6E``)."""
        return self.generation.accelerator_type

    @property
    def worker_grid(self) -> tuple[int, ...]:
        """Hosts along each side, in the topology's order (``4x4`` -> ``(2, 2)``)."""
        return _worker_grid(self.dims, self.chips_per_host)

    def worker_coords(self, worker_id: int) -> tuple[int, ...]:
        """Grid position of a TPU worker id (row-major over :attr:`worker_grid`).

        Args:
            worker_id: The host's TPU worker id.

        Returns:
            Its coordinates, one per side of :attr:`worker_grid`.

        Raises:
            InvalidTopologyError: ``worker_id`` is outside the slice.
        """
        if not 0 <= worker_id < self.num_hosts:
            raise InvalidTopologyError(
                f"worker id {worker_id} is outside slice {self.pod_type} "
                f"({self.num_hosts} hosts: 0..{self.num_hosts - 1})"
            )
        return grid_position(worker_id, self.worker_grid)


def grid_position(index: int, grid: Sequence[int]) -> tuple[int, ...]:
    """The coordinates in ``grid`` of row-major ``index``."""
    position: list[int] = []
    for side in reversed(grid):
        position.append(index % side)
        index //= side
    return tuple(reversed(position))


def slice_shape(
    topology: str, accelerator_version: str, chips_per_vm: int | None = None
) -> SliceShape:
    """Validate a request and return its :class:`SliceShape`; errors are ``ValueError``.

    Args:
        topology: Chip grid of the slice, such as ``"4x4"`` or ``"2x2x2"``.
        accelerator_version: TPU generation in any accepted spelling (``"TPU-V4"``).
        chips_per_vm: Chips on each VM; ``None`` for :func:`default_chips_per_vm`.

    Returns:
        The validated shape.

    Raises:
        InvalidAcceleratorError: the generation is unknown.
        InvalidTopologyError: the topology is malformed or not offered for the generation.
        InvalidResourceError: ``chips_per_vm`` is not valid for the topology.
    """
    gen = generation(accelerator_version)
    topo = _validate_topology(gen, topology)
    chips = chips_in(topo)
    per_vm = (
        default_chips_per_vm(gen, topo)
        if chips_per_vm is None
        else _validate_chips_per_vm(chips_per_vm, chips, topo)
    )
    return SliceShape(gen, topo, per_vm)


def parse_pod_type(pod_type: str, chips_per_vm: int | None = None) -> SliceShape:
    """``"v4-32"`` -> the shape of a v4 2x2x4 slice; ambiguous sizes list the candidates.

    Args:
        pod_type: ``<generation>-<size>``; size in TensorCores (chips on v5e/v6e).
        chips_per_vm: Chips on each VM; ``None`` for the default.

    Returns:
        The shape of the one topology of that size.

    Raises:
        InvalidAcceleratorError: the generation is unknown.
        AmbiguousPodTypeError: the size fits more than one topology (pass the topology).
        InvalidTopologyError: ``pod_type`` is malformed, or no slice has that size.
        InvalidResourceError: ``chips_per_vm`` is not valid for the topology.
    """
    text = normalize_generation_name(pod_type)
    match = re.match(r"^(.+)-(\d+)$", text)
    if not match:
        raise InvalidTopologyError(
            f"pod type {pod_type!r} is malformed; expected generation-size such as 'v6e-16'"
        )
    gen = generation(match.group(1))
    size = int(match.group(2))
    if size % gen.cores_per_chip:
        raise InvalidTopologyError(
            f"pod type '{pod_type}': {gen.name} counts {gen.pod_type_counts} and has "
            f"{gen.cores_per_chip} per chip, so the size must be a multiple of {gen.cores_per_chip}"
        )
    chips = size // gen.cores_per_chip
    candidates = [t for t in gen.sorted_topologies() if chips_in(t) == chips]
    if len(candidates) == 1:
        return slice_shape(candidates[0], gen.name, chips_per_vm)
    if not candidates:
        sizes = sorted({chips_in(t) * gen.cores_per_chip for t in gen.topologies})
        valid = [f"{gen.name}-{s}" for s in sizes]
        raise InvalidTopologyError(
            f"pod type '{pod_type}' does not exist: {gen.name} has no slice of {chips} chips; "
            f"valid: {listing(valid)}{did_you_mean(text, valid)}"
        )
    raise AmbiguousPodTypeError(
        f"pod type '{pod_type}' is ambiguous: {chips} chips of {gen.name} can be "
        f"{' or '.join(candidates)}; pass the topology explicitly"
    )
