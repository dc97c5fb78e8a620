"""SimulatedCluster's checks that need no cluster: slice specs as the CLI writes them, bad
slices and a driver with a host's TPU identity refused before anything starts, and slice
names that never repeat. Pure: nothing is started."""

from __future__ import annotations

from itertools import islice

import pytest

from tpuslice._sim.simulated import _suffixes
from tpuslice.testing import SimulatedCluster, SimulatorError, SliceSpec


def test_slice_spec_parses_cli_forms() -> None:
    assert SliceSpec.parse("v6e:4x4") == SliceSpec("v6e", "4x4", 1)
    assert SliceSpec.parse("v6e:2x4:1:4") == SliceSpec("v6e", "2x4", 1, 4)
    with pytest.raises(ValueError, match="GENERATION:TOPOLOGY"):
        SliceSpec.parse("v6e")
    with pytest.raises(ValueError, match="integers"):
        SliceSpec.parse("v6e:4x4:two")


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
