"""Running work on reserved slices: one-shots, actor groups, shell commands, resilient
runs, health checks and sub-slices. May import: :mod:`tpuslice._reserve` and below."""
