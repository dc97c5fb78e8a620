"""What tpuslice keeps for the life of a process, with no Ray import and no tpuslice
imports: a package's public names, loaded on first use (PEP 562) so that importing the
package (and the pytest plugin under it) does not import Ray; and the exit hooks
(:data:`EXIT_HOOKS`)."""

from __future__ import annotations

import atexit
import importlib
import threading
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import Any


def load(
    package: str, exports: Mapping[str, str], name: str, namespace: MutableMapping[str, Any]
) -> Any:
    """The value of ``package.name``: an exported name from the module that defines it, or
    a submodule (``tpuslice.jax`` after a bare ``import tpuslice``); kept in ``namespace``
    so later lookups do not come here.

    Args:
        package: The package's ``__name__``.
        exports: Each public name and the module that defines it.
        name: The attribute asked for.
        namespace: The package's ``globals()``.

    Returns:
        The value.

    Raises:
        AttributeError: the package has no such name or submodule.
    """
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
    """What ``dir(package)`` shows: what is loaded and every public name.

    Args:
        namespace: The package's ``globals()`` keys.
        public: Its ``__all__``.

    Returns:
        The names, sorted.
    """
    return sorted({*namespace, *public})


class ExitHooks:
    """What tpuslice runs at interpreter exit: each hook once, the last added first.

    ``atexit`` runs hooks last registered first, and Ray registers ``ray.shutdown`` (which
    disconnects this process, and stops the cluster if ``ray.init`` started one here) when
    ``ray`` is imported. A hook that calls Ray is added only by a module that has imported
    Ray, so it runs while this process can still call Ray; a hook that does not (the
    simulated libtpu's) costs its process no Ray import. ``docs/internals.md`` ("At exit")
    lists the hooks.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._added: list[Callable[[], object]] = []

    def add(self, hook: Callable[[], object]) -> None:
        """Run ``hook`` at exit, once however often it is added (an equal bound method
        counts as the same hook).

        Args:
            hook: Called with no arguments; what it returns is ignored.
        """
        with self._lock:
            if hook in self._added:
                return
            self._added.append(hook)
            atexit.register(hook)


EXIT_HOOKS = ExitHooks()
"""This process's exit hooks."""
