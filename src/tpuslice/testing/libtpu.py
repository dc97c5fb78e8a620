"""The simulated libtpu, for tests and examples: :func:`open_tpu` takes this host's TPU the
way JAX's first use of it would, and fails as libtpu does when another process owns it.
The simulator itself lives in :mod:`tpuslice._sim.libtpu`."""

from tpuslice._sim.libtpu import open_tpu

__all__ = ["open_tpu"]
