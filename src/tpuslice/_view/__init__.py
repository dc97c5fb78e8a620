"""Reading the cluster: what the host agents recorded, one snapshot of every TPU host and
slice, their physical layouts, and the queue's published record.

It only reads Ray's KV store (``tests/test_layers.py`` checks it names no writer); the
writers live with their callers. A read does delete records nobody else would remove (a
dead node's ``tpu-free/`` key, a long-stale notice, an ended suspect record), through the
:mod:`tpuslice._host` functions that own those keys.

May import: :mod:`tpuslice._host` and below.
"""
