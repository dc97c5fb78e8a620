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


def test_a_failing_pure_test_stops_the_run_before_any_cluster_test(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest('pytest_plugins = ["tiering"]')
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.cluster
        def test_own_cluster():
            pass

        def test_logic():
            assert 1 + 1 == 3

        def test_more_logic():
            pass
        """
    )
    result = pytester.runpytest("-v")
    ran = [line.split("::")[1].split()[0] for line in result.outlines if "::" in line]
    assert ran[:2] == ["test_logic", "test_more_logic"]  # the pure tier first, all of it
    assert "PASSED" not in "".join(line for line in result.outlines if "test_own_cluster" in line)
    result.stdout.fnmatch_lines(["*a test that needs no cluster failed*test_logic*"])
    assert pytester.runpytest("-q", "-k", "own_cluster").ret == 0  # no pure failure: runs


def test_an_early_process_runs_while_the_pure_tier_does_and_ends_before_the_cluster_tier(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest('pytest_plugins = ["tiering"]')
    started, ended = pytester.path / "started", pytester.path / "ended"
    pytester.makepyfile(
        f"""
        import sys, time
        from pathlib import Path
        import pytest

        STARTED, ENDED = Path({str(started)!r}), Path({str(ended)!r})
        WRITE = (
            "import time; from pathlib import Path; Path({str(started)!r}).write_text('up'); "
            "time.sleep(1); Path({str(ended)!r}).write_text('done'); print('out')"
        )

        @pytest.mark.cluster
        def test_first_cluster_test():
            assert ENDED.exists(), "a cluster test started while the early process ran"

        @pytest.mark.cluster
        @pytest.mark.early_process([sys.executable, "-c", WRITE])
        def test_early(early_process):
            assert early_process.returncode == 0
            assert early_process.stdout == "out\\n"

        def test_pure():
            deadline = time.monotonic() + 60
            while not STARTED.exists():
                assert time.monotonic() < deadline, "the early process never started"
                time.sleep(0.05)
        """
    )
    result = pytester.runpytest("-v")
    result.assert_outcomes(passed=3)
    ran = [line.split("::")[1].split()[0] for line in result.outlines if "::" in line]
    assert ran == ["test_pure", "test_first_cluster_test", "test_early"]
    started.unlink()
    alone = pytester.runpytest("-q", "-k", "test_early")  # no pure tier: the fixture starts it
    alone.assert_outcomes(passed=1, deselected=2)
