"""tpuslice: run SPMD work on whole Google Cloud TPU slices with Ray.

Layers, bottom up: ``topology`` (pure shapes) -> ``cluster`` (read-only view of slices)
-> ``reserve`` (whole-slice placement groups) -> ``run`` (one task per host, ordered).
``testing.SimulatedCluster`` stands in for real TPU VMs; ``cli`` is a thin shell over it all.
"""

from __future__ import annotations

from tpuslice.compat import (
    DEFAULT_MEGASCALE_PORT,
    DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S,
    VALID_TPU_TYPES,
    get_chips_per_host,
    get_num_chips_from_topology,
    get_tpu_coordinator_env_vars,
    get_tpu_num_slices_for_workers,
    get_tpu_resource_per_chip,
    get_tpu_version_from_type,
    get_tpu_worker_resources,
    infer_tpu_pod_type_from_topology,
)
from tpuslice.errors import (
    AmbiguousPodTypeError,
    HostLostError,
    InsufficientSlicesError,
    InvalidAcceleratorError,
    InvalidArgumentError,
    InvalidResourceError,
    InvalidTopologyError,
    ReservationTimeoutError,
    RetriesExhaustedError,
    SliceShutdownError,
    TPUSliceError,
)
from tpuslice.topology import GENERATIONS, Generation, SliceShape, parse_pod_type, slice_shape

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_MEGASCALE_PORT",
    "DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S",
    "GENERATIONS",
    "VALID_TPU_TYPES",
    "AmbiguousPodTypeError",
    "Generation",
    "HostLostError",
    "InsufficientSlicesError",
    "InvalidAcceleratorError",
    "InvalidArgumentError",
    "InvalidResourceError",
    "InvalidTopologyError",
    "ReservationTimeoutError",
    "RetriesExhaustedError",
    "SliceShape",
    "SliceShutdownError",
    "TPUSliceError",
    "__version__",
    "get_chips_per_host",
    "get_num_chips_from_topology",
    "get_tpu_coordinator_env_vars",
    "get_tpu_num_slices_for_workers",
    "get_tpu_resource_per_chip",
    "get_tpu_version_from_type",
    "get_tpu_worker_resources",
    "infer_tpu_pod_type_from_topology",
    "parse_pod_type",
    "slice_shape",
]
