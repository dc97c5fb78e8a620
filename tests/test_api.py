"""The public surface of ``tpuslice``: ``__all__`` and what it offers of Ray's ``ray.util.tpu``."""

from __future__ import annotations

import inspect

import ray.util.tpu as ray_tpu

import tpuslice

# Public names of Ray 2.60's ray.util.tpu that tpuslice will offer once their issue lands.
# Remove a name from here when it is added to tpuslice.__all__ (a test checks this).
LATER_ISSUES: frozenset[str] = frozenset()

# Public names of ray.util.tpu that tpuslice does not mean to offer, with the reason.
NOT_OFFERED: dict[str, str] = {
    "SubslicePlacementGroup": "subslicing is not in tpuslice's scope yet (no issue asks for it)",
    "subslice_placement_group": "subslicing is not in tpuslice's scope yet",
    "TPU_SUBSLICE_LABEL_PREFIX": "subslicing is not in tpuslice's scope yet",
}


def ray_public_tpu_api() -> set[str]:
    """What ray.util.tpu offers: its own functions and classes, the helpers it re-exports
    from ray._private.accelerators.tpu, and its UPPER_CASE constants (not typing names,
    decorators, modules, or placement-group functions imported from elsewhere)."""
    own = {"ray.util.tpu", "ray._private.accelerators.tpu"}
    names = set()
    for name, obj in vars(ray_tpu).items():
        if name.startswith("_") or inspect.ismodule(obj):
            continue
        is_function = inspect.isfunction(obj) and obj.__module__ in own
        is_class = inspect.isclass(obj) and obj.__module__ == "ray.util.tpu"
        is_constant = name.isupper() and isinstance(obj, (str, int, float, tuple))
        if is_function or is_class or is_constant:
            names.add(name)
    return names


def isort_key(name: str) -> tuple[int, str]:
    """Ruff's RUF022 order: SCREAMING_CASE, then CamelCase, then everything else."""
    if name.isupper():
        return (0, name)
    return (1, name) if name[0].isupper() else (2, name)


def test_all_is_sorted_and_unique() -> None:
    assert len(set(tpuslice.__all__)) == len(tpuslice.__all__)
    assert list(tpuslice.__all__) == sorted(tpuslice.__all__, key=isort_key)


def test_every_name_in_all_exists() -> None:
    missing = [name for name in tpuslice.__all__ if not hasattr(tpuslice, name)]
    assert missing == []


def test_ray_public_api_is_what_we_expect_it_to_be() -> None:
    api = ray_public_tpu_api()
    assert {"get_tpu_worker_resources", "SlicePlacementGroup", "VALID_TPU_TYPES"} <= api
    assert not {"placement_group", "Optional", "PublicAPI", "logger"} & api


def test_every_public_ray_tpu_name_is_offered_or_scheduled() -> None:
    unaccounted = ray_public_tpu_api() - set(tpuslice.__all__) - LATER_ISSUES - set(NOT_OFFERED)
    assert unaccounted == set(), "offer these, or list them in LATER_ISSUES / NOT_OFFERED"


def test_later_issues_and_not_offered_name_real_ray_names() -> None:
    unknown = (LATER_ISSUES | set(NOT_OFFERED)) - ray_public_tpu_api()
    assert unknown == set()


def test_later_issues_is_not_stale() -> None:
    offered_now = LATER_ISSUES & set(tpuslice.__all__)
    assert offered_now == set(), "now offered: remove these from LATER_ISSUES"
    assert not set(NOT_OFFERED) & set(tpuslice.__all__)


def test_offered_ray_names_are_the_same_kind_of_object() -> None:
    for name in ray_public_tpu_api() & set(tpuslice.__all__):
        ours, theirs = getattr(tpuslice, name), getattr(ray_tpu, name)
        if callable(theirs):
            assert callable(ours), name
        else:
            assert ours == theirs, name


def test_version_is_a_string() -> None:
    assert isinstance(tpuslice.__version__, str)
    assert tpuslice.__version__.count(".") == 2
