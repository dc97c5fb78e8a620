"""The cluster-wide slice queue, which admits every whole-slice reservation: its policy
(``schedule``), its book of waiters and grants, the service that decides on a cluster
reading, the event loop that drives it, the queue actor, a driver's place in the queue,
the writers of the holder records and the queue's notices (``holders``), and a driver's
client to the host agents (``agents``), which the queue asks too.
Admission is the first step of reserving, and the rest of :mod:`tpuslice._reserve`
builds on it: the queue is a layer of its own, just below.

May import: :mod:`tpuslice.record` and below; never the rest of :mod:`tpuslice._reserve`.
"""
