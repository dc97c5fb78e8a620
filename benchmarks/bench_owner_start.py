"""What one owner process costs to start, on one host with nothing else running.

Usage: ``python benchmarks/bench_owner_start.py [--rounds 5] [--json]``

A held slice's first call runs in an owner process on every host (see
``tpuslice._reserve.owners``). A driver's first reservation on a host has no spare there yet, so
the call waits for that process to start. On a TPU VM every host starts its own owner on
its own cores, in parallel, so the wait is one process start whatever the slice's size;
on this project's simulator, 16 hosts share 2 cores, so the starts queue for the CPU.
This benchmark measures the single start, on a local one-node Ray with 2 CPUs and no
simulated hosts, which is the figure a TPU VM's host would pay:

- ``python -c "import ray"``: the interpreter and Ray's imports, in a new process;
- ``import tpuslice._host.host_owner``: what an owner process imports beyond Ray's worker;
- ``owner actor start``: from creating an owner actor to its first answer (a new worker
  process, Ray's registration, the import above);
- ``task on a warm worker``: a plain task on a worker already running, the cost Ray's
  own ``run_on_slice`` pays when the host has an idle worker;
- ``call on a running owner``: an actor call on an owner already up (what a spare gives).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import ray

from tpuslice._host.host_owner import RemoteOwner


def seconds(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def in_new_python(code: str) -> float:
    """Wall seconds of ``python -c code`` in a new process (bytecode already cached)."""
    return seconds(lambda: subprocess.run([sys.executable, "-c", code], check=True))


def owner_imports() -> float:
    """Seconds ``import tpuslice._host.host_owner`` takes in a new process that has Ray."""
    code = (
        "import time, ray; started = time.perf_counter(); import tpuslice._host.host_owner; "
        "print(time.perf_counter() - started)"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return float(out.stdout.decode().split()[-1])


@ray.remote
def pid() -> int:
    return os.getpid()


def owner_start() -> float:
    def start() -> None:
        owner = RemoteOwner.remote()
        ray.get(owner.ping.remote())
        ray.kill(owner, no_restart=True)

    return seconds(start)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="samples per row (5)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        ray.get(pid.remote())  # a warm worker for the task row
        owner = RemoteOwner.remote()
        ray.get(owner.ping.remote())
        rows: dict[str, list[float]] = {
            'python -c "import ray"': [],
            "import tpuslice._host.host_owner (after ray)": [],
            "owner actor start (new process)": [],
            "task on a warm worker": [],
            "call on a running owner": [],
        }
        for _ in range(args.rounds):
            rows['python -c "import ray"'].append(in_new_python("import ray"))
            rows["import tpuslice._host.host_owner (after ray)"].append(owner_imports())
            rows["owner actor start (new process)"].append(owner_start())
            rows["task on a warm worker"].append(seconds(lambda: ray.get(pid.remote())))
            rows["call on a running owner"].append(seconds(lambda: ray.get(owner.ping.remote())))
    finally:
        ray.shutdown()
    medians = {name: statistics.median(values) * 1000 for name, values in rows.items()}
    load = os.getloadavg()[0]
    if args.json:
        print(json.dumps({"median_ms": medians, "rounds": args.rounds, "load": load}))
        return
    print(f"one local Ray node, 2 CPUs, {args.rounds} rounds; load average {load:.1f}")
    for name, value in medians.items():
        print(f"{name:42s} {value:9.1f} ms")


if __name__ == "__main__":
    main()
