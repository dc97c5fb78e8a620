"""Process-wide helpers with no Ray or tpuslice imports: a package's public names loaded on
first use (PEP 562, so importing the package imports no Ray), and :data:`EXIT_HOOKS`."""

from __future__ import annotations

import atexit
import importlib
import threading
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import Any


def load(
    package: str, exports: Mapping[str, str], name: str, namespace: MutableMapping[str, Any]
) -> Any:
    """The value of ``package.name``, an export (kept in ``namespace``, the package's
    globals) or a submodule; ``AttributeError`` if neither."""
    module = exports.get(name)
    if module is None:
        try:
            return importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{package}.{name}":
                raise
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    namespace[name] = value
    return value


def listing(namespace: Iterable[str], public: Iterable[str]) -> list[str]:
    """What ``dir(package)`` shows: what is loaded and every public name, sorted."""
    return sorted({*namespace, *public})


class ExitHooks:
    """Hooks run once each at exit, the last added first. Ray registers ``ray.shutdown`` on
    import, so a hook that calls Ray is added after Ray is imported and runs before it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._added: list[Callable[[], object]] = []

    def add(self, hook: Callable[[], object]) -> None:
        """Run ``hook()`` at exit, once however often it is added."""
        with self._lock:
            if hook in self._added:
                return
            self._added.append(hook)
            atexit.register(hook)


EXIT_HOOKS = ExitHooks()
