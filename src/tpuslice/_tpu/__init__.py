"""The ground floor. Its facts modules are pure values, no Ray and no I/O: TPU
generations and topologies, sub-slice geometry, Ray's TPU label and env names, Ray 2.60's
defaults and differences, the clock. Beside them, the seams to Ray and the OS: ``_ray``
(the only module that touches Ray's private names), ``_auth`` (joining a cluster with
its token), ``_process`` (what a process keeps for its life: lazy public names, exit
hooks) and ``_connection`` (what it keeps while connected: threads, handles, caches,
writers). This ``__init__`` imports nothing, so importing a facts module imports no Ray.

May import: :mod:`tpuslice.errors` only; the facts modules never import the seams.
"""
