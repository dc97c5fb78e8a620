"""The cluster-wide slice queue, which admits every whole-slice reservation, and the clients it
shares with drivers (holder records, host agents); a layer just below :mod:`tpuslice._reserve`.

May import: :mod:`tpuslice.record` and below; never the rest of :mod:`tpuslice._reserve`."""
