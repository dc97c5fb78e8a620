"""Unit and property tests for tpuslice._tpu.topology (pure: no Ray cluster)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from itertools import product

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuslice._tpu import topology as topo
from tpuslice._tpu.topology import GENERATIONS, SliceShape
from tpuslice.errors import (
    AmbiguousPodTypeError,
    InvalidAcceleratorError,
    InvalidArgumentError,
    InvalidResourceError,
    InvalidTopologyError,
    TPUSliceError,
)


def all_shapes() -> Iterator[SliceShape]:
    """Every valid (generation, topology, chips_per_vm) shape, default chips_per_vm first.

    Yields:
        Each shape, by generation, then topology (smallest first), then chips per VM.
    """
    for gen in GENERATIONS.values():
        for topology in gen.sorted_topologies():
            default = topo.default_chips_per_vm(gen, topology)
            yield SliceShape(gen, topology, default)
            for per_vm in topo.VALID_CHIPS_PER_VM:
                if per_vm != default and topo.chips_in(topology) % per_vm == 0:
                    yield SliceShape(gen, topology, per_vm)


ALL_SHAPES: list[SliceShape] = list(all_shapes())
shapes = st.sampled_from(ALL_SHAPES)
generations = st.sampled_from(sorted(GENERATIONS))


def same_chip_count(shape: SliceShape) -> list[str]:
    """Every topology of the shape's generation with the shape's number of chips."""
    return [t for t in shape.generation.topologies if topo.chips_in(t) == shape.chips]


# --- the table ---------------------------------------------------------------------------


def test_every_shape_in_ray_260_table_is_in_ours() -> None:
    from ray._private.accelerators.tpu import VALID_TPU_TOPOLOGY  # oracle

    assert set(VALID_TPU_TOPOLOGY) == set(GENERATIONS)
    for gen, ray_topologies in VALID_TPU_TOPOLOGY.items():
        missing = set(ray_topologies) - GENERATIONS[gen].topologies
        assert not missing, f"{gen}: Ray 2.60 accepts {sorted(missing)} but we do not"


@pytest.mark.parametrize(
    ("gen", "topology"),
    [
        ("v2", "2x2"),
        ("v3", "2x2"),
        ("v4", "4x16x16"),
        ("v4", "8x16x16"),
        ("v4", "12x12x24"),
        ("v7x", "16x16x16"),
        ("v7x", "16x16x24"),
        ("v7x", "16x16x32"),
    ],
)
def test_documented_additions_beyond_ray_are_valid(gen: str, topology: str) -> None:
    assert topology in GENERATIONS[gen].topologies


def test_v4_full_pod_cube_is_not_offered() -> None:
    # 16x16x16 is not a documented v4 slice shape (see the table comment).
    assert "16x16x16" not in GENERATIONS["v4"].topologies


def test_every_topology_has_the_generation_dimensionality() -> None:
    for gen in GENERATIONS.values():
        assert {len(topo.parse_dims(t)) for t in gen.topologies} == {gen.dims}


def test_all_shapes_yields_default_chips_per_vm_first_and_no_duplicates() -> None:
    assert len(set(ALL_SHAPES)) == len(ALL_SHAPES)
    seen: set[tuple[str, str]] = set()
    for shape in ALL_SHAPES:
        key = (shape.generation.name, shape.topology)
        if key not in seen:
            assert shape.chips_per_host == topo.default_chips_per_vm(
                shape.generation, shape.topology
            )
            seen.add(key)
    assert seen == {(g.name, t) for g in GENERATIONS.values() for t in g.topologies}


# --- arithmetic ---------------------------------------------------------------------------


def test_hosts_times_chips_per_host_is_chips_for_every_shape() -> None:
    for shape in ALL_SHAPES:
        assert shape.num_hosts * shape.chips_per_host == shape.chips, shape
        assert math.prod(shape.worker_grid) == shape.num_hosts, shape
        assert shape.cores == shape.chips * shape.generation.cores_per_chip


@pytest.mark.parametrize(
    ("gen", "topology", "pod_type", "hosts", "per_host"),
    [
        ("v6e", "4x4", "v6e-16", 4, 4),
        ("v6e", "2x4", "v6e-8", 1, 8),
        ("v6e", "1x1", "v6e-1", 1, 1),
        ("v5litepod", "16x16", "v5litepod-256", 64, 4),
        ("v4", "2x2x1", "v4-8", 1, 4),
        ("v4", "2x2x2", "v4-16", 2, 4),
        ("v5p", "16x16x24", "v5p-12288", 1536, 4),
        ("v7x", "2x2x2", "v7x-16", 2, 4),
        ("v2", "2x2", "v2-8", 1, 4),
        ("v3", "32x32", "v3-2048", 256, 4),
    ],
)
def test_known_shapes(gen: str, topology: str, pod_type: str, hosts: int, per_host: int) -> None:
    shape = topo.slice_shape(topology, gen)
    assert (shape.pod_type, shape.num_hosts, shape.chips_per_host) == (pod_type, hosts, per_host)
    assert shape.head_resource == f"TPU-{pod_type}-head"
    assert shape.is_single_host == (hosts == 1)


def test_accelerator_type_is_ray_spelling() -> None:
    assert topo.slice_shape("4x4", "v6e").accelerator_type == "TPU-V6E"
    assert GENERATIONS["v5litepod"].accelerator_type == "TPU-V5LITEPOD"


def test_pod_type_counts_chips_on_single_core_generations_only() -> None:
    counts = {g.name: g.pod_type_counts for g in GENERATIONS.values()}
    assert counts == {
        "v2": "cores",
        "v3": "cores",
        "v4": "cores",
        "v5p": "cores",
        "v5litepod": "chips",
        "v6e": "chips",
        "v7x": "cores",
    }


def test_sorted_topologies_orders_by_chips() -> None:
    for gen in GENERATIONS.values():
        chips = [topo.chips_in(t) for t in gen.sorted_topologies()]
        assert chips == sorted(chips)
        assert set(gen.sorted_topologies()) == gen.topologies


# --- pod types ----------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(shapes)
def test_pod_type_round_trips_when_the_chip_count_fixes_the_topology(shape: SliceShape) -> None:
    candidates = same_chip_count(shape)
    if len(candidates) == 1:
        parsed = topo.parse_pod_type(shape.pod_type, shape.chips_per_host)
        assert parsed == shape
    else:
        with pytest.raises(AmbiguousPodTypeError) as info:
            topo.parse_pod_type(shape.pod_type)
        for candidate in candidates:
            assert candidate in str(info.value)
        assert shape.pod_type in str(info.value)


def test_every_pod_type_round_trips_or_is_ambiguous() -> None:
    for gen in GENERATIONS.values():
        for topology in gen.topologies:
            shape = topo.slice_shape(topology, gen.name)
            if len(same_chip_count(shape)) == 1:
                assert topo.parse_pod_type(shape.pod_type) == shape
            else:
                with pytest.raises(AmbiguousPodTypeError):
                    topo.parse_pod_type(shape.pod_type)


def test_v6e_16_is_ambiguous_and_lists_both_topologies() -> None:
    with pytest.raises(AmbiguousPodTypeError) as info:
        topo.parse_pod_type("v6e-16")
    message = str(info.value)
    assert "'v6e-16'" in message
    assert "2x8" in message
    assert "4x4" in message
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("pod_type", "topology", "gen"),
    [
        ("v4-8", "2x2x1", "v4"),
        ("v4-16", "2x2x2", "v4"),
        ("tpu7x-8", "2x2x1", "v7x"),
        ("TPU7X-16", "2x2x2", "v7x"),
        ("v5e-256", "16x16", "v5litepod"),
        ("v5litepod-8", "2x4", "v5litepod"),
        (" v6e-8 ", "2x4", "v6e"),
        ("v2-8", "2x2", "v2"),
        ("v3-2048", "32x32", "v3"),
    ],
)
def test_parse_pod_type_accepts_forgiving_spellings(pod_type: str, topology: str, gen: str) -> None:
    shape = topo.parse_pod_type(pod_type)
    assert (shape.generation.name, shape.topology) == (gen, topology)


@pytest.mark.parametrize(
    ("pod_type", "fragments"),
    [
        ("v6e-15", ["'v6e-15'", "no slice of 15 chips", "v6e-16"]),
        ("v4-7", ["'v4-7'", "multiple of 2"]),
        ("v6e", ["'v6e'", "malformed", "v6e-16"]),
        ("v9-8", ["'v9'", "unknown TPU accelerator version"]),
        ("v4-4", ["'v4-4'", "no slice of 2 chips", "v4-8"]),
    ],
)
def test_bad_pod_types_raise_with_the_bad_value_and_valid_ones(
    pod_type: str, fragments: list[str]
) -> None:
    with pytest.raises(InvalidTopologyError if "v9" not in pod_type else InvalidAcceleratorError):
        topo.parse_pod_type(pod_type)
    with pytest.raises(ValueError) as info:
        topo.parse_pod_type(pod_type)
    for fragment in fragments:
        assert fragment in str(info.value)


# --- generation spellings -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("spelling", "name"),
    [
        ("TPU-V6E", "v6e"),
        ("v6e", "v6e"),
        ("V6E ", "v6e"),
        (" tpu-v6e", "v6e"),
        ("trillium", "v6e"),
        ("Trillium", "v6e"),
        ("tpu7x", "v7x"),
        ("TPU7X", "v7x"),
        ("ironwood", "v7x"),
        ("TPU-V7X", "v7x"),
        ("v5e", "v5litepod"),
        ("v5lite", "v5litepod"),
        ("v5litepod", "v5litepod"),
        ("TPU-V5LITEPOD", "v5litepod"),
        ("TPU-V5P", "v5p"),
        ("tpu-v4", "v4"),
        ("V2", "v2"),
    ],
)
def test_generation_accepts_forgiving_spellings(spelling: str, name: str) -> None:
    assert topo.generation(spelling).name == name


@st.composite
def spellings(draw: st.DrawFn) -> tuple[str, str]:
    """Any accepted spelling of a generation, in any case, padded, maybe TPU- prefixed."""
    gen = GENERATIONS[draw(generations)]
    base = draw(st.sampled_from((gen.name, *gen.aliases)))
    prefix = draw(st.sampled_from(["", "tpu-", "TPU-", "Tpu-"]))
    cased = "".join(c.upper() if draw(st.booleans()) else c for c in prefix + base)
    pad = st.text(alphabet=" \t", max_size=2)
    return draw(pad) + cased + draw(pad), gen.name


@settings(max_examples=200, deadline=None)
@given(spellings())
def test_every_generation_parses_from_any_case_padding_and_prefix(case: tuple[str, str]) -> None:
    spelling, name = case
    assert topo.generation(spelling).name == name


@settings(max_examples=200, deadline=None)
@given(shapes, st.sampled_from(["{}", " {} ", "{}\t", "  {}"]), st.booleans())
def test_every_valid_shape_parses_from_forgiving_topology_spellings(
    shape: SliceShape, template: str, upper: bool
) -> None:
    topology = template.format(shape.topology.upper() if upper else shape.topology)
    accelerator = shape.accelerator_type if upper else f" {shape.generation.name} "
    parsed = topo.slice_shape(topology, accelerator, shape.chips_per_host)
    assert parsed == shape


def test_spelled_out_examples_from_the_brief() -> None:
    assert topo.slice_shape(" 4X4 ", "TPU-V6E") == topo.slice_shape("4x4", "v6e")
    assert topo.slice_shape("2x2x2", "tpu7x").pod_type == "v7x-16"
    assert topo.slice_shape("4x4", "v5e").pod_type == "v5litepod-16"
    assert topo.slice_shape("4x4", "v5litepod").pod_type == "v5litepod-16"
    assert topo.slice_shape("4x4", "trillium").pod_type == "v6e-16"
    assert topo.slice_shape("4x4", "V6E ").pod_type == "v6e-16"


# --- workers and coordinates --------------------------------------------------------------


def assert_workers_are_a_bijection_onto_the_grid(shape: SliceShape) -> None:
    workers = list(enumerate(product(*(range(side) for side in shape.worker_grid))))
    assert [worker_id for worker_id, _ in workers] == list(range(shape.num_hosts))
    for worker_id, coords in workers:
        assert shape.worker_coords(worker_id) == coords
        assert all(0 <= c < side for c, side in zip(coords, shape.worker_grid, strict=True))
    grid = set(product(*(range(side) for side in shape.worker_grid)))
    assert {coords for _, coords in workers} == grid
    assert len(grid) == shape.num_hosts


@settings(max_examples=300, deadline=None)
@given(shapes.filter(lambda s: s.num_hosts <= 512))
def test_worker_coords_follow_worker_id_order_and_cover_the_grid(shape: SliceShape) -> None:
    assert_workers_are_a_bijection_onto_the_grid(shape)


@pytest.mark.parametrize(
    ("gen", "topology"), [("v5p", "16x16x24"), ("v6e", "16x16"), ("v4", "12x12x24")]
)
def test_largest_slices_are_bijections_too(gen: str, topology: str) -> None:
    assert_workers_are_a_bijection_onto_the_grid(topo.slice_shape(topology, gen))


def test_worker_grid_examples() -> None:
    assert topo.slice_shape("4x4", "v6e").worker_grid == (2, 2)
    assert topo.slice_shape("2x4", "v6e").worker_grid == (1, 1)
    assert topo.slice_shape("2x2x4", "v4").worker_grid == (1, 1, 4)
    assert topo.slice_shape("4x4", "v6e").worker_coords(3) == (1, 1)


@pytest.mark.parametrize("worker_id", [-1, 4, 100])
def test_worker_coords_outside_the_slice_raise(worker_id: int) -> None:
    shape = topo.slice_shape("4x4", "v6e")
    with pytest.raises(InvalidTopologyError) as info:
        shape.worker_coords(worker_id)
    assert str(worker_id) in str(info.value)
    assert "0..3" in str(info.value)


# --- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("accelerator", "fragments"),
    [
        ("v9", ["'v9'", "v2, v3, v4, v5p, v5litepod, v6e, v7x"]),
        ("v6", ["'v6'", "did you mean"]),
        ("gpu", ["'gpu'", "valid:"]),
        ("", ["''", "valid:"]),
        ("v6e-16", ["'v6e-16'", "looks like a pod type", "'v6e'"]),
    ],
)
def test_bad_accelerator_versions(accelerator: str, fragments: list[str]) -> None:
    with pytest.raises(InvalidAcceleratorError) as info:
        topo.slice_shape("4x4", accelerator)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_non_string_accelerator_is_rejected() -> None:
    with pytest.raises(InvalidAcceleratorError) as info:
        topo.generation(6)  # type: ignore[arg-type]
    assert "6" in str(info.value)


def test_invalid_topology_suggests_the_nearest_valid_one() -> None:
    with pytest.raises(InvalidTopologyError) as info:
        topo.slice_shape("3x3", "v6e")
    message = str(info.value)
    assert "'3x3'" in message
    assert "did you mean '4x4'" in message
    for valid in ("1x1", "2x2", "2x4", "4x4", "16x16"):
        assert valid in message


@pytest.mark.parametrize("topology", ["4by4", "4x", "x4", "0x4", "4x0", "-2x2", "4", "2x2x2x2", ""])
def test_malformed_topologies(topology: str) -> None:
    with pytest.raises(InvalidTopologyError) as info:
        topo.slice_shape(topology, "v6e")
    assert repr(topology) in str(info.value)
    assert "'4x4'" in str(info.value)


def test_non_string_topology_is_rejected() -> None:
    with pytest.raises(InvalidTopologyError) as info:
        topo.slice_shape(16, "v6e")  # type: ignore[arg-type]
    assert "16" in str(info.value)


@pytest.mark.parametrize(
    ("topology", "gen", "shape_hint"),
    [("4x4", "v4", "3D (AxBxC)"), ("2x2", "v7x", "3D (AxBxC)"), ("2x2x2", "v6e", "2D (AxB)")],
)
def test_topology_of_the_wrong_dimensionality(topology: str, gen: str, shape_hint: str) -> None:
    with pytest.raises(InvalidTopologyError) as info:
        topo.slice_shape(topology, gen)
    message = str(info.value)
    assert f"'{topology}'" in message
    assert shape_hint in message
    assert "valid:" in message


@pytest.mark.parametrize(
    ("chips_per_vm", "fragments"),
    [
        (3, ["chips_per_vm=3", "1, 2, 4, 8", "valid here: 1, 2, 4, 8"]),
        (16, ["chips_per_vm=16", "valid here: 1, 2, 4, 8", "did you mean 8"]),
        (0, ["chips_per_vm=0", "did you mean 1"]),
        (-4, ["chips_per_vm=-4"]),
        ("4", ["'4'", "must be an integer"]),
        (4.0, ["4.0", "must be an integer"]),
        (True, ["True", "must be an integer"]),
    ],
)
def test_bad_chips_per_vm(chips_per_vm: object, fragments: list[str]) -> None:
    with pytest.raises(InvalidResourceError) as info:
        topo.slice_shape("4x4", "v6e", chips_per_vm)  # type: ignore[arg-type]
    for fragment in fragments:
        assert fragment in str(info.value)


def test_chips_per_vm_must_divide_the_slice() -> None:
    with pytest.raises(InvalidResourceError) as info:
        topo.slice_shape("2x2", "v6e", 8)
    message = str(info.value)
    assert "chips_per_vm=8" in message
    assert "'2x2'" in message
    assert "valid here: 1, 2, 4" in message


@pytest.mark.parametrize(
    "call",
    [
        lambda: topo.slice_shape("4x4", "v9"),
        lambda: topo.slice_shape("3x3", "v6e"),
        lambda: topo.slice_shape("4by4", "v6e"),
        lambda: topo.slice_shape("4x4", "v6e", 3),
        lambda: topo.parse_pod_type("v6e-16"),
        lambda: topo.parse_pod_type("v6e-15"),
    ],
)
def test_every_bad_input_is_a_tpuslice_value_error(call: object) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        call()  # type: ignore[operator]
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, TPUSliceError)


@settings(max_examples=200, deadline=None)
@given(generations, st.lists(st.integers(1, 40), min_size=1, max_size=4))
def test_any_topology_is_accepted_exactly_when_it_is_in_the_table(
    gen: str, sides: list[int]
) -> None:
    topology = "x".join(map(str, sides))
    if len(sides) > 3:
        with pytest.raises(InvalidTopologyError):
            topo.slice_shape(topology, gen)
    elif topology in GENERATIONS[gen].topologies:
        assert topo.slice_shape(topology, gen).topology == topology
    else:
        with pytest.raises(InvalidTopologyError) as info:
            topo.slice_shape(topology, gen)
        assert f"'{topology}'" in str(info.value)
