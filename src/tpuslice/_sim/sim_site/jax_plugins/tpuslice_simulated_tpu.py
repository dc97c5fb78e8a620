"""A simulated host's TPU for JAX, found as any PJRT plugin is (``jax_plugins``): it takes
the host's libtpu lock as libtpu does; its devices are the machine's CPU."""

TPU_PRIORITY = 300
"""JAX's priority for its own ``tpu`` backend: above the CPU, so it is the default."""


def initialize() -> None:
    """Register the simulated ``tpu`` backend with JAX."""
    from jax._src import xla_bridge

    from tpuslice._sim.libtpu import start_backend

    xla_bridge.register_backend_factory(
        "tpu", start_backend, priority=TPU_PRIORITY, fail_quietly=False
    )
