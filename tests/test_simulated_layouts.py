"""The simulator's chip coordinates, read back through its ``libtpu.sdk`` stand-in as a
simulated host's process would, against Ray 2.60's own reading of them: for scrambled
v6e 4x4 and 8x8 and v4 / v5p layouts, every valid sub-topology's members are the hosts
Ray labels with one index. No cluster: the hosts' roots are written to a temp dir (an
8x8 has 16 hosts, more than the test cluster's slices)."""

from __future__ import annotations

import importlib.util
import math
from collections import defaultdict
from pathlib import Path
from types import ModuleType

import pytest
import ray._private.accelerators.tpu as ray_accel

from tpuslice._sim.simulated import SIM_SITE, make_host_root, physical_layout
from tpuslice._tpu import subslice
from tpuslice._tpu.topology import slice_shape
from tpuslice._view import layouts


def stand_in_sdk() -> ModuleType:
    path = SIM_SITE / "libtpu" / "sdk" / "slice.py"
    spec = importlib.util.spec_from_file_location("sim_libtpu_sdk_slice", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, generation: str, topology: str, seed: int
) -> tuple[dict[int, int], dict[int, list[list[int]]]]:
    """The slice's layout, and what each host's ``get_chip_coordinates()`` says."""
    shape = slice_shape(topology, generation)
    name = f"{shape.pod_type}-a"
    physical = physical_layout(shape, name, seed)
    sdk = stand_in_sdk()
    coordinates = {}
    for worker in range(shape.num_hosts):
        root = tmp_path / name / str(worker)
        make_host_root(root, shape, name, worker, physical)
        monkeypatch.setenv("TPUSLICE_SIM_HOST_ROOT", str(root))
        chips = sdk.get_chip_coordinates()
        assert [c.chip_index() for c in chips] == list(range(shape.chips_per_host))
        assert {c.hostname() for c in chips} == {f"{name}-w-{worker}"}
        coordinates[worker] = [c.coordinates() for c in chips]
    return physical, coordinates


@pytest.mark.parametrize(
    ("generation", "topology"),
    [("v6e", "4x4"), ("v6e", "8x8"), ("v4", "2x2x4"), ("v5p", "4x4x4")],
)
def test_every_sub_topology_matches_rays_labels_on_simulated_coordinates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, generation: str, topology: str
) -> None:
    physical, coordinates = reported(tmp_path, monkeypatch, generation, topology, seed=11)
    assert list(physical.values()) != sorted(physical.values())  # scrambled
    ours = layouts.positions_from_coordinates(coordinates, topology)
    theirs = {
        w: ray_accel._get_physical_worker_id_from_coords(c, topology)
        for w, c in coordinates.items()
    }
    assert ours == theirs == physical
    ray_labels = {w: ray_accel._build_subslice_labels(p, topology) for w, p in theirs.items()}
    rays_subs = {k.removeprefix(subslice.SUBSLICE_LABEL_PREFIX) for k in ray_labels[0]}
    ours_subs = set(subslice.subslice_topologies(topology))
    assert rays_subs and rays_subs <= ours_subs, topology
    for sub in sorted(ours_subs):
        found = subslice.members(ours, topology, sub)
        size = math.prod(subslice.worker_dims(sub))
        assert all(len(ws) == size for ws in found.values()), sub
        assert len({w for ws in found.values() for w in ws}) == size * len(found), sub
        if sub not in rays_subs:  # a shape Ray's worker-grid table lacks (v6e 2x8)
            continue
        by_label: dict[int, list[int]] = defaultdict(list)
        for worker, labels in sorted(ray_labels.items()):
            by_label[int(labels[subslice.label_key(sub)])].append(worker)
        assert found == {i: ws for i, ws in by_label.items() if len(ws) == size}, sub


def test_a_host_of_no_slice_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPUSLICE_SIM_HOST_ROOT", str(tmp_path))
    with pytest.raises(RuntimeError, match="no TPU chips on this host"):
        stand_in_sdk().get_chip_coordinates()
