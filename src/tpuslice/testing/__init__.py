"""Test support shipped with tpuslice: a simulated TPU cluster and pytest fixtures.

``SimulatedCluster`` starts a real local Ray cluster whose nodes look like TPU VMs;
``InMemoryCluster`` stands in for Ray in pure tests of the claiming loop; the pytest
plugin (loaded automatically) offers ``simulated_cluster`` and ``tpu_cluster``. Names load
on first use, so the plugin costs a pytest run nothing until a fixture is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    "InMemoryCluster": "tpuslice.testing.memory",
    "SimulatedCluster": "tpuslice.testing.simulated",
    "SimulatedHost": "tpuslice.testing.simulated",
    "SimulatedSlice": "tpuslice.testing.simulated",
    "SimulatorError": "tpuslice.testing.simulated",
    "SliceSpec": "tpuslice.testing.simulated",
    "assert_no_placement_groups": "tpuslice.testing.checks",
    "live_placement_groups": "tpuslice.testing.checks",
    "remove_placement_groups": "tpuslice.testing.checks",
}

if TYPE_CHECKING:
    from tpuslice.testing.checks import (
        assert_no_placement_groups,
        live_placement_groups,
        remove_placement_groups,
    )
    from tpuslice.testing.memory import InMemoryCluster
    from tpuslice.testing.simulated import (
        SimulatedCluster,
        SimulatedHost,
        SimulatedSlice,
        SimulatorError,
        SliceSpec,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        try:  # a submodule, such as ``tpuslice.jax`` after a bare ``import tpuslice``
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
        raise AttributeError(f"module 'tpuslice.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "InMemoryCluster",
    "SimulatedCluster",
    "SimulatedHost",
    "SimulatedSlice",
    "SimulatorError",
    "SliceSpec",
    "assert_no_placement_groups",
    "live_placement_groups",
    "remove_placement_groups",
]
