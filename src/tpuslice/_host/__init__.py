"""What runs on, or reads, one TPU host: node detection, metadata notices, libtpu's lock,
the per-call context, heartbeats, suspect records, and the per-host agent.

May import: :mod:`tpuslice._tpu` (its facts and its seams to Ray), :mod:`tpuslice.errors`.
"""
