"""Start-up of every Python process on a simulated TPU host (through ``PYTHONPATH``).

It lets :meth:`tpuslice.testing.SimulatedCluster.hang_host` make a worker hang the way a
host stuck in a collective does: on ``SIGUSR2`` the process's main thread (where Ray runs
the task or actor method) blocks for ever, while its other threads (Ray's core worker,
tpuslice's heartbeat publisher) go on, so Ray can still cancel or kill it. Then it runs the
next ``sitecustomize`` on the path, if there is one (a test suite's own), as Python would
have without this one.
"""

from __future__ import annotations

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
