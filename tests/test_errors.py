"""The error hierarchy's helpers, and where they are used on error paths. Pure."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import ray.exceptions

import tpuslice
from tpuslice._host.context import HostContext
from tpuslice._run.shell import HostResult, _follow
from tpuslice.errors import first_line


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("boom", "boom"),
        ("\n\n  first  \nsecond", "first"),
        ("   \n \t\n", ""),
        ("", ""),
    ],
)
def test_first_line_is_the_first_non_blank_line(message: str, expected: str) -> None:
    assert first_line(ValueError(message)) == expected
    assert first_line(message) == expected


def test_first_line_is_cut_to_the_limit() -> None:
    assert first_line("x" * 500, limit=10) == "x" * 10


def test_a_host_error_with_a_blank_message_is_recorded_not_an_index_error() -> None:
    """A Ray error whose text is only whitespace ends the host's stream; the runner
    records it (it used to raise IndexError in the follower thread)."""
    context = HostContext(0, 1, 0, 1, "v6e-16-a", 0, 4, "10.0.0.7")
    results: list[HostResult | None] = [None]
    lost: list[bool] = []

    def stream() -> Iterator[object]:
        raise ray.exceptions.RayError("  \n ")
        yield  # pragma: no cover  (makes this a generator)

    _follow(0, context, stream(), lambda c, line: None, results, 0.0, lambda: lost.append(True))
    result = results[0]
    assert result is not None and result.error == "RayError: "
    assert lost == [True]


def test_current_host_outside_a_task_says_so() -> None:
    with pytest.raises(tpuslice.NotConnectedError, match="inside a task"):
        tpuslice.current_host()
