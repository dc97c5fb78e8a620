"""Reserving slices: the cluster-wide queue that admits them (``queue``, a layer of its
own below the rest), the request and its plan, the claiming loop, and
``SlicePlacementGroup``.

May import: its :mod:`tpuslice._reserve.queue`, :mod:`tpuslice.record` and below.
"""
