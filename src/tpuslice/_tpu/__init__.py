"""Pure facts and values, no Ray and no I/O: TPU generations and topologies, sub-slice
geometry, Ray's TPU label and env names, Ray 2.60's defaults and differences, the clock.

May import: :mod:`tpuslice.errors` only.
"""
