"""The simulator: simulated TPU hosts as real Ray nodes on this machine, with their
metadata servers and a libtpu that takes the TPU as the real one does. Production code
reaches it only through what a TPU VM offers (JAX's plugin hook, files, ``libtpu.sdk``).

May import: :mod:`tpuslice.jax` and below; never :mod:`tpuslice.testing`, which builds on it.
"""
