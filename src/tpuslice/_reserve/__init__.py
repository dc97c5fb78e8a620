"""Reserving slices: the cluster-wide queue that admits them (``queue``, a layer of its
own below the rest), the validated request and its plan, the targets and the claiming
loop, the cluster operations it goes through, placement groups and the rank's place
in them, elastic demand, ``SlicePlacementGroup``, marking hosts suspect and
clearing them, and recording each reservation's outcome.

May import: its :mod:`tpuslice._reserve.queue`, :mod:`tpuslice.record` and below.
"""
