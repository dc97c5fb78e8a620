"""A simulated host's TPU for JAX, found as JAX finds any PJRT plugin (the ``jax_plugins``
namespace package): ``jax.devices()`` starts it, taking the host's libtpu lock, and fails
with libtpu's words when another process holds it. Its devices are the machine's CPU."""

TPU_PRIORITY = 300
"""JAX's priority for its own ``tpu`` backend: above the CPU, so it is the default."""


def initialize() -> None:
    """Register the simulated ``tpu`` backend with JAX."""
    from jax._src import xla_bridge

    from tpuslice._sim.libtpu import start_backend

    xla_bridge.register_backend_factory(
        "tpu", start_backend, priority=TPU_PRIORITY, fail_quietly=False
    )
