"""Reading the cluster: what the host agents recorded, one snapshot of every TPU host and
slice, their physical layouts, and the queue's published record. It only reads Ray's KV
store (``tests/test_layers.py`` checks it names no writer), but for records nobody else
would remove, deleted through the :mod:`tpuslice._host` functions that own those keys.

May import: :mod:`tpuslice._host` and below.
"""
