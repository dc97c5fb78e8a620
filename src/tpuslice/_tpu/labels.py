"""What Ray gives a TPU VM: node labels, resources and environment. Pure; spelled once so
the simulator, host detection and the cluster view agree."""

from __future__ import annotations

from collections.abc import Mapping

from tpuslice._tpu.topology import SliceShape

CallEnv = dict[str, str | None]
"""Variables set on a host around one call of the user's work; None unsets one for it."""

SLICE_NAME_LABEL = "ray.io/tpu-slice-name"
WORKER_ID_LABEL = "ray.io/tpu-worker-id"
POD_TYPE_LABEL = "ray.io/tpu-pod-type"
TOPOLOGY_LABEL = "ray.io/tpu-topology"
ACCELERATOR_TYPE_LABEL = "ray.io/accelerator-type"

TPU_RESOURCE = "TPU"

ENV_TPU_NAME = "TPU_NAME"
ENV_TPU_WORKER_ID = "TPU_WORKER_ID"
ENV_TPU_ACCELERATOR_TYPE = "TPU_ACCELERATOR_TYPE"
ENV_TPU_TOPOLOGY = "TPU_TOPOLOGY"
HOST_ENV_VARS = (ENV_TPU_NAME, ENV_TPU_WORKER_ID, ENV_TPU_ACCELERATOR_TYPE, ENV_TPU_TOPOLOGY)


def host_labels(shape: SliceShape, slice_name: str, worker_id: int) -> dict[str, str]:
    """The node labels Ray sets on TPU worker ``worker_id`` of slice ``slice_name``."""
    return {
        SLICE_NAME_LABEL: slice_name,
        WORKER_ID_LABEL: str(worker_id),
        POD_TYPE_LABEL: shape.pod_type,
        TOPOLOGY_LABEL: shape.topology,
        ACCELERATOR_TYPE_LABEL: shape.accelerator_type,
    }


def host_resources(
    shape: SliceShape, slice_name: str, worker_id: int, tpu_resource_per_chip: int = 1
) -> dict[str, float]:
    """The resources Ray gives a TPU host; ``TPU-<podtype>-head`` on worker 0 only."""
    resources: dict[str, float] = {
        TPU_RESOURCE: float(shape.chips_per_host * tpu_resource_per_chip),
        slice_name: 1.0,
        f"accelerator_type:{shape.accelerator_type}": 1.0,
    }
    if worker_id == 0:
        resources[shape.head_resource] = 1.0
    return resources


def host_env(shape: SliceShape, slice_name: str, worker_id: int) -> dict[str, str]:
    """The ``TPU_*`` environment a TPU VM's processes see (GKE sets it)."""
    return {
        ENV_TPU_NAME: slice_name,
        ENV_TPU_WORKER_ID: str(worker_id),
        ENV_TPU_ACCELERATOR_TYPE: shape.pod_type,
        ENV_TPU_TOPOLOGY: shape.topology,
    }


def selector_matches(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    """Whether a node's labels satisfy a selector as Ray judges it (``v``, ``!v``,
    ``in(a,b)``, ``!in(a,b)``; a missing label matches only the negative forms)."""
    for key, wanted in selector.items():
        have = labels.get(key)
        negative = wanted.startswith("!")
        body = wanted[1:] if negative else wanted
        if body.startswith("in(") and body.endswith(")"):
            values = {v.strip() for v in body[3:-1].split(",")}
        else:
            values = {body}
        found = have is not None and have in values
        if found == negative:
            return False
    return True
