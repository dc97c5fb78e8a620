"""The public surface of ``tpuslice``: ``__all__`` and what it offers of Ray's ``ray.util.tpu``."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest
import ray.util.tpu as ray_tpu

import tpuslice

# Public names of ray.util.tpu that tpuslice does not mean to offer, with the reason.
NOT_OFFERED: dict[str, str] = {}


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
    unaccounted = ray_public_tpu_api() - set(tpuslice.__all__) - set(NOT_OFFERED)
    assert unaccounted == set(), "offer these, or list them in NOT_OFFERED with the reason"


def test_names_not_offered_are_real_ray_names_we_do_not_offer() -> None:
    assert set(NOT_OFFERED) <= ray_public_tpu_api()
    assert not set(NOT_OFFERED) & set(tpuslice.__all__), "offered now: drop from NOT_OFFERED"


def test_every_name_in_all_is_loadable_and_nothing_else_is() -> None:
    assert set(tpuslice._EXPORTS) == set(tpuslice.__all__) - {"__version__"}
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = tpuslice.nope  # type: ignore[attr-defined]


RECORD_MODULES = {"events", "goodput", "metrics", "slice_seconds"}


def test_record_offers_its_modules_and_names_from_them_without_importing_ray() -> None:
    from tpuslice import record

    assert list(record.__all__) == sorted(record.__all__, key=isort_key)
    assert set(record._EXPORTS) == set(record.__all__) - RECORD_MODULES
    for name, module in record._EXPORTS.items():
        assert getattr(record, name) is getattr(importlib.import_module(module), name), name
    for name in RECORD_MODULES:
        assert getattr(record, name) is importlib.import_module(f"tpuslice.record.{name}")
    code = "import sys, tpuslice.record; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def public_modules() -> list[str]:
    """Every module of tpuslice with no part of its dotted name led by an underscore."""
    root = Path(tpuslice.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        parts = ["tpuslice", *path.relative_to(root).with_suffix("").parts]
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        if not any(part.startswith("_") for part in parts):
            found.append(".".join(parts))
    return found


@pytest.mark.parametrize("name", public_modules())
def test_every_public_module_lists_its_public_names_and_has_them(name: str) -> None:
    module = importlib.import_module(name)
    listed = vars(module).get("__all__")
    assert isinstance(listed, list), f"{name} has no __all__: list its public names"
    assert [n for n in listed if not hasattr(module, n)] == [], f"{name}.__all__"


def test_importing_tpuslice_or_its_pytest_plugin_does_not_import_ray() -> None:
    """pytest loads the plugin in every run in an environment with tpuslice installed."""
    code = "import sys, tpuslice, tpuslice.testing.plugin; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


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


# Ray classes whose constructor is not part of the drop-in surface, with the reason.
CONSTRUCTED_BY_A_FUNCTION = {
    "SubslicePlacementGroup": "made by subslice_placement_group(), in Ray as in tpuslice",
}


# Ray functions declared as ``(*args, **kwargs)`` that forward to another: compared with it.
FORWARDS_TO = {"dispatch": "run_on_slice"}


def _shared_parameters(fn: object) -> list[tuple[str, object, object]]:
    params = inspect.signature(fn).parameters.values()  # type: ignore[arg-type]
    return [(p.name, p.kind, p.default) for p in params if p.kind is not p.KEYWORD_ONLY]


def test_offered_ray_callables_take_the_same_parameters() -> None:
    """Every function and constructor offered takes Ray's parameters in Ray's order, kind
    and defaults (anything we add is keyword-only), so a call that works with Ray's works
    with ours."""
    checked = []
    for name in sorted(ray_public_tpu_api() & set(tpuslice.__all__)):
        ours = getattr(tpuslice, name)
        theirs = getattr(ray_tpu, FORWARDS_TO.get(name, name))
        if not callable(theirs) or name in CONSTRUCTED_BY_A_FUNCTION:
            continue
        if inspect.isclass(theirs):
            ours, theirs = ours.__init__, theirs.__init__
        assert _shared_parameters(ours) == _shared_parameters(theirs), name
        checked.append(name)
    assert {"subslice_placement_group", "slice_placement_group", "SlicePlacementGroup"} <= set(
        checked
    )


def test_classes_constructed_by_a_function_are_ray_classes() -> None:
    assert set(CONSTRUCTED_BY_A_FUNCTION) <= ray_public_tpu_api() & set(tpuslice.__all__)


def public_callables() -> list[tuple[str, object]]:
    """Every public function and class of ``tpuslice``, and each class's public methods
    and constructor, by name."""
    found: list[tuple[str, object]] = []
    for name in tpuslice.__all__:
        obj = getattr(tpuslice, name)
        if not callable(obj):
            continue
        found.append((name, obj))
        if inspect.isclass(obj):
            found.append((f"{name}.__init__", obj.__init__))
            found += [
                (f"{name}.{attr}", value)
                for attr, value in vars(obj).items()
                if not attr.startswith("_") and callable(value)
            ]
    return found


def test_no_public_signature_has_an_underscore_named_parameter() -> None:
    """Test seams (clocks, fakes) go through the private layer, not a public signature."""
    seen = 0
    offending = []
    for label, obj in public_callables():
        try:
            parameters = inspect.signature(obj).parameters  # type: ignore[arg-type]
        except (TypeError, ValueError):  # builtins without a signature
            continue
        seen += 1
        offending += [f"{label}({p})" for p in parameters if p.startswith("_")]
    assert seen > 50 and not offending, offending
