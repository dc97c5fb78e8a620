"""A JAX SPMD program launched on every host of a TPU slice with tpuslice.

Runs on a real TPU cluster (`python examples/jax_spmd.py --address auto`) or, by default,
on a simulated one, where each "host" runs JAX on CPU. Every host joins one
`jax.distributed` job (tpuslice.jax.initialize reads the coordinator, process count and
process id from the slice context), contributes its part, and all hosts agree on the sum.
"""

from __future__ import annotations

import argparse
import socket

import ray

import tpuslice
import tpuslice.jax


def spmd_step(port: int, simulated: bool) -> tuple[int, int, float]:
    """One SPMD step: every process adds its rank + 1; everybody gets the total."""
    import jax

    if simulated:  # no TPU here: JAX on CPU, with gloo for cross-process collectives
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    tpuslice.jax.initialize(port=port)
    try:
        import jax.numpy as jnp
        from jax.experimental import multihost_utils

        host = tpuslice.current_host()
        mine = jnp.array([float(host.rank + 1)])
        total = float(multihost_utils.process_allgather(mine).sum())
        return host.rank, jax.process_count(), total
    finally:
        jax.distributed.shutdown()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--address", help="Ray cluster address (default: a simulated cluster)")
    parser.add_argument("--topology", default="2x2x2")
    parser.add_argument("--accelerator", default="v4")
    args = parser.parse_args()
    step = ray.remote(spmd_step)
    if args.address:
        ray.init(address=args.address)
        refs = tpuslice.run_on_slice(
            step, 8476, False, topology=args.topology, accelerator_version=args.accelerator
        )
        print(ray.get(refs))
        return
    from tpuslice.testing import SimulatedCluster

    with SimulatedCluster([(args.accelerator, args.topology, 1)], connect=True):
        refs = tpuslice.run_on_slice(
            step, free_port(), True, topology=args.topology, accelerator_version=args.accelerator
        )
        for rank, processes, total in ray.get(refs):
            print(f"rank {rank}: {processes} JAX processes, sum over hosts = {total}")


if __name__ == "__main__":
    main()
