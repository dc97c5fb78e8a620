"""The simulator, which ships as the embedded default: simulated TPU hosts as real Ray
nodes on this machine, their metadata server, a simulated libtpu that takes the TPU as
the real one does, and the process helpers they use.

It sits above the library: no module below it names it or its settings. Its libtpu
reaches production code only through what a TPU VM offers (JAX's plugin hook, the TPU's
files under ``tpuslice._host.tpu_lock.HOST_ROOT``, ``libtpu.sdk``).

May import: :mod:`tpuslice.jax` and below; never :mod:`tpuslice.testing`, which builds on
it.
"""
