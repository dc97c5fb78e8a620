"""Test support shipped with tpuslice: a simulated TPU cluster and pytest fixtures.

``SimulatedCluster`` starts a real local Ray cluster whose nodes look like TPU VMs;
``InMemoryCluster`` stands in for Ray in pure tests of the claiming loop; the pytest
plugin (loaded automatically) offers ``simulated_cluster`` and ``tpu_cluster``. Names load
on first use, so the plugin costs a pytest run nothing until a fixture is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tpuslice._tpu import _process

_EXPORTS: dict[str, str] = {
    "InMemoryCluster": "tpuslice.testing.memory",
    "SimulatedCluster": "tpuslice._sim.simulated",
    "SimulatedHost": "tpuslice._sim.simulated",
    "SimulatedSlice": "tpuslice._sim.simulated",
    "SimulatorError": "tpuslice._sim.simulated",
    "SliceSpec": "tpuslice._sim.simulated",
    "assert_no_placement_groups": "tpuslice.testing.checks",
    "assert_slices_ready": "tpuslice.testing.checks",
    "live_placement_groups": "tpuslice.testing.checks",
    "remove_placement_groups": "tpuslice.testing.checks",
}

if TYPE_CHECKING:
    from tpuslice._sim.simulated import (
        SimulatedCluster,
        SimulatedHost,
        SimulatedSlice,
        SimulatorError,
        SliceSpec,
    )
    from tpuslice.testing.checks import (
        assert_no_placement_groups,
        assert_slices_ready,
        live_placement_groups,
        remove_placement_groups,
    )
    from tpuslice.testing.memory import InMemoryCluster


def __getattr__(name: str) -> Any:
    return _process.load(__name__, _EXPORTS, name, globals())


def __dir__() -> list[str]:
    return _process.listing(globals(), __all__)


__all__ = [
    "InMemoryCluster",
    "SimulatedCluster",
    "SimulatedHost",
    "SimulatedSlice",
    "SimulatorError",
    "SliceSpec",
    "assert_no_placement_groups",
    "assert_slices_ready",
    "live_placement_groups",
    "remove_placement_groups",
]
