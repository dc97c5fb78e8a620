"""tpuslice: run SPMD work on whole Google Cloud TPU slices with Ray.

Layers, bottom up: ``topology`` (pure shapes) -> ``cluster`` (read-only view of slices)
-> ``reserve`` (whole-slice placement groups) -> ``run`` (one task per host, in rank order).
``testing.SimulatedCluster`` stands in for real TPU VMs; ``cli`` is a thin shell over it all.

The public names load on first use (PEP 562), so ``import tpuslice`` (and the pytest
plugin, which every pytest run in an environment with tpuslice loads) does not import Ray.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tpuslice import _lazy

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "SliceActorGroup": "tpuslice.actors",
    "ClusterSnapshot": "tpuslice.cluster",
    "HostInfo": "tpuslice.cluster",
    "HostState": "tpuslice.cluster",
    "SliceInfo": "tpuslice.cluster",
    "SliceState": "tpuslice.cluster",
    "read_snapshot": "tpuslice.cluster",
    "DEFAULT_MEGASCALE_PORT": "tpuslice.compat",
    "DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S": "tpuslice.compat",
    "VALID_TPU_TYPES": "tpuslice.compat",
    "get_chips_per_host": "tpuslice.compat",
    "get_num_chips_from_topology": "tpuslice.compat",
    "get_tpu_coordinator_env_vars": "tpuslice.compat",
    "get_tpu_num_slices_for_workers": "tpuslice.compat",
    "get_tpu_resource_per_chip": "tpuslice.compat",
    "get_tpu_version_from_type": "tpuslice.compat",
    "get_tpu_worker_resources": "tpuslice.compat",
    "infer_tpu_pod_type_from_topology": "tpuslice.compat",
    "AmbiguousPodTypeError": "tpuslice.errors",
    "HostHungError": "tpuslice.errors",
    "HostLostError": "tpuslice.errors",
    "InsufficientSlicesError": "tpuslice.errors",
    "InvalidAcceleratorError": "tpuslice.errors",
    "InvalidArgumentError": "tpuslice.errors",
    "InvalidResourceError": "tpuslice.errors",
    "InvalidTopologyError": "tpuslice.errors",
    "NoSubsliceParentError": "tpuslice.errors",
    "NotConnectedError": "tpuslice.errors",
    "ReservationTimeoutError": "tpuslice.errors",
    "RetriesExhaustedError": "tpuslice.errors",
    "SliceShutdownError": "tpuslice.errors",
    "SubsliceUnavailableError": "tpuslice.errors",
    "DiscoveryFailedError": "tpuslice.errors",
    "SubslicePlacementGroup": "tpuslice.subslices",
    "TPU_SUBSLICE_LABEL_PREFIX": "tpuslice.subslices",
    "subslice_placement_group": "tpuslice.subslices",
    "TPUInUseError": "tpuslice.errors",
    "TPUSliceError": "tpuslice.errors",
    "init_jax_profiler": "tpuslice.jax",
    "heartbeat": "tpuslice.heartbeats",
    "Notice": "tpuslice.notices",
    "get_current_pod_name": "tpuslice.node",
    "get_current_pod_worker_count": "tpuslice.node",
    "get_num_tpu_chips_on_node": "tpuslice.node",
    "SlicePlacementGroup": "tpuslice.reserve",
    "reserve_tpu_slice": "tpuslice.reserve",
    "slice_placement_group": "tpuslice.reserve",
    "AttemptEvent": "tpuslice.resilient",
    "Outcome": "tpuslice.resilient",
    "classify": "tpuslice.resilient",
    "run_resilient": "tpuslice.resilient",
    "HostContext": "tpuslice.context",
    "current_host": "tpuslice.context",
    "dispatch": "tpuslice.run",
    "run_on_slice": "tpuslice.run",
    "get_num_ready_tpu_slices": "tpuslice.slices",
    "get_num_tpu_slices": "tpuslice.slices",
    "get_tpu_nodes_for_slice": "tpuslice.slices",
    "get_tpu_slice_name_from_node": "tpuslice.slices",
    "GENERATIONS": "tpuslice.topology",
    "Generation": "tpuslice.topology",
    "SliceShape": "tpuslice.topology",
    "parse_pod_type": "tpuslice.topology",
    "slice_shape": "tpuslice.topology",
}
"""Each public name and the module that defines it."""

if TYPE_CHECKING:
    from tpuslice.actors import (
        SliceActorGroup,
    )
    from tpuslice.cluster import (
        ClusterSnapshot,
        HostInfo,
        HostState,
        SliceInfo,
        SliceState,
        read_snapshot,
    )
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
    from tpuslice.context import HostContext, current_host
    from tpuslice.errors import (
        AmbiguousPodTypeError,
        DiscoveryFailedError,
        HostHungError,
        HostLostError,
        InsufficientSlicesError,
        InvalidAcceleratorError,
        InvalidArgumentError,
        InvalidResourceError,
        InvalidTopologyError,
        NoSubsliceParentError,
        NotConnectedError,
        ReservationTimeoutError,
        RetriesExhaustedError,
        SliceShutdownError,
        SubsliceUnavailableError,
        TPUInUseError,
        TPUSliceError,
    )
    from tpuslice.heartbeats import heartbeat
    from tpuslice.jax import (
        init_jax_profiler,
    )
    from tpuslice.node import (
        get_current_pod_name,
        get_current_pod_worker_count,
        get_num_tpu_chips_on_node,
    )
    from tpuslice.notices import Notice
    from tpuslice.reserve import (
        SlicePlacementGroup,
        reserve_tpu_slice,
        slice_placement_group,
    )
    from tpuslice.resilient import (
        AttemptEvent,
        Outcome,
        classify,
        run_resilient,
    )
    from tpuslice.run import (
        dispatch,
        run_on_slice,
    )
    from tpuslice.slices import (
        get_num_ready_tpu_slices,
        get_num_tpu_slices,
        get_tpu_nodes_for_slice,
        get_tpu_slice_name_from_node,
    )
    from tpuslice.subslices import (
        TPU_SUBSLICE_LABEL_PREFIX,
        SubslicePlacementGroup,
        subslice_placement_group,
    )
    from tpuslice.topology import (
        GENERATIONS,
        Generation,
        SliceShape,
        parse_pod_type,
        slice_shape,
    )


def __getattr__(name: str) -> Any:
    return _lazy.load(__name__, _EXPORTS, name, globals())


def __dir__() -> list[str]:
    return _lazy.listing(globals(), __all__)


__all__ = [
    "DEFAULT_MEGASCALE_PORT",
    "DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S",
    "GENERATIONS",
    "TPU_SUBSLICE_LABEL_PREFIX",
    "VALID_TPU_TYPES",
    "AmbiguousPodTypeError",
    "AttemptEvent",
    "ClusterSnapshot",
    "DiscoveryFailedError",
    "Generation",
    "HostContext",
    "HostHungError",
    "HostInfo",
    "HostLostError",
    "HostState",
    "InsufficientSlicesError",
    "InvalidAcceleratorError",
    "InvalidArgumentError",
    "InvalidResourceError",
    "InvalidTopologyError",
    "NoSubsliceParentError",
    "NotConnectedError",
    "Notice",
    "Outcome",
    "ReservationTimeoutError",
    "RetriesExhaustedError",
    "SliceActorGroup",
    "SliceInfo",
    "SlicePlacementGroup",
    "SliceShape",
    "SliceShutdownError",
    "SliceState",
    "SubslicePlacementGroup",
    "SubsliceUnavailableError",
    "TPUInUseError",
    "TPUSliceError",
    "__version__",
    "classify",
    "current_host",
    "dispatch",
    "get_chips_per_host",
    "get_current_pod_name",
    "get_current_pod_worker_count",
    "get_num_chips_from_topology",
    "get_num_ready_tpu_slices",
    "get_num_tpu_chips_on_node",
    "get_num_tpu_slices",
    "get_tpu_coordinator_env_vars",
    "get_tpu_nodes_for_slice",
    "get_tpu_num_slices_for_workers",
    "get_tpu_resource_per_chip",
    "get_tpu_slice_name_from_node",
    "get_tpu_version_from_type",
    "get_tpu_worker_resources",
    "heartbeat",
    "infer_tpu_pod_type_from_topology",
    "init_jax_profiler",
    "parse_pod_type",
    "read_snapshot",
    "reserve_tpu_slice",
    "run_on_slice",
    "run_resilient",
    "slice_placement_group",
    "slice_shape",
    "subslice_placement_group",
]
