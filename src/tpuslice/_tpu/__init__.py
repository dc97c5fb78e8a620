"""The ground floor: pure facts modules (no Ray, no I/O: topologies, sub-slices, Ray's TPU
names, Ray 2.60's helpers, the clock), and the seams to Ray and the OS (``_ray``, ``_auth``,
``_process``, ``_connection``). This ``__init__`` imports nothing, so facts import no Ray.

May import: :mod:`tpuslice.errors` only; the facts modules never import the seams.
"""
