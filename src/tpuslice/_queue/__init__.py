"""The cluster-wide slice queue: its policy (``schedule``), its book of waiters and
grants, the service that decides on a cluster reading, the event loop that drives it, the
queue actor, and a driver's place in the queue.

May import: :mod:`tpuslice.record` and below.
"""
