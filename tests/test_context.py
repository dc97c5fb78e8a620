"""The call wrapper as Ray ships it: a host's worker loads and runs it without tpuslice.

A new job's first call reaches a fresh worker process on every host at once; if the
wrapper needed ``import tpuslice`` to unpickle, each of them would pay that import on
the user's first call. These tests load the pickled wrapper in a process where
tpuslice cannot be imported at all.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from ray import cloudpickle

from tpuslice._host.context import with_context

LOADER = """
import json, os, pickle, sys
sys.modules["tpuslice"] = None  # any import of tpuslice now raises ImportError
wrapper = pickle.loads(sys.stdin.buffer.read())
os.environ["MEGASCALE_PORT"] = "1111"
os.environ["KEEP"] = "kept"
value, pid = wrapper({"TPUSLICE_RANK": "3"}, 20, bonus=1)
print(json.dumps({
    "value": value,
    "pid_is_mine": pid == os.getpid(),
    "after_rank": os.environ.get("TPUSLICE_RANK"),
    "after_port": os.environ.get("MEGASCALE_PORT"),
    "keep": os.environ.get("KEEP"),
    "tpuslice_loaded": any(m.startswith("tpuslice") and sys.modules[m] is not None
                           for m in sys.modules),
}))
"""


def run_shipped(data: bytes) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", LOADER],
        input=data,
        capture_output=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONPATH": ""},
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    result: dict[str, object] = json.loads(done.stdout.decode().splitlines()[-1])
    return result


def test_a_worker_runs_the_wrapper_without_importing_tpuslice() -> None:
    def user_function(x: int, bonus: int = 0) -> dict[str, object]:
        """Nested, so pickled by value as a user's script function is; reports what the
        call sees (its context set, a stale ``MEGASCALE_*`` hidden)."""
        return {
            "sum": x + bonus,
            "rank": os.environ.get("TPUSLICE_RANK"),
            "port": os.environ.get("MEGASCALE_PORT"),
            "keep": os.environ.get("KEEP"),
        }

    shipped = cloudpickle.dumps(with_context(user_function, returns=1))

    seen = run_shipped(shipped)

    assert seen["tpuslice_loaded"] is False
    assert seen["value"] == {"sum": 21, "rank": "3", "port": None, "keep": "kept"}
    assert seen["pid_is_mine"] is True
    # Everything is as it was after the call: the context unset, the stale port back.
    assert seen["after_rank"] is None
    assert seen["after_port"] == "1111"
    assert seen["keep"] == "kept"
