"""Names of a package loaded on first use (PEP 562), so that importing the package (and
the pytest plugin under it) does not import Ray. No tpuslice imports here."""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping, MutableMapping
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
