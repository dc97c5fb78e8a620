"""Running work on reserved slices: ``run_on_slice``, actor groups, shell commands,
resilient runs and their watchdog, health checks, recording the slice layouts a sub-slice
reservation learns, and recording each run's outcome.

May import: :mod:`tpuslice._reserve` and below.
"""
