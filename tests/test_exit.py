"""Exit hooks: one way to register them, each once, all before Ray's own. Pure."""

from __future__ import annotations

import ast
import atexit
import inspect

import pytest
import ray._private.worker

from test_layers import sources
from tpuslice._tpu._process import ExitHooks


def test_each_hook_is_registered_once_in_the_order_added(monkeypatch: pytest.MonkeyPatch) -> None:
    registered: list[object] = []
    monkeypatch.setattr(atexit, "register", registered.append)
    hooks = ExitHooks()

    class Holder:
        def close(self) -> None:
            return None

    holder = Holder()
    first, second = holder.close, print
    hooks.add(first)
    hooks.add(second)
    hooks.add(holder.close)  # an equal bound method: the same hook
    assert registered == [first, second]


def test_ray_registers_its_shutdown_when_imported() -> None:
    """The order of every tpuslice exit hook rests on this: Ray's ``shutdown`` hook is
    registered by importing ``ray`` (not by ``ray.init``), so a hook added by a module
    that imported Ray runs before it."""
    tree = ast.parse(inspect.getsource(ray._private.worker))
    at_import = [
        ast.unparse(node.value)
        for node in tree.body
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
    ]
    assert any(call.startswith("atexit.register(shutdown") for call in at_import)


def test_only_the_process_module_imports_atexit() -> None:
    users = [
        f"{path}:{node.lineno}"
        for name, (path, text) in sources().items()
        for node in ast.walk(ast.parse(text))
        if name != "tpuslice._tpu._process"
        and (
            (isinstance(node, ast.Import) and any(a.name == "atexit" for a in node.names))
            or (isinstance(node, ast.ImportFrom) and node.module == "atexit")
        )
    ]
    assert users == [], "register exit hooks through tpuslice._tpu._process.EXIT_HOOKS"
