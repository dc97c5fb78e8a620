"""JAX helpers with real JAX (on CPU): lazy import, distributed init from the slice
context, the profiler registration the Ray dashboard reads."""

from __future__ import annotations

import importlib.util
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import ray

import tpuslice
import tpuslice.jax as tjax
from clusterutil import free_port, spmd_allgather_function, wait_for
from tpuslice._host.context import HostContext
from tpuslice._sim.libtpu import HOST_ROOT_ENV
from tpuslice._sim.simulated import host_pythonpath
from tpuslice._tpu import _ray
from tpuslice.testing import SimulatedCluster

if importlib.util.find_spec("jax") is None:  # found, not imported: collection stays quick
    pytest.skip("JAX is not installed (pip install -e '.[jax]')", allow_module_level=True)


def test_import_tpuslice_does_not_import_jax() -> None:
    code = "import sys, tpuslice, tpuslice.jax; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


OPEN_AND_HOLD = """
import sys, jax, tpuslice.jax
from tpuslice._host import tpu_lock
tpuslice.jax.open_tpu()
print(tpu_lock.HOST_ROOT, len(jax.devices("tpu")), flush=True)
sys.stdin.readline()
"""
SECOND = """
import jax, tpuslice.jax
try:
    jax.devices()
except RuntimeError as exc:
    print(exc)
try:
    tpuslice.jax.open_tpu()
except tpuslice.TPUInUseError as exc:
    print(exc)
"""


def test_jax_on_a_simulated_host_takes_its_tpu_as_on_a_tpu_vm(tmp_path: Path) -> None:
    """Production code calls JAX and reads the host's TPU files; the simulated host answers
    both: JAX's first use takes its libtpu lock, and a second process is refused, by JAX
    in libtpu's words and by tpuslice naming the first."""
    for chip in range(4):
        (tmp_path / "dev").mkdir(exist_ok=True)
        (tmp_path / "dev" / f"accel{chip}").touch()
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, HOST_ROOT_ENV: str(tmp_path), "PYTHONPATH": host_pythonpath()}
    env.pop("JAX_PLATFORMS", None)
    first = subprocess.Popen(
        [sys.executable, "-c", OPEN_AND_HOLD],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert first.stdout is not None
        assert first.stdout.readline().split() == [str(tmp_path), "1"]
        second = subprocess.run(
            [sys.executable, "-c", SECOND], env=env, capture_output=True, text=True, timeout=120
        )
        jax_says, tpuslice_says = second.stdout.splitlines()[:2]
        assert jax_says.startswith("Unable to initialize backend 'tpu': ABORTED: The TPU is")
        assert f"in use by process with pid {first.pid}." in jax_says
        assert "cloud_tpu_init failed" not in second.stderr
        assert f"is in use by pid {first.pid} (" in tpuslice_says
    finally:
        first.kill()
        first.wait(timeout=30)


def test_distributed_args_come_from_the_slice_context(monkeypatch: pytest.MonkeyPatch) -> None:
    context = HostContext(
        rank=3,
        world_size=4,
        slice_index=1,
        num_slices=2,
        slice_name="v4-16-b",
        worker_id=1,
        hosts_per_slice=2,
        coordinator_address="10.0.0.7",
    )
    for name, value in context.env().items():
        monkeypatch.setenv(name, value)
    assert tjax.distributed_args(port=1234) == {
        "coordinator_address": "10.0.0.7:1234",
        "num_processes": 4,
        "process_id": 3,
    }


def test_profiler_without_jax_warns_and_returns(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "jax", None)  # makes `import jax` raise ImportError
    with caplog.at_level(logging.WARNING, logger="tpuslice.jax"):
        tpuslice.init_jax_profiler(9999)
    assert "JAX is not installed" in caplog.text


def test_profiler_port_in_use_is_logged_not_raised(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    registered: list[int] = []
    monkeypatch.setattr(tjax, "register_profiler_port", registered.append)
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with caplog.at_level(logging.ERROR, logger="tpuslice.jax"):
            tpuslice.init_jax_profiler(port)
    assert f"could not start the JAX profiler on port {port}" in caplog.text
    assert registered == []


@pytest.mark.cluster
def test_multi_host_jax_run_on_the_simulator(tpu_cluster: SimulatedCluster) -> None:
    """Every host joins one jax.distributed job from the slice context; all agree."""
    step = ray.remote(spmd_allgather_function())
    results = ray.get(
        tpuslice.run_on_slice(step, free_port(), topology="2x2x2", accelerator_version="v4"),
        timeout=180,
    )
    assert results == [(0, 2, 3.0), (1, 2, 3.0)]


def profiled_host_class() -> type:
    """Defined in a function so Ray pickles it by value (workers cannot import tests)."""

    class ProfiledHost:
        def start(self, port: int) -> tuple[str, int]:
            import os

            tpuslice.init_jax_profiler(port)
            return _ray.current_node_id(), os.getpid()

        def leave(self) -> None:
            ray.actor.exit_actor()

    return ProfiledHost


@pytest.mark.cluster
def test_profiler_key_is_registered_and_removed_at_exit(tpu_cluster: SimulatedCluster) -> None:
    namespace = _ray.dashboard_kv_namespace()
    actor = ray.remote(num_cpus=0)(profiled_host_class()).remote()
    port = free_port()
    node_id, pid = ray.get(actor.start.remote(port), timeout=120)
    key = tjax.profiler_key(node_id, pid)
    assert _ray.kv_get(key, namespace) == str(port).encode()
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(actor.leave.remote(), timeout=60)
    wait_for(lambda: _ray.kv_get(key, namespace) is None, timeout=30, what="key removed")
