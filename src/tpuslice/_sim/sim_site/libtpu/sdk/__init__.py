"""``libtpu.sdk`` on a simulated host: only ``slice``."""

from . import slice

__all__ = ["slice"]
