"""tpuslice: run SPMD work on whole Google Cloud TPU slices with Ray.

Layers, lowest first; a module imports only its layer and those below (tests/test_layers.py):
``errors`` -> ``_tpu`` (pure facts) -> its seams to Ray and the OS, ``_tpu._process``,
``_tpu._ray``, ``_tpu._auth``, ``_tpu._connection`` -> ``_host`` (one host) -> ``_view``
(reading the cluster) -> ``record`` -> ``_reserve.queue`` (the cluster's queue) ->
``_reserve`` (reserving) -> ``_run`` (running) -> ``jax`` -> ``_sim`` (the simulator) ->
``cli`` -> ``testing``; this ``__init__`` offers the public names of them all.

The public names load on first use (PEP 562), so ``import tpuslice`` (and the pytest
plugin) does not import Ray.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tpuslice._tpu import _process

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "SliceActorGroup": "tpuslice._run.actors",
    "HostVerdict": "tpuslice._run.health",
    "SliceHealth": "tpuslice._run.health",
    "check_slice": "tpuslice._run.health",
    "ClusterSnapshot": "tpuslice._view.cluster",
    "HostInfo": "tpuslice._view.cluster",
    "HostState": "tpuslice._view.cluster",
    "SliceInfo": "tpuslice._view.cluster",
    "SliceState": "tpuslice._view.cluster",
    "read_snapshot": "tpuslice._view.cluster",
    "DEFAULT_MEGASCALE_PORT": "tpuslice._tpu.compat",
    "DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S": "tpuslice._tpu.compat",
    "VALID_TPU_TYPES": "tpuslice._tpu.compat",
    "get_chips_per_host": "tpuslice._tpu.compat",
    "get_num_chips_from_topology": "tpuslice._tpu.compat",
    "get_tpu_coordinator_env_vars": "tpuslice._tpu.compat",
    "get_tpu_num_slices_for_workers": "tpuslice._tpu.compat",
    "get_tpu_resource_per_chip": "tpuslice._tpu.compat",
    "get_tpu_version_from_type": "tpuslice._tpu.compat",
    "get_tpu_worker_resources": "tpuslice._tpu.compat",
    "infer_tpu_pod_type_from_topology": "tpuslice._tpu.compat",
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
    "SliceUnhealthyError": "tpuslice.errors",
    "SliceShutdownError": "tpuslice.errors",
    "SubsliceUnavailableError": "tpuslice.errors",
    "DiscoveryFailedError": "tpuslice.errors",
    "SubslicePlacementGroup": "tpuslice._run.subslices",
    "TPU_SUBSLICE_LABEL_PREFIX": "tpuslice._run.subslices",
    "subslice_placement_group": "tpuslice._run.subslices",
    "TPUInUseError": "tpuslice.errors",
    "TokenAuthError": "tpuslice.errors",
    "connect": "tpuslice._tpu._auth",
    "TPUSliceError": "tpuslice.errors",
    "init_jax_profiler": "tpuslice.jax",
    "heartbeat": "tpuslice._host.heartbeats",
    "checkpointed": "tpuslice._host.heartbeats",
    "Account": "tpuslice.record.goodput",
    "Notice": "tpuslice._host.notices",
    "get_current_pod_name": "tpuslice._host.node",
    "get_current_pod_worker_count": "tpuslice._host.node",
    "get_num_tpu_chips_on_node": "tpuslice._host.node",
    "SlicePlacementGroup": "tpuslice._reserve.reserve",
    "reserve_tpu_slice": "tpuslice._reserve.reserve",
    "slice_placement_group": "tpuslice._reserve.reserve",
    "AttemptEvent": "tpuslice._run.observe",
    "Outcome": "tpuslice._run.observe",
    "classify": "tpuslice._run.resilient",
    "run_resilient": "tpuslice._run.resilient",
    "HostContext": "tpuslice._host.context",
    "current_host": "tpuslice._host.context",
    "dispatch": "tpuslice._run.run",
    "run_on_slice": "tpuslice._run.run",
    "get_num_ready_tpu_slices": "tpuslice._view.slices",
    "get_num_tpu_slices": "tpuslice._view.slices",
    "get_tpu_nodes_for_slice": "tpuslice._view.slices",
    "get_tpu_slice_name_from_node": "tpuslice._view.slices",
    "GENERATIONS": "tpuslice._tpu.topology",
    "Generation": "tpuslice._tpu.topology",
    "SliceShape": "tpuslice._tpu.topology",
    "parse_pod_type": "tpuslice._tpu.topology",
    "slice_shape": "tpuslice._tpu.topology",
}
"""Each public name and the module that defines it."""

if TYPE_CHECKING:
    from tpuslice._host.context import HostContext, current_host
    from tpuslice._host.heartbeats import checkpointed, heartbeat
    from tpuslice._host.node import (
        get_current_pod_name,
        get_current_pod_worker_count,
        get_num_tpu_chips_on_node,
    )
    from tpuslice._host.notices import Notice
    from tpuslice._reserve.reserve import (
        SlicePlacementGroup,
        reserve_tpu_slice,
        slice_placement_group,
    )
    from tpuslice._run.actors import SliceActorGroup
    from tpuslice._run.health import HostVerdict, SliceHealth, check_slice
    from tpuslice._run.observe import AttemptEvent, Outcome
    from tpuslice._run.resilient import classify, run_resilient
    from tpuslice._run.run import dispatch, run_on_slice
    from tpuslice._run.subslices import (
        TPU_SUBSLICE_LABEL_PREFIX,
        SubslicePlacementGroup,
        subslice_placement_group,
    )
    from tpuslice._tpu._auth import connect
    from tpuslice._tpu.compat import (
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
    from tpuslice._tpu.topology import (
        GENERATIONS,
        Generation,
        SliceShape,
        parse_pod_type,
        slice_shape,
    )
    from tpuslice._view.cluster import (
        ClusterSnapshot,
        HostInfo,
        HostState,
        SliceInfo,
        SliceState,
        read_snapshot,
    )
    from tpuslice._view.slices import (
        get_num_ready_tpu_slices,
        get_num_tpu_slices,
        get_tpu_nodes_for_slice,
        get_tpu_slice_name_from_node,
    )
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
        SliceUnhealthyError,
        SubsliceUnavailableError,
        TokenAuthError,
        TPUInUseError,
        TPUSliceError,
    )
    from tpuslice.jax import init_jax_profiler
    from tpuslice.record.goodput import Account


def __getattr__(name: str) -> Any:
    return _process.load(__name__, _EXPORTS, name, globals())


def __dir__() -> list[str]:
    return _process.listing(globals(), __all__)


__all__ = [
    "DEFAULT_MEGASCALE_PORT",
    "DEFAULT_TPU_HEAD_RESERVATION_TIMEOUT_S",
    "GENERATIONS",
    "TPU_SUBSLICE_LABEL_PREFIX",
    "VALID_TPU_TYPES",
    "Account",
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
    "HostVerdict",
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
    "SliceHealth",
    "SliceInfo",
    "SlicePlacementGroup",
    "SliceShape",
    "SliceShutdownError",
    "SliceState",
    "SliceUnhealthyError",
    "SubslicePlacementGroup",
    "SubsliceUnavailableError",
    "TPUInUseError",
    "TPUSliceError",
    "TokenAuthError",
    "__version__",
    "check_slice",
    "checkpointed",
    "classify",
    "connect",
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
