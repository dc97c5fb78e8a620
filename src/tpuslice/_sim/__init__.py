"""The simulator, which ships as the embedded default: simulated TPU hosts as real Ray
nodes on this machine, their metadata server, a simulated libtpu that takes the TPU as
the real one does, and the process helpers they use.

May import: :mod:`tpuslice._reserve` (with its queue, which a simulated cluster starts when
a driver connects) and below; never :mod:`tpuslice.testing`, which builds on it.
"""
