"""Reading the cluster: what the host agents recorded, one snapshot of every TPU host and
slice, their states, physical layouts, and the queue's published record.

It only reads: no module here writes Ray's KV store (``tests/test_layers.py`` checks that
none names its writers). The writers live with their callers: the host agent in
:mod:`tpuslice._host.agent`, holder records and the queue's notices in
:mod:`tpuslice._reserve.queue.holders`, layouts in :mod:`tpuslice._run.layout_records`.
A read does have deleted the records nobody else would remove (a dead node's ``tpu-free/``
key, a notice long past its deadline, an ended suspect record), through the functions of
:mod:`tpuslice._host` that own those keys: every reader of the cluster, the public
``read_snapshot`` included, keeps them from piling up.

May import: :mod:`tpuslice._host` and below.
"""
