"""Start-up of every Python process on a simulated TPU host (through ``PYTHONPATH``).

On ``SIGUSR2`` the main thread blocks for ever while Ray's threads go on, as in a stuck
collective; the user's work obeys the host's network faults; ``tpu_lock.HOST_ROOT`` points
at the host's root. Then the next ``sitecustomize`` on the path runs, as it would have.
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
    root = os.environ.get("TPUSLICE_SIM_HOST_ROOT")
    if root and os.environ.get("RAY_JOB_ID"):
        from pathlib import Path

        from tpuslice._sim.faults import install_network_faults

        install_network_faults(Path(root))


_network_faults()

TPU_LOCK = "tpuslice._host.tpu_lock"


class _HostRootOnLoad(importlib.abc.MetaPathFinder):
    """Sets ``HOST_ROOT`` in tpuslice's TPU lookups as they load, keeping the import lazy."""

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
