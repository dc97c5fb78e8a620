"""Stand-in for libtpu on a simulated TPU host (see ``tpuslice._sim.simulated``).

Only ``libtpu.sdk.slice.get_chip_coordinates()`` is offered: what Ray's sub-slice discovery
and tpuslice's read. Anything else raises ``ImportError``/``AttributeError`` as a missing
feature would, rather than pretending.
"""

from . import sdk

__all__ = ["sdk"]
