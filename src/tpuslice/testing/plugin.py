"""pytest plugin (auto-loaded via the ``pytest11`` entry point): simulated TPU clusters.

Fixtures:
- ``simulated_cluster`` (session): one :class:`SimulatedCluster`, connected, shared by
  every test of the session. Its slices come from the ini option ``tpuslice_slices``
  (lines like ``v6e:4x4:2``; default one v6e 4x4 slice x2).
- ``tpu_cluster`` (function): the same cluster, and after the test two checks: no
  placement group left (:func:`assert_no_placement_groups`) and every simulated TPU free
  (:meth:`SimulatedCluster.wait_tpus_free`), so a test that leaks a reservation or leaves
  a process owning a TPU fails. Then every host is trusted again (its suspect record
  deleted), so a run that failed in one test does not steer the next test's reservations,
  and every slice must be ready again; one that Ray alone still counts in use is
  restarted, with a warning.
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
    """Declare the ``cluster`` marker (so ``--strict-markers`` accepts it).

    Args:
        config: pytest's configuration.
    """
    config.addinivalue_line(
        "markers",
        f"{CLUSTER_MARK}: needs a simulated Ray cluster (set on every test that uses "
        "simulated_cluster or tpu_cluster)",
    )


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses the simulated cluster ``cluster``: a test that needs the
    cluster cannot end up in the tier that runs without one.

    Args:
        items: The collected tests.
    """
    for item in items:
        if CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(CLUSTER_MARK)


def pytest_addoption(parser: pytest.Parser) -> None:
    """Declare the ini options ``tpuslice_slices`` and ``tpuslice_cpus_per_host``.

    Args:
        parser: pytest's option parser.
    """
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
    """The session's cluster; fails the test if it leaves a placement group behind, a
    simulated TPU owned (a process still holding its libtpu lock or devices), or a slice
    that does not come back ready. Hosts a test's runs marked suspect are trusted again
    after it.

    A slice Ray still counts in use when nothing holds it (no group alive, no TPU owner,
    no actor: :func:`~tpuslice.testing.checks.held_by_nothing`) is Ray's own accounting,
    which no wait mends: its hosts are restarted, with a :class:`RayAccountingWarning`,
    so the tests after this one start from a ready cluster rather than each failing on
    it. A slice something does hold fails the test, naming it."""
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
    if stuck:
        warnings.warn(
            RayAccountingWarning(
                "Ray still counted resources in use with no placement group, TPU owner or "
                f"actor holding them ({describe(stuck)}); its hosts were restarted"
            ),
            stacklevel=1,
        )
    failed = [s for s in waiting if s not in stuck]
    if stuck:
        failed += slices_not_ready([s.name for s in stuck])  # the restarted ones, ready again
    if failed:
        held = [actor for info in failed for actor in holders(info)]
        on_hosts = f"; actors on their hosts: {', '.join(held)}" if held else ""
        raise AssertionError(f"slices not ready after the test: {describe(failed)}{on_hosts}")


class RayAccountingWarning(UserWarning):
    """A slice stayed busy in Ray's resource count after a test with nothing holding it,
    and its hosts were restarted (see :func:`tpu_cluster`)."""
