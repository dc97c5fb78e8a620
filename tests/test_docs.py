"""The documentation site's code (docs/*.md), and the parts generated from the code.

Every fenced ``python`` block of a page is extracted. A block right after a line
``<!-- not run: <reason> -->`` is only compiled (it starts its own cluster, needs a real
TPU, or is a test of the reader's own). Every other block runs: the runnable blocks of one
page run in order, in one namespace, in this process, connected to the session's
simulated cluster by the ``tpu_cluster`` fixture; then nothing may be left behind. The
pure tests check that every block compiles, the markers, the generated tables and command
reference (docs/hooks/generated.py), and that the API reference covers ``tpuslice.__all__``.
"""

from __future__ import annotations

import builtins
import importlib.util
import re
import symtable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest

import tpuslice
from tpuslice._tpu import compat

if TYPE_CHECKING:  # the pure tests import no Ray
    from tpuslice.testing import SimulatedCluster

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
NOT_RUN = re.compile(r"^<!-- not run: (?P<reason>.*?) -->$")
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<info>.*)$")
PYTHON = "python"
PYTHON_LIKE = {"py", "python3", "pycon", "ipython", "py3"}
"""Fence languages that would hide Python from the tests: use ``python``."""
RUNNABLE_LIMIT = 15
"""Most runnable blocks over all pages (each needs the cluster; the suite must stay short)."""


@dataclass(frozen=True)
class Block:
    """One fenced ``python`` block of a page.

    Attributes:
        page: The page's file name (``index.md``).
        line: The page's line number of the block's first code line.
        code: The block's code.
        not_run: The reason it is only compiled; ``None`` if it runs.
    """

    page: str
    line: int
    code: str
    not_run: str | None

    @property
    def name(self) -> str:
        return f"docs/{self.page}"

    def compiled(self) -> Any:
        """The block compiled so that errors and tracebacks name the page's own lines."""
        return compile("\n" * (self.line - 1) + self.code, self.name, "exec")


def pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def fences(page: Path) -> list[tuple[int, str, str]]:
    """``(line number, indent, info string)`` of every opening fence of a page."""
    found = []
    inside = False
    for number, text in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
        match = FENCE.match(text)
        if match is None:
            continue
        if not inside:
            found.append((number, match["indent"], match["info"].strip()))
        inside = not inside
    return found


def blocks(page: Path) -> list[Block]:
    """The page's ``python`` blocks, in order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found = []
    for number, indent, info in fences(page):
        if indent or info != PYTHON:
            continue
        end = lines.index("```", number)  # the closing fence (0-based index)
        marker = NOT_RUN.match(lines[number - 2]) if number >= 2 else None
        reason = marker["reason"].strip() if marker else None
        found.append(Block(page.name, number + 1, "\n".join(lines[number:end]) + "\n", reason))
    return found


def all_blocks() -> list[Block]:
    return [block for page in pages() for block in blocks(page)]


def runnable(page: Path) -> list[Block]:
    return [block for block in blocks(page) if block.not_run is None]


def load_hooks(name: str = "generated") -> ModuleType:
    """A module of docs/hooks, loaded from its file as MkDocs (or griffe) loads it."""
    spec = importlib.util.spec_from_file_location(
        f"docs_hooks_{name}", DOCS / "hooks" / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- pure ---------------------------------------------------------------------------------


def test_the_pages_have_blocks_and_a_modest_number_run() -> None:
    found = all_blocks()
    run = [b for b in found if b.not_run is None]
    assert len(found) > len(run) > 5, "the extractor found too little"
    assert len(run) <= RUNNABLE_LIMIT, f"{len(run)} runnable blocks; mark some not run"


@pytest.mark.parametrize("block", all_blocks(), ids=lambda b: f"{b.page}:{b.line}")
def test_every_block_compiles(block: Block) -> None:
    block.compiled()


def test_every_not_run_marker_has_a_reason_and_comes_right_before_a_python_block() -> None:
    problems = []
    for page in pages():
        lines = page.read_text(encoding="utf-8").splitlines()
        for number, text in enumerate(lines, start=1):
            if "not run" not in text or not text.lstrip().startswith("<!--"):
                continue
            marker = NOT_RUN.match(text)
            if marker is None or not marker["reason"].strip():
                problems.append(f"{page.name}:{number}: want `<!-- not run: <reason> -->`")
            elif number >= len(lines) or lines[number] != f"```{PYTHON}":
                problems.append(f"{page.name}:{number}: not followed by a ```python fence")
    assert problems == []


def test_no_python_hides_from_the_extractor() -> None:
    """Python under another fence name, or an indented fence, would be neither run nor
    compiled."""
    problems = [
        f"{page.name}:{number}: ```{info}" + (" (indented)" if indent else "")
        for page in pages()
        for number, indent, info in fences(page)
        if info in PYTHON_LIKE or (indent and info == PYTHON)
    ]
    assert problems == []


def free_names(code: str) -> set[str]:
    """Names that ``code`` reads from its module's globals but never binds there."""
    top = symtable.symtable(code, "<page>", "exec")
    bound = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    read = {s.get_name() for s in top.get_symbols() if s.is_referenced()}
    tables = list(top.get_children())
    while tables:
        table = tables.pop()
        tables.extend(table.get_children())
        read |= {s.get_name() for s in table.get_symbols() if s.is_global() and s.is_referenced()}
    return read - bound - set(dir(builtins))


@pytest.mark.parametrize("page", [p for p in pages() if runnable(p)], ids=lambda p: p.stem)
def test_runnable_blocks_need_nothing_from_blocks_that_do_not_run(page: Path) -> None:
    """What a page's runnable blocks use, they define or import themselves (a name from a
    not-run block would be missing when the tests run them)."""
    assert free_names("".join(block.code for block in runnable(page))) == set()


def test_free_names_finds_what_is_missing() -> None:
    code = "import os\n\ndef f():\n    return os.getpid() + ray.x\n\nclass C:\n    y = sim\n"
    assert free_names(code) == {"ray", "sim"}


def test_the_extractor_reads_markers_and_lines(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n```python\nx = 1\n```\n\n<!-- not run: needs a TPU -->\n"
        "```python\ny = 2\n```\n\n```text\nnot python\n```\n",
        encoding="utf-8",
    )
    assert blocks(page) == [
        Block("page.md", 4, "x = 1\n", None),
        Block("page.md", 9, "y = 2\n", "needs a TPU"),
    ]
    with pytest.raises(ZeroDivisionError) as info:
        exec(Block("page.md", 4, "1 / 0\n", None).compiled(), {})
    tb = info.tb
    while tb.tb_next is not None:
        tb = tb.tb_next
    assert (tb.tb_frame.f_code.co_filename, tb.tb_lineno) == ("docs/page.md", 4)


def test_every_page_of_the_nav_exists_and_every_page_is_in_it() -> None:
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = re.findall(r"^  - [^:]+: (\S+\.md)$", config, re.MULTILINE)
    assert sorted(nav) == sorted(page.name for page in pages())


def test_difference_tables_are_generated_from_compat() -> None:
    hooks = load_hooks()
    page = (DOCS / "migrating.md").read_text(encoding="utf-8")
    tuples = sorted(
        name
        for name, value in vars(compat).items()
        if name.endswith("_DIFFERENCES") and isinstance(value, tuple)
    )
    assert tuples == ["QUEUE_DIFFERENCES", "SUBSLICE_DIFFERENCES"]
    for name in tuples:
        assert f"<!-- compat-differences:{name} -->" in page, f"migrating.md lacks {name}"
    built = hooks.on_page_markdown(page)
    assert "compat-differences" not in built
    for entry in (*compat.SUBSLICE_DIFFERENCES, *compat.QUEUE_DIFFERENCES):
        assert f"| {hooks.cell(entry.what)} | {hooks.cell(entry.ray)} |" in built
        assert entry.shown_by in built
    with pytest.raises(ValueError, match="not a tuple of Difference"):
        hooks.differences_table("DEFAULT_MEGASCALE_PORT")


def test_cli_reference_has_every_command_and_option() -> None:
    import click

    from tpuslice.cli.commands import main

    hooks = load_hooks()
    page = (DOCS / "cli.md").read_text(encoding="utf-8")
    assert hooks.CLI_MARKER in page
    built = hooks.on_page_markdown(page)
    assert hooks.CLI_MARKER not in built
    root = click.Context(main, info_name="tpuslice")
    for name in main.list_commands(root):
        command = main.get_command(root, name)
        assert command is not None
        assert f"### `tpuslice {name}`" in built
        for param in command.params:
            if isinstance(param, click.Option):
                assert f"`{param.opts[0]}" in built, f"tpuslice {name} {param.opts[0]}"


def test_sphinx_roles_become_optional_cross_references() -> None:
    """docs/hooks/sphinx_roles.py: roles resolve in the docstring's scope (inherited
    members and the enclosing class's members too), and none is left."""
    griffe = pytest.importorskip("griffe")  # installed with the docs extra
    roles = load_hooks("sphinx_roles")
    package = griffe.load("tpuslice", search_paths=[str(ROOT / "src")])
    spg = package["_reserve.reserve.SlicePlacementGroup"]
    sub = package["_run.subslices.SubslicePlacementGroup"]
    assert roles.resolve(spg, "shutdown") == "tpuslice._reserve.reserve.SliceHandle.shutdown"
    assert roles.resolve(sub, "shutdown") == "tpuslice._reserve.reserve.SliceHandle.shutdown"
    assert roles.resolve(spg["__init__"], "num_slices") == (
        "tpuslice._reserve.reserve.SlicePlacementGroup.num_slices"
    )
    assert roles.resolve(spg, "RankPlacement") == "tpuslice._reserve.groups.RankPlacement"
    assert roles.resolve(spg, "no_such_name") == "no_such_name"
    text = roles.rewrite(
        spg, "see :meth:`~SlicePlacementGroup.shutdown` and :mod:`tpuslice._reserve.claim`"
    )
    assert text == (
        'see <autoref identifier="tpuslice._reserve.reserve.SlicePlacementGroup.shutdown" optional>'
        "<code>shutdown</code></autoref> and "
        '<autoref identifier="tpuslice._reserve.claim" optional>'
        "<code>tpuslice._reserve.claim</code></autoref>"
    )
    roles.rewrite_tree(package)
    left = [
        path
        for path, obj in walk(package)
        if obj.docstring is not None and roles.ROLE.search(obj.docstring.value)
    ]
    assert left == []


def walk(obj: Any) -> Any:
    """``(path, object)`` for ``obj`` and every member it defines (not aliases)."""
    yield obj.path, obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from walk(member)


def test_the_api_reference_covers_every_public_name() -> None:
    """Each name of ``tpuslice.__all__`` is rendered: ``::: tpuslice.NAME``, or a member
    listed under a module's block (``tpuslice.errors``, ``tpuslice.jax``)."""
    reference = (DOCS / "reference.md").read_text(encoding="utf-8")
    rendered = set(re.findall(r"^::: tpuslice\.(\w+)$", reference, re.MULTILINE))
    members = set(re.findall(r"^        - (\w+)$", reference, re.MULTILINE))
    missing = sorted(set(tpuslice.__all__) - {"__version__"} - rendered - members)
    assert missing == []


# --- on the cluster -----------------------------------------------------------------------


@pytest.mark.cluster
@pytest.mark.parametrize("page", [p for p in pages() if runnable(p)], ids=lambda p: p.stem)
def test_page_examples_run(tpu_cluster: SimulatedCluster, page: Path) -> None:
    """The page's runnable blocks, in order, in one namespace; nothing left behind after.

    The namespace's module name is importable by no worker, so Ray ships the functions and
    classes a block defines by value, as it does a script's."""
    from clusterutil import wait_for
    from tpuslice.testing import live_placement_groups

    namespace: dict[str, Any] = {"__name__": f"tpuslice_docs_{page.stem}"}
    for block in runnable(page):
        exec(block.compiled(), namespace)
    wait_for(
        lambda: not live_placement_groups(),
        timeout=30,
        what=f"every placement group of docs/{page.name} removed",
    )
