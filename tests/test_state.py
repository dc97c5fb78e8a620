"""No module keeps mutable state of its own: what a process keeps while connected is its
connection's (``tpuslice._tpu._connection``). Every name a production module assigns at
its top level must hold a value that cannot change, or be allowed below with its reason.
Pure: the modules are imported, nothing is called."""

from __future__ import annotations

import ast
import enum
import functools
import importlib
import logging
import pathlib
import re
import types
import typing
from dataclasses import is_dataclass
from typing import Any

import ray.actor
import ray.remote_function
from rich.console import Console

from test_layers import sources

ALLOWED: dict[str, str] = {
    "tpuslice._tpu._connection._current": "the connection itself",
    "tpuslice._tpu._connection._lock": "guards the connection itself",
    "tpuslice._tpu._process.EXIT_HOOKS": "the interpreter's exit hooks are the process's",
    "tpuslice._host.heartbeats.BEATS": "a task process's heartbeats: a task's, not a driver's",
    "tpuslice._reserve.ops.RAY_OPS": "stateless: every call asks Ray",
    "tpuslice.record.metrics._REGISTRY": "Ray registers a metric by name for the whole "
    "process, so its objects are the process's (see metrics._Registry)",
    "tpuslice._tpu._ray._NODE_START": "the patch of Ray's node start is process-wide, as "
    "Ray's Node class is; this holds the calling thread's runner",
    "tpuslice._tpu._ray._NODE_START_PATCH": "guards that patch",
    "tpuslice._host.metadata._OPENER": "an opener with no cookie jar: nothing kept between "
    "requests",
}
"""Module-level names that may hold mutable objects, and why."""

PROCESS_KINDS = {Console: "a CLI's console writes to the terminal, which is the process's"}
"""Kinds of mutable objects any module may keep, and why."""

IMMUTABLE = (
    type(None),
    bool,
    int,
    float,
    str,
    bytes,
    frozenset,
    enum.Enum,
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    functools.partial,
    type(functools.lru_cache(None)(len)),  # a pure function's memo: invisible to callers
    logging.Logger,
    typing.TypeVar,
    re.Pattern,
    pathlib.PurePath,
    types.GenericAlias,
    types.UnionType,
    ray.remote_function.RemoteFunction,
    ray.actor.ActorClass,
)


def immutable(value: Any, name: str = "") -> bool:
    """Whether ``value`` cannot change (a tuple's items, recursively, included). A
    non-empty dict of immutable keys and values named as a constant (``STATE_STYLES``,
    ``_ALIASES``) is a lookup table filled at import and only read; an empty one is a
    cache."""
    if isinstance(value, tuple):
        return all(immutable(item) for item in value)
    if isinstance(value, dict) and value and name.lstrip("_").isupper():
        return all(immutable(k) and immutable(v, name) for k, v in value.items())
    if is_dataclass(value) and not isinstance(value, type):
        return bool(type(value).__dataclass_params__.frozen)  # type: ignore[attr-defined]
    typing_form = type(value).__module__ in ("typing", "collections.abc")  # Callable[...]
    return typing_form or isinstance(value, IMMUTABLE)


def top_level_names(text: str) -> list[str]:
    """The names a module assigns outside any function or class (in ``if`` and ``try``
    blocks too); dunder names (``__all__``) aside."""
    names: list[str] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets = [node.target]
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(node.orelse)
            names.extend(
                t.id for t in targets if isinstance(t, ast.Name) and not t.id.startswith("__")
            )

    visit(ast.parse(text).body)
    return names


def production_modules() -> dict[str, str]:
    """Module name -> text, for every module but the simulator's and the test helpers'
    (and a ``__main__``, which would run)."""
    return {
        name: text
        for name, (_, text) in sources().items()
        if not name.startswith(("tpuslice._sim", "tpuslice.testing"))
        and not name.endswith("__main__")
    }


def test_no_module_keeps_mutable_state_but_those_allowed() -> None:
    found = []
    seen = set()
    for name, text in production_modules().items():
        module = importlib.import_module(name)
        for attr in top_level_names(text):
            full = f"{name}.{attr}"
            seen.add(full)
            value = getattr(module, attr)
            if full in ALLOWED or isinstance(value, tuple(PROCESS_KINDS)):
                continue
            if not immutable(value, attr):
                found.append(f"{full}: {type(value).__name__}")
    assert found == [], (
        "module-level mutable state: make it a part of the connection "
        "(tpuslice._tpu._connection), or allow it in tests/test_state.py with its reason"
    )
    assert set(ALLOWED) <= seen, "an allowed name is gone: take it out of the list"


def test_the_check_finds_a_mutable_module_name() -> None:
    text = "import threading\nA = (1, 'x')\nB: set[str] = set()\nif True:\n    C = []\n"
    assert top_level_names(text) == ["A", "B", "C"]
    assert immutable((1, "x", frozenset())) and not immutable(set()) and not immutable(([],))
    assert immutable({"a": (1, 2)}, "TABLE") and not immutable({}, "_CACHE")
    assert not immutable({"a": 1}, "kept") and not immutable({"a": []}, "TABLE")
