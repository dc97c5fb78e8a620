"""pytest plugin (auto-loaded via the ``pytest11`` entry point): simulated TPU clusters.

Fixtures: ``simulated_cluster`` (session), one connected :class:`SimulatedCluster` whose
slices come from the ini option ``tpuslice_slices``; ``tpu_cluster`` (function), the same
cluster, checked clean after each test.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # imported inside the fixtures: a pytest run that uses none pays nothing
    from tpuslice._sim.simulated import SimulatedCluster

__all__ = ["RayAccountingWarning", "simulated_cluster", "tpu_cluster"]


CLUSTER_MARK = "cluster"
CLUSTER_FIXTURES = frozenset({"simulated_cluster", "tpu_cluster"})


def pytest_configure(config: pytest.Config) -> None:
    """Declare the ``cluster`` marker (so ``--strict-markers`` accepts it)."""
    config.addinivalue_line(
        "markers",
        f"{CLUSTER_MARK}: needs a simulated Ray cluster (set on every test that uses "
        "simulated_cluster or tpu_cluster)",
    )


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``cluster`` every test that uses the simulated cluster, so none lands in the
    tier that runs without one."""
    for item in items:
        if CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(CLUSTER_MARK)


def pytest_addoption(parser: pytest.Parser) -> None:
    """Declare the ini options ``tpuslice_slices`` and ``tpuslice_cpus_per_host``."""
    parser.addini(
        "tpuslice_slices",
        "Slices of the session's simulated TPU cluster, one GENERATION:TOPOLOGY[:COUNT"
        "[:CHIPS_PER_VM]] per line",
        type="linelist",
        default=["v6e:4x4:2"],
    )
    parser.addini(
        "tpuslice_cpus_per_host",
        "Logical CPUs of each simulated TPU host",
        default="8",
    )


@pytest.fixture(scope="session")
def simulated_cluster(request: pytest.FixtureRequest) -> Iterator[SimulatedCluster]:
    """A connected SimulatedCluster shared by the whole test session."""
    from tpuslice._sim.simulated import SimulatedCluster

    specs = request.config.getini("tpuslice_slices")
    cpus = int(request.config.getini("tpuslice_cpus_per_host"))
    with SimulatedCluster(specs, cpus_per_host=cpus, connect=True) as sim:
        yield sim


@pytest.fixture
def tpu_cluster(simulated_cluster: SimulatedCluster) -> Iterator[SimulatedCluster]:
    """The session's cluster; fails the test if it leaves a placement group, an owned TPU
    or a held slice. After it, suspect hosts are trusted again and a slice busy only in
    Ray's count (no wait mends it) is restarted with a :class:`RayAccountingWarning`."""
    from tpuslice._host.suspects import clear_all
    from tpuslice.testing.checks import (
        assert_no_placement_groups,
        describe,
        held_by_nothing,
        holders,
        slices_not_ready,
    )

    yield simulated_cluster
    clear_all()
    assert_no_placement_groups()
    simulated_cluster.wait_tpus_free()
    waiting = slices_not_ready(simulated_cluster.slices)  # not slices a test added and removed
    stuck = [s for s in waiting if held_by_nothing(s)]
    for info in stuck:
        simulated_cluster.restart_slice(info.name)
    failed = [s for s in waiting if s not in stuck]
    if stuck:
        warnings.warn(
            RayAccountingWarning(
                "Ray still counted resources in use with no placement group, TPU owner or "
                f"actor holding them ({describe(stuck)}); its hosts were restarted"
            ),
            stacklevel=1,
        )
        failed += slices_not_ready([s.name for s in stuck])  # the restarted ones, ready again
    if failed:
        held = [actor for info in failed for actor in holders(info)]
        on_hosts = f"; actors on their hosts: {', '.join(held)}" if held else ""
        raise AssertionError(f"slices not ready after the test: {describe(failed)}{on_hosts}")


class RayAccountingWarning(UserWarning):
    """A slice stayed busy in Ray's count with nothing holding it; its hosts were restarted."""
