"""The ground floor. Pure facts modules (no Ray, no I/O): generations and topologies,
sub-slices, Ray's TPU names, Ray 2.60's helpers and differences, the clock. Beside them the
seams to Ray and the OS: ``_ray`` (Ray's private names), ``_auth``, ``_process`` and
``_connection``. This ``__init__`` imports nothing, so a facts module imports no Ray.

May import: :mod:`tpuslice.errors` only; the facts modules never import the seams.
"""
