"""The pytest plugin's tiers: a test that uses the simulated cluster is in the ``cluster``
tier whether or not its author marked it, so ``-m "not cluster"`` never starts one."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]


def test_a_test_using_the_cluster_fixtures_is_marked_cluster(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        def test_pure():
            pass

        def test_held(tpu_cluster):
            pass

        def test_shared(simulated_cluster):
            pass
        """
    )
    quick = pytester.runpytest("-m", "not cluster", "--collect-only", "-q")
    assert [line for line in quick.outlines if "::" in line] == [
        "test_a_test_using_the_cluster_fixtures_is_marked_cluster.py::test_pure"
    ]
    slow = pytester.runpytest("-m", "cluster", "--collect-only", "-q", "--strict-markers")
    listed = [line.split("::")[1] for line in slow.outlines if "::" in line]
    assert listed == ["test_held", "test_shared"]
