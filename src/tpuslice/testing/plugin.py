"""pytest plugin: fixtures giving a session-scoped SimulatedCluster."""
