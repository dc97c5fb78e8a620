"""Start-up of every Python process on a simulated TPU host (through ``PYTHONPATH``).

It lets :meth:`tpuslice.testing.SimulatedCluster.hang_host` make a worker hang the way a
host stuck in a collective does: on ``SIGUSR2`` the process's main thread (where Ray runs
the task or actor method) blocks for ever, while its other threads (Ray's core worker,
tpuslice's heartbeat publisher) go on, so Ray can still cancel or kill it. On a host cut
off from its peers (:mod:`tpuslice._sim.faults`), the TCP connections of the user's work
are dropped. tpuslice's TPU lookups (``tpuslice._host.tpu_lock.HOST_ROOT``) are pointed at
this host's directory, which holds its ``tmp/`` and ``dev/``, when that module loads.
Then it runs the
next ``sitecustomize`` on the path, if there is one (a test suite's own), as Python would
have without this one.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import signal
import sys
import threading

HANG_SIGNAL = signal.SIGUSR2


def _hang(signum: int, frame: object) -> None:
    threading.Event().wait()  # no progress, ever: only a kill ends it


if threading.current_thread() is threading.main_thread():
    signal.signal(HANG_SIGNAL, _hang)


def _network_faults() -> None:
    """A host its peers cannot reach drops the TCP traffic of the user's work
    (:mod:`tpuslice._sim.faults`); only Ray's workers for a job are affected."""
    root = os.environ.get("TPUSLICE_SIM_HOST_ROOT")
    if root and os.environ.get("RAY_JOB_ID"):
        from pathlib import Path

        from tpuslice._sim.faults import install_network_faults

        install_network_faults(Path(root))


_network_faults()

TPU_LOCK = "tpuslice._host.tpu_lock"


class _HostRootOnLoad(importlib.abc.MetaPathFinder):
    """Sets ``HOST_ROOT`` in tpuslice's TPU lookups as they load, so importing them stays
    lazy (most processes here never do)."""

    def __init__(self, root: str) -> None:
        self.root = root

    def find_spec(
        self, name: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name != TPU_LOCK:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module
        root = self.root

        def exec_module(module: object) -> None:
            run(module)  # type: ignore[arg-type]
            from pathlib import Path

            module.HOST_ROOT = Path(root)  # type: ignore[attr-defined]

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if os.environ.get("TPUSLICE_SIM_HOST_ROOT"):
    sys.meta_path.insert(0, _HostRootOnLoad(os.environ["TPUSLICE_SIM_HOST_ROOT"]))


def _run_next() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if os.path.abspath(entry or os.curdir) == here:
            continue
        candidate = os.path.join(entry or os.curdir, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_next_sitecustomize", candidate)
            if spec is not None and spec.loader is not None:
                module = importlib.util.module_from_spec(spec)
                sys.modules["_next_sitecustomize"] = module
                spec.loader.exec_module(module)
            return


_run_next()
