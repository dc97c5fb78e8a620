"""Sub-slice arithmetic (tpuslice._tpu.subslice) against Ray 2.60's own, on every parent Ray
knows: worker grids, chip coordinates -> physical position, labels, valid parents. Pure."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import ray._private.accelerators.tpu as ray_accel
import ray.util.tpu as ray_tpu

from tpuslice._tpu import compat, keys, subslice
from tpuslice.errors import InvalidTopologyError

RAY_2D = dict(ray_accel._VALID_TOPOLOGY_WORKER_DIMS_2D)
RAY_3D = dict(ray_accel._VALID_TOPOLOGY_WORKER_DIMS_3D)
RAY_PARENTS = [*RAY_2D, *RAY_3D]


def test_worker_grids_are_rays() -> None:
    for topology, dims in {**RAY_2D, **RAY_3D}.items():
        assert subslice.worker_dims(topology) == dims, topology


@pytest.mark.parametrize("parent", RAY_PARENTS)
def test_coordinates_give_rays_physical_position_and_labels(parent: str) -> None:
    """Every host position of every parent Ray knows (chips listed in a shuffled order):
    the same position as Ray's, and Ray's labels, ours being a superset only by shapes
    Ray's table does not have."""
    rng = random.Random(parent)
    for physical in range(math.prod(subslice.worker_dims(parent))):
        coordinates = subslice.chip_coordinates(physical, parent)
        rng.shuffle(coordinates)
        theirs = ray_accel._get_physical_worker_id_from_coords(coordinates, parent)
        ours = subslice.physical_position(coordinates, parent)
        assert ours == theirs == physical
        ray_labels = ray_accel._build_subslice_labels(physical, parent)
        our_labels = subslice.host_labels(physical, parent)
        assert {k: our_labels[k] for k in ray_labels} == ray_labels
        extra = {k.removeprefix(subslice.SUBSLICE_LABEL_PREFIX) for k in our_labels} - {
            k.removeprefix(subslice.SUBSLICE_LABEL_PREFIX) for k in ray_labels
        }
        assert not extra & set(RAY_2D) and not extra & set(RAY_3D), extra


@pytest.mark.parametrize("parent", ["4x4", "8x8", "2x2x4", "4x4x8"])
def test_members_tile_the_parent_into_equal_boxes(parent: str) -> None:
    """Under a scrambled layout, each sub-slice's hosts are those whose physical positions
    form one box, and every host is in exactly one sub-slice of each shape."""
    hosts = math.prod(subslice.worker_dims(parent))
    physical = list(range(hosts))
    random.Random(7).shuffle(physical)
    by_worker = dict(enumerate(physical))
    for sub in subslice.subslice_topologies(parent):
        found = subslice.members(by_worker, parent, sub)
        size = math.prod(subslice.worker_dims(sub))
        assert sorted(w for ws in found.values() for w in ws) == list(range(hosts))
        assert all(len(ws) == size for ws in found.values())


def test_v6e_4x4_cut_into_2x4_halves_is_rays_example() -> None:
    """Ray's docstring example: a 4x4 of 2x2 hosts has two 2x4 sub-slices (rows of the
    worker grid), and four 2x2 ones (one host each)."""
    assert subslice.subslice_topologies("4x4") == ["2x2", "2x4"]
    identity = {w: w for w in range(4)}
    assert subslice.members(identity, "4x4", "2x4") == {0: [0, 1], 1: [2, 3]}
    assert subslice.members(identity, "4x4", "2x2") == {i: [i] for i in range(4)}


def test_a_ragged_last_box_is_not_a_sub_slice() -> None:
    """16x16x24 (8, 8, 24 hosts) holds one 16x16x16 box along its last side and a ragged
    rest of 8: Ray labels both with index 0 and 1, and skips the short one; so do we."""
    grid = subslice.worker_dims("16x16x24")
    by_worker = {w: w for w in range(math.prod(grid))}
    found = subslice.members(by_worker, "16x16x24", "16x16x16")
    assert list(found) == [0]


@pytest.mark.parametrize(
    ("parent", "sub", "whole"), [("4x4x12", "2x2x8", 4), ("12x12x12", "4x4x8", 9)]
)
def test_a_ragged_rest_on_a_later_side_does_not_spoil_whole_boxes(
    parent: str, sub: str, whole: int
) -> None:
    """Ray's numbering gives hosts past the last whole box on a later side the index of a
    whole box; those hosts are left out, and every whole box is a sub-slice."""
    hosts = math.prod(subslice.worker_dims(parent))
    found = subslice.members({w: w for w in range(hosts)}, parent, sub)
    assert len(found) == whole
    assert all(len(ws) == math.prod(subslice.worker_dims(sub)) for ws in found.values())


def test_physical_position_read_back_from_labels_rays_discovery_left() -> None:
    for parent in ("8x8", "4x4x8"):
        for physical in range(math.prod(subslice.worker_dims(parent))):
            labels = ray_accel._build_subslice_labels(physical, parent)
            assert subslice.physical_from_labels(labels, parent) == physical


def node(topology: str) -> dict[str, object]:
    return {"Alive": True, "Labels": {"ray.io/tpu-topology": topology}}


@pytest.mark.parametrize("sub", ["2x2", "2x4", "4x4", "2x2x1", "2x2x2", "2x4x4"])
def test_valid_parents_are_rays(sub: str) -> None:
    cluster = ["2x4", "4x4", "4x8", "8x8", "2x2x2", "2x2x4", "4x4x4", "1x1"]
    nodes = [node(t) for t in cluster]
    assert subslice.valid_parents(sub, cluster) == ray_tpu._find_valid_parent_topologies(sub, nodes)


def test_a_sub_topology_without_a_worker_grid_names_the_valid_ones() -> None:
    with pytest.raises(InvalidTopologyError, match="is not a grid of 4-chip hosts; valid: 2x2"):
        subslice.valid_parents("1x1", ["4x4"])


def test_kv_key_and_label_key_are_rays() -> None:
    assert subslice.kv_key("v6e-16-a") == ray_tpu._get_subslice_kv_key("v6e-16-a")
    assert keys.RAY_SUBSLICE_NAMESPACE == ray_tpu._TPU_SUBSLICE_KV_NAMESPACE
    assert subslice.label_key("2x4") == f"{ray_accel.TPU_SUBSLICE_LABEL_PREFIX}2x4"


@pytest.mark.parametrize(
    "difference", compat.SUBSLICE_DIFFERENCES + compat.QUEUE_DIFFERENCES, ids=lambda d: d.what
)
def test_each_deliberate_difference_names_a_test_that_exists(
    difference: compat.Difference,
) -> None:
    path, _, name = difference.shown_by.partition("::")
    source = (Path(__file__).parent.parent / path).read_text()
    assert f"def {name}(" in source, difference.shown_by


def ray_node(node_id: str, worker: str, alive: bool = True) -> dict[str, object]:
    labels = {"ray.io/tpu-slice-name": "s", "ray.io/tpu-worker-id": worker}
    return {"NodeID": node_id, "Alive": alive, "Labels": labels, "Resources": {"TPU": 4.0}}


def test_rays_pick_counts_a_fully_used_host_as_idle() -> None:
    """Pinned Ray 2.60 behaviour (compat.SUBSLICE_DIFFERENCES): a host whose 4 TPUs are
    all in use has no ``TPU`` key in its available resources, and Ray's sub-slice search
    reads the missing key as all free, so it offers sub-slice 0 though it is held."""
    nodes = [ray_node(f"n{w}", str(w)) for w in range(4)]
    by_worker = ray_tpu._build_slice_worker_to_node(nodes)
    labels = {str(w): ray_accel._build_subslice_labels(w, "4x4") for w in range(4)}
    held = {"n0": {"CPU": 1.0}, "n1": {"CPU": 1.0}}  # sub-slice 0's hosts, TPUs all taken
    workers, index = ray_tpu._find_available_subslice("s", "2x4", labels, held, by_worker)
    assert (workers, index) == (["0", "1"], 0)


def test_rays_view_of_a_replaced_host_can_be_its_dead_node() -> None:
    """Pinned Ray 2.60 behaviour: Ray maps (slice, worker id) to whichever node of that
    id ``ray.nodes()`` lists last; GCS keeps dead nodes listed, and on the simulator the
    dead one came last, so every sub-slice with the replaced host stays unschedulable."""
    nodes = [ray_node("new", "2"), ray_node("old", "2", alive=False)]
    assert ray_tpu._build_slice_worker_to_node(nodes)[("s", "2")]["Alive"] is False
