"""Reading the cluster: what the host agents recorded, one snapshot of every TPU host and
slice, their states, physical layouts, and the queue's published record.

May import: :mod:`tpuslice._host` and below.
"""
