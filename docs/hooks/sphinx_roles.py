"""Griffe extension: the Sphinx roles of tpuslice's docstrings as cross-references.

The docstrings name other objects the Sphinx way (``:func:`current_host```,
``:class:`~tpuslice.SliceActorGroup```), which Markdown would show as literal text. Each
role becomes an optional mkdocs-autorefs reference: a link when the object is on the
site, plain code when it is not (a private module, say), so an object left out of the
reference is never a broken link. A name is resolved in the scope of the docstring's
object, as Sphinx would; ``~`` shows only its last part.

Loaded by mkdocstrings (``extensions:`` in mkdocs.yml).
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|meth|class|mod|attr|data|exc|obj|const):`(~?)([^`<>]+)`")


def resolve(obj: griffe.Object | griffe.Alias, name: str) -> str:
    """The full path of ``name`` as seen from ``obj``: a member of an enclosing class
    (inherited ones too), else a name of its scope or its parents'.

    Args:
        obj: The object whose docstring names it.
        name: A dotted name, absolute or relative.

    Returns:
        The resolved path; ``name`` itself when it cannot be resolved (or names a
        function's parameter).
    """
    head, _, rest = name.partition(".")

    def joined(path: str) -> str:
        return f"{path}.{rest}" if rest else path

    scope: griffe.Object | griffe.Alias | None = obj
    while scope is not None:
        if scope.is_class:
            try:
                member = scope.all_members.get(head)
            except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                member = None
            if isinstance(member, griffe.Alias):  # inherited: link to where it is defined
                return joined(member.final_target.path)
            if member is not None:
                return joined(member.path)
        scope = scope.parent
    try:
        found = obj.resolve(head)
    except (griffe.NameResolutionError, griffe.AliasResolutionError, KeyError):
        return name
    return name if "(" in found else joined(found)


def rewrite(obj: griffe.Object | griffe.Alias, text: str) -> str:
    """``text`` with every Sphinx role replaced by an optional cross-reference.

    Args:
        obj: The object the docstring belongs to.
        text: The docstring.

    Returns:
        The docstring for Markdown.
    """

    def replace(match: re.Match[str]) -> str:
        tilde, name = match.group(1), match.group(2).strip()
        title = name.rsplit(".", 1)[-1] if tilde else name
        identifier = html.escape(resolve(obj, name), quote=True)
        code = f"<code>{html.escape(title)}</code>"
        return f'<autoref identifier="{identifier}" optional>{code}</autoref>'

    return ROLE.sub(replace, text)


def rewrite_tree(obj: griffe.Object) -> None:
    """Rewrite the docstrings of ``obj`` and of every member it defines (not aliases).

    Args:
        obj: A module, class, function or attribute.
    """
    if obj.docstring is not None:
        obj.docstring.value = rewrite(obj, obj.docstring.value)
    for member in obj.members.values():
        if not member.is_alias:
            rewrite_tree(member)  # type: ignore[arg-type]


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx roles once the whole package is loaded (names then resolve)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        """Griffe calls this once the package is loaded (current releases).

        Args:
            pkg: The package.
            **kwargs: The loader (unused).
        """
        rewrite_tree(pkg)

    def on_package_loaded(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        """Older griffe releases call this instead (a second rewrite changes nothing).

        Args:
            pkg: The package.
            **kwargs: The loader (unused).
        """
        rewrite_tree(pkg)
