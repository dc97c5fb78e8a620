"""Stand-in for libtpu on a simulated TPU host (see ``tpuslice._sim.simulated``).

``libtpu.sdk.slice.get_chip_coordinates()`` is offered: what Ray's sub-slice discovery and
tpuslice's read. There is no shared library for JAX to load: JAX's TPU backend here is the
simulated host's ``jax_plugins`` module. Anything else raises ``ImportError`` or
``AttributeError`` as a missing feature would, rather than pretending.
"""

from . import sdk

__all__ = ["get_library_path", "sdk"]


def get_library_path() -> None:
    """Where libtpu's shared library is: nowhere on a simulated host, so JAX's own TPU
    client is not started (its plugin stands in)."""
    return None
