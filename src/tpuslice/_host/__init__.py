"""What runs on, or reads, one TPU host: node detection, the metadata server and its
notices, libtpu's lock and who owns the TPU, the per-call context (``HostContext`` and the
env), heartbeats, suspect records, and the agent that runs on each host (a driver's
client to it is :mod:`tpuslice._reserve.queue.agents`).

May import: :mod:`tpuslice._tpu` (its facts and its seams to Ray), :mod:`tpuslice.errors`.
"""
