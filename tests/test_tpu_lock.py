"""libtpu's one-owner lock on a simulated host (tpuslice._sim.libtpu) and finding the
owner as libtpu does (tpuslice._host.tpu_lock). No Ray: real processes holding real locks
under a temporary host root."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuslice._host.tpu_lock import (
    find_owner,
    find_owners,
    lock_wanted,
    lockfile,
    tpu_devices,
)
from tpuslice._sim import libtpu
from tpuslice._sim.libtpu import HOST_ROOT_ENV

HOLDER = textwrap.dedent(
    """
    import sys
    from tpuslice._sim.libtpu import open_tpu
    try:
        print("held" if open_tpu() else "no-lock", flush=True)
    except RuntimeError as exc:
        print("refused:" + str(exc), flush=True)
        sys.exit(3)
    sys.stdin.readline()  # hold until told to go
    """
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A simulated host root with 4 chips."""
    (tmp_path / "dev").mkdir()
    (tmp_path / "tmp").mkdir()
    for chip in range(4):
        (tmp_path / "dev" / f"accel{chip}").touch()
    return tmp_path


class Holder:
    """A child process that opens the simulated TPU and holds it until :meth:`leave`."""

    def __init__(self, root: Path, **env: str) -> None:
        environ = {**os.environ, HOST_ROOT_ENV: str(root), "RAY_JOB_ID": "0a000000", **env}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER],
            env=environ,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.said = self.proc.stdout.readline().strip()

    def leave(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        return self.proc.wait(timeout=30)

    def crash(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    started: list[Holder] = []
    yield started
    for holder in started:
        if holder.proc.poll() is None:
            holder.crash()


def test_the_first_process_owns_the_tpu_and_is_found_as_libtpu_finds_it(
    root: Path, holders: list[Holder]
) -> None:
    holders.append(Holder(root))
    assert holders[0].said == "held"
    owner = find_owner(root)
    assert owner is not None
    assert owner.pid == holders[0].proc.pid
    assert owner.holds_lock
    assert owner.job_id == "0a000000"
    assert owner.uid == os.getuid()
    assert "python" in owner.command
    assert owner.describe() == f"pid {owner.pid} ({owner.command}, Ray job 0a000000)"


def test_a_second_process_is_refused_with_libtpus_message(
    root: Path, holders: list[Holder]
) -> None:
    holders.append(Holder(root))
    holders.append(Holder(root))
    first = holders[0].proc.pid
    assert holders[1].said == (
        "refused:Unable to initialize backend 'tpu': ABORTED: The TPU is already in use by "
        f"process with pid {first}. Not attempting to load libtpu.so in this process."
    )
    assert holders[1].proc.wait(timeout=30) == 3


def test_a_normal_exit_unlinks_the_lockfile_and_frees_the_tpu(
    root: Path, holders: list[Holder]
) -> None:
    holders.append(Holder(root))
    assert lockfile(root).exists()
    assert holders[0].leave() == 0
    assert not lockfile(root).exists()
    assert find_owner(root) is None
    holders.append(Holder(root))
    assert holders[1].said == "held"


def test_a_crash_leaves_the_file_but_not_the_lock(root: Path, holders: list[Holder]) -> None:
    holders.append(Holder(root))
    holders[0].crash()
    assert lockfile(root).exists()  # left behind, as libtpu's is after a crash
    assert find_owner(root) is None  # harmless: nobody holds it
    holders.append(Holder(root))
    assert holders[1].said == "held"


@pytest.mark.parametrize(
    ("env", "said", "second"),
    [
        ({"ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}, "no-lock", "no-lock"),
        ({"ALLOW_MULTIPLE_LIBTPU_LOAD": "true"}, "no-lock", "no-lock"),
        ({"ALLOW_MULTIPLE_LIBTPU_LOAD": "yes"}, "held", "refused"),  # not a bool to libtpu
        ({"TPU_LOAD_LIBRARY": "1"}, "no-lock", "no-lock"),
        ({"TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1"}, "no-lock", "no-lock"),
        ({"TPU_CHIPS_PER_PROCESS_BOUNDS": "2,2,1"}, "held", "refused"),
        ({"TPU_CHIPS_PER_HOST_BOUNDS": "1,2,1"}, "no-lock", "no-lock"),  # what Ray sets
        (
            {"TPU_CHIPS_PER_PROCESS_BOUNDS": "", "TPU_CHIPS_PER_HOST_BOUNDS": "1,1,1"},
            "no-lock",
            "no-lock",
        ),
    ],
)
def test_escape_hatches_skip_the_lock_as_libtpu_does(
    root: Path, holders: list[Holder], env: dict[str, str], said: str, second: str
) -> None:
    holders.append(Holder(root, **env))
    holders.append(Holder(root, **env))
    assert holders[0].said == said
    assert holders[1].said.split(":")[0] == second


def test_a_process_that_skipped_the_lock_is_still_found_by_its_open_devices(
    root: Path, holders: list[Holder]
) -> None:
    holders.append(Holder(root, ALLOW_MULTIPLE_LIBTPU_LOAD="1"))
    owner = find_owner(root)
    assert owner is not None and owner.pid == holders[0].proc.pid
    assert not owner.holds_lock


def test_owners_of_many_hosts_in_one_pass_agree_with_each_hosts_own_answer(
    tmp_path: Path, holders: list[Holder]
) -> None:
    """Hosts sharing a machine (the simulator's): one holds the lock, one has its devices
    open by a process that skipped the lock, one is free."""
    roots = []
    for name in ("locked", "open", "free"):
        (tmp_path / name / "dev").mkdir(parents=True)
        (tmp_path / name / "tmp").mkdir()
        for chip in range(4):
            (tmp_path / name / "dev" / f"accel{chip}").touch()
        roots.append(tmp_path / name)
    holders.append(Holder(roots[0]))
    holders.append(Holder(roots[1], ALLOW_MULTIPLE_LIBTPU_LOAD="1"))
    found = find_owners(roots)
    assert set(found) == set(roots[:2])
    assert found[roots[0]].pid == holders[0].proc.pid and found[roots[0]].holds_lock
    assert found[roots[1]].pid == holders[1].proc.pid and not found[roots[1]].holds_lock
    assert {root: find_owner(root) for root in roots[:2]} == found
    assert find_owner(roots[2]) is None


def test_tpu_load_library_0_fails_as_libtpu_does(root: Path, holders: list[Holder]) -> None:
    holders.append(Holder(root, TPU_LOAD_LIBRARY="0"))
    assert holders[0].said == (
        "refused:Unable to initialize backend 'tpu': "
        "FAILED_PRECONDITION: TPU_LOAD_LIBRARY=0, not loading libtpu"
    )
    assert find_owner(root) is None


@pytest.mark.parametrize(
    ("env", "wanted"),
    [
        ({}, True),
        ({"TPU_LOAD_LIBRARY": "true"}, True),  # only "0" and "1" mean anything
        ({"ALLOW_MULTIPLE_LIBTPU_LOAD": "false"}, True),
        ({"ALLOW_MULTIPLE_LIBTPU_LOAD": "2"}, False),
        ({"ALLOW_MULTIPLE_LIBTPU_LOAD": "True"}, True),
        ({"TPU_CHIPS_PER_PROCESS_BOUNDS": "2,4,1"}, False),  # a whole v6e-8 host, even so
        ({"TPU_CHIPS_PER_PROCESS_BOUNDS": "2,2,1 "}, False),  # a string test
    ],
)
def test_lock_wanted_is_libtpus_string_test(env: dict[str, str], wanted: bool) -> None:
    assert lock_wanted(env) is wanted


def test_a_host_without_devices_or_lockfile_has_no_owner(tmp_path: Path) -> None:
    assert tpu_devices(tmp_path) == []
    assert find_owner(tmp_path) is None


def test_vfio_groups_count_only_with_googles_vendor_id(tmp_path: Path) -> None:
    for group, vendor in (("11", "0x1ae0"), ("12", "0x15b3")):
        (tmp_path / "dev" / "vfio").mkdir(parents=True, exist_ok=True)
        (tmp_path / "dev" / "vfio" / group).touch()
        device = tmp_path / "sys" / "kernel" / "iommu_groups" / group / "devices" / "0000:00:04.0"
        device.mkdir(parents=True)
        (device / "vendor").write_text(vendor + "\n")
    assert tpu_devices(tmp_path) == [tmp_path / "dev" / "vfio" / "11"]


def test_open_tpu_refuses_a_process_that_is_not_on_a_simulated_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(HOST_ROOT_ENV, raising=False)
    with pytest.raises(RuntimeError, match="simulated hosts only"):
        libtpu.open_tpu()


def test_the_simulated_libtpu_imports_no_ray() -> None:
    """A simulated host's process that opens its TPU outside Ray (a notebook, a script)
    pays no Ray import for it, as with the real libtpu."""
    code = "import sys; from tpuslice._sim.libtpu import open_tpu; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
