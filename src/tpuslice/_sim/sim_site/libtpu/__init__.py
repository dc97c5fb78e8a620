"""Stand-in for libtpu on a simulated TPU host: only ``sdk.slice.get_chip_coordinates()``,
which Ray and tpuslice read; anything else is missing rather than pretended."""

from . import sdk

__all__ = ["get_library_path", "sdk"]


def get_library_path() -> None:
    """No shared library, so JAX does not start its own TPU client (a plugin stands in)."""
    return None
