"""Test support shipped with tpuslice: a simulated TPU cluster and pytest fixtures."""
