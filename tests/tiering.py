"""The suite's order and its quick failure, as a pytest plugin (loaded by conftest.py):
the tests that need no cluster run first, then those that start clusters of their own,
then those on the session's shared cluster. When a test of the first tier fails, the
run stops before any cluster starts, so a whole run reports a logic error within its
first minute and still reports every failure of the cluster tier otherwise."""

from __future__ import annotations

import pytest

SESSION_CLUSTER_FIXTURES = frozenset({"simulated_cluster", "tpu_cluster"})
PURE_FAILED = pytest.StashKey[str]()


def tier(item: pytest.Item) -> int:
    """0: needs no cluster; 1: starts clusters of its own; 2: uses the session's."""
    if item.get_closest_marker("cluster") is None:
        return 0
    return 2 if SESSION_CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())) else 1


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The pure tier first, so its failures show within a minute; then the tests that
    start clusters of their own, before the session's cluster is up to share the 2 cores
    with them; then the rest, in order."""
    items.sort(key=tier)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    """Remember the first failing test of the pure tier."""
    report = yield
    if report.failed and tier(item) == 0 and PURE_FAILED not in item.session.stash:
        item.session.stash[PURE_FAILED] = item.nodeid
    return report


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Stop before the first cluster test if the pure tier failed: a logic error is
    reported at once, not after minutes of cluster tests that it may fail too."""
    failed = item.session.stash.get(PURE_FAILED, None)
    if failed is not None and tier(item) > 0:
        item.session.shouldstop = (
            f"a test that needs no cluster failed ({failed}); fix it, then run the cluster "
            "tier (python -m pytest -m cluster) or the whole suite again"
        )
        pytest.skip("the run stops: a test that needs no cluster failed")
