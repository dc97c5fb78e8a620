"""Our spellings of Ray's TPU conventions, pinned against the installed Ray's own constants
(label keys in ``ray._raylet``, environment names in Ray's TPU accelerator manager), and
what a simulated host advertises against what Ray's own detection computes for it."""

from __future__ import annotations

import pytest
import ray._private.accelerators.tpu as ray_tpu_manager
from ray import _raylet

from tpuslice._tpu import labels
from tpuslice._tpu.topology import slice_shape


def test_label_keys_are_rays() -> None:
    assert labels.SLICE_NAME_LABEL == _raylet.RAY_NODE_TPU_SLICE_NAME_KEY
    assert labels.WORKER_ID_LABEL == _raylet.RAY_NODE_TPU_WORKER_ID_KEY
    assert labels.POD_TYPE_LABEL == _raylet.RAY_NODE_TPU_POD_TYPE_KEY
    assert labels.TOPOLOGY_LABEL == _raylet.RAY_NODE_TPU_TOPOLOGY_KEY


def test_host_environment_names_are_the_ones_ray_reads() -> None:
    assert labels.HOST_ENV_VARS == (
        ray_tpu_manager.GKE_TPU_NAME_ENV_VAR,
        ray_tpu_manager.GKE_TPU_WORKER_ID_ENV_VAR,
        ray_tpu_manager.GKE_TPU_ACCELERATOR_TYPE_ENV_VAR,
        ray_tpu_manager.GKE_TPU_TOPOLOGY_ENV_VAR,
    )


@pytest.mark.parametrize(("topology", "generation"), [("4x4", "v6e"), ("2x2x2", "v4")])
@pytest.mark.parametrize("worker", [0, 1])
def test_resources_are_what_rays_own_detection_gives_that_host(
    topology: str, generation: str, worker: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray computes a TPU host's extra resources from its environment (as on GKE); ours
    for the same host must agree: slice name on every host, the head on worker 0 only."""
    shape = slice_shape(topology, generation)
    for name, value in labels.host_env(shape, "slice-x", worker).items():
        monkeypatch.setenv(name, value)
    theirs = ray_tpu_manager.TPUAcceleratorManager.get_current_node_additional_resources()
    ours = labels.host_resources(shape, "slice-x", worker)
    assert {k: v for k, v in ours.items() if k != labels.TPU_RESOURCE and ":" not in k} == theirs
    assert ray_tpu_manager.TPUAcceleratorManager.get_current_node_accelerator_type() == (
        shape.accelerator_type
    )
