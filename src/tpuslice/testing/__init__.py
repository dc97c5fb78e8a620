"""Test support shipped with tpuslice: a simulated TPU cluster and pytest fixtures.

``SimulatedCluster`` starts a real local Ray cluster whose nodes look like TPU VMs; the
pytest plugin (loaded automatically) offers ``simulated_cluster`` and ``tpu_cluster``.
"""

from tpuslice.testing.checks import (
    assert_no_placement_groups,
    live_placement_groups,
    remove_placement_groups,
)
from tpuslice.testing.simulated import (
    SimulatedCluster,
    SimulatedHost,
    SimulatedSlice,
    SimulatorError,
    SliceSpec,
)

__all__ = [
    "SimulatedCluster",
    "SimulatedHost",
    "SimulatedSlice",
    "SimulatorError",
    "SliceSpec",
    "assert_no_placement_groups",
    "live_placement_groups",
    "remove_placement_groups",
]
