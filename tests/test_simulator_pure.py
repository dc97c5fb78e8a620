"""SimulatedCluster's checks that need no cluster: slice specs as the CLI writes them, bad
slices and a driver with a host's TPU identity refused before anything starts, slice
names that never repeat, and hosts started several at once. Pure: nothing is started."""

from __future__ import annotations

import os
import threading
from itertools import islice

import pytest

from tpuslice._sim.simulated import (
    HOST_STARTS_AT_ONCE,
    SimulatedHost,
    SimulatedSlice,
    _Spawner,
    _suffixes,
)
from tpuslice._tpu.topology import slice_shape
from tpuslice.testing import SimulatedCluster, SimulatorError, SliceSpec

MAIN = threading.current_thread()


def test_slice_spec_parses_cli_forms() -> None:
    assert SliceSpec.parse("v6e:4x4") == SliceSpec("v6e", "4x4", 1)
    assert SliceSpec.parse("v6e:2x4:1:4") == SliceSpec("v6e", "2x4", 1, 4)
    with pytest.raises(ValueError, match="GENERATION:TOPOLOGY"):
        SliceSpec.parse("v6e")
    with pytest.raises(ValueError, match="integers"):
        SliceSpec.parse("v6e:4x4:two")


def test_one_spec_alone_is_one_slice_spec() -> None:
    two = [SliceSpec("v6e", "4x4", 2)]
    assert SimulatedCluster("v6e:4x4:2").specs == two
    assert SimulatedCluster(("v6e", "4x4", 2)).specs == two
    assert SimulatedCluster(SliceSpec("v6e", "4x4", 2)).specs == two
    assert SimulatedCluster(["v6e:4x4:2", ("v4", "2x2x1")]).specs == [
        *two,
        SliceSpec("v4", "2x2x1", 1),
    ]


def test_bad_slices_fail_before_anything_starts() -> None:
    with pytest.raises(ValueError, match="did you mean '4x4'"):
        SimulatedCluster([("v6e", "3x3", 1)])


def test_driver_tpu_env_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPU_NAME", "leaky")
    with pytest.raises(SimulatorError, match="TPU_NAME"):
        SimulatedCluster([("v4", "2x2x1", 1)]).start()


def test_slice_name_suffixes_never_repeat() -> None:
    names = list(islice(_suffixes(), 800))
    assert names[:3] == ["a", "b", "c"] and names[26] == "aa" and names[701] == "zz"
    assert names[702] == "aaa"
    assert len(set(names)) == 800


def _slices(count: int) -> list[SimulatedSlice]:
    """``count`` v4 2x2x2 slices (two hosts each), in memory only."""
    made = [SimulatedSlice(f"v4-x-{index}", slice_shape("2x2x2", "v4")) for index in range(count)]
    for sim_slice in made:
        sim_slice.hosts = [SimulatedHost(sim_slice.name, w) for w in range(2)]
    return made


def test_hosts_wait_at_once_but_each_spawns_on_the_starting_thread_with_its_own_env(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A host's node waits on a pool thread, but its resolve-and-spawn step runs on the
    thread that started the hosts (its processes die with the thread that spawned them),
    one at a time, with that host's identity in the environment only for that step."""
    sim = SimulatedCluster([("v4", "2x2x1", 1)])
    slices = _slices(4)
    lock, waiting, most = threading.Lock(), [0], [0]
    together = threading.Barrier(HOST_STARTS_AT_ONCE, timeout=30)  # broken if fewer wait
    spawned: list[tuple[str, str | None, bool]] = []

    def start_host(sim_slice: SimulatedSlice, worker_id: int, spawner: _Spawner) -> object:
        name = f"{sim_slice.name}/{worker_id}"
        spawner.hand(
            lambda: spawned.append(
                (name, os.environ.get("TPU_NAME"), threading.current_thread() is MAIN)
            ),
            {"TPU_NAME": name},
        )
        with lock:  # the wait for the raylet to register
            waiting[0] += 1
            most[0] = max(most[0], waiting[0])
        together.wait()
        with lock:
            waiting[0] -= 1
        return name

    monkeypatch.setattr(sim, "_start_host", start_host)
    sim._start_hosts([(s, w) for s in slices for w in range(2)])

    assert sorted(spawned) == sorted((n, n, True) for s in slices for n in _names(s))
    assert "TPU_NAME" not in os.environ
    assert [h.node for s in slices for h in s.hosts] == [n for s in slices for n in _names(s)]
    assert most[0] == HOST_STARTS_AT_ONCE


def test_a_host_that_fails_to_start_fails_the_start_after_the_others_are_recorded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sim = SimulatedCluster([("v4", "2x2x1", 1)])
    (sim_slice,) = _slices(1)

    def start_host(sim_slice: SimulatedSlice, worker_id: int, spawner: _Spawner) -> object:
        def spawn() -> None:
            if worker_id == 1:
                raise OSError("no raylet binary")

        spawner.hand(spawn, {})
        return f"node {worker_id}"

    monkeypatch.setattr(sim, "_start_host", start_host)
    with pytest.raises(OSError, match="no raylet binary"):
        sim._start_hosts([(sim_slice, 0), (sim_slice, 1)])
    assert [h.node for h in sim_slice.hosts] == ["node 0", None]


def _names(sim_slice: SimulatedSlice) -> list[str]:
    return [f"{sim_slice.name}/{h.worker_id}" for h in sim_slice.hosts]
