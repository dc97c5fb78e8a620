"""The cluster-wide slice queue, which admits every whole-slice reservation: its policy, book,
service, event loop and actor, a driver's place in it, and the clients it shares with drivers
(holder records, host agents). A layer of its own, just below the rest of :mod:`tpuslice._reserve`.

May import: :mod:`tpuslice.record` and below; never the rest of :mod:`tpuslice._reserve`.
"""
