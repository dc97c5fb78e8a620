"""The package's layering, read from its imports with ``ast``. Pure: nothing is imported.

Each subpackage's ``__init__`` says what it is and what it may import; :data:`LAYERS` is
that rule in one list. The checks, each failing with ``file:line`` and the rule broken:

- a module imports only modules of its own layer or of the layers below it;
- no import circle, counting imports inside functions (they run on first use) and under
  ``TYPE_CHECKING`` (the type checker, and ``typing.get_type_hints``, follow them);
- no production module imports :mod:`tpuslice.testing`;
- only ``_tpu/_ray.py`` imports Ray's private modules (``ray._private``, ``ray._raylet``, ...);
- no module imports an underscore name from another module (private modules are fine);
- no module of :mod:`tpuslice._view`, which only reads, names Ray's KV writers.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

LAYERS: list[set[str]] = [
    {"errors"},
    {"_tpu"},
    {"_tpu._process", "_tpu._ray", "_tpu._auth", "_tpu._connection"},
    {"_host"},
    {"_view"},
    {"record"},
    {"_reserve.queue"},
    {"_reserve"},
    {"_run"},
    {"jax"},
    {"_sim"},
    {"cli"},
    {"testing"},
    {"__init__"},
]
"""Lowest first. A layer is a subpackage of ``tpuslice`` or a top-level module, or a
module or subpackage inside one (``_tpu._ray``, ``_reserve.queue``), which then is a
layer of its own; ``__init__`` is the package itself, whose public names load lazily
from every layer."""

RAY_PRIVATE_ALLOWED = {"tpuslice._tpu._ray"}

KV_WRITERS = {"kv_put", "kv_delete", "_internal_kv_put", "_internal_kv_del"}
"""Ray's KV writers: ``_tpu/_ray.py``'s, and the private ones they wrap."""


def rank_of(module: str) -> int:
    """The layer of ``tpuslice.<part>...``: the one naming the longest leading run of its
    parts (``_tpu._ray`` for ``tpuslice._tpu._ray``, ``_tpu`` for ``tpuslice._tpu.keys``)."""
    parts = module.split(".")[1:] or ["__init__"]
    for end in range(len(parts), 0, -1):
        for rank, layer in enumerate(LAYERS):
            if ".".join(parts[:end]) in layer:
                return rank
    raise AssertionError(f"{module} is in no layer of LAYERS: add its subpackage there")


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    where: str
    in_function: bool


def sources(root: Path = SRC) -> dict[str, tuple[str, str]]:
    """Module name -> (path relative to ``root``, its text), for every module of tpuslice
    (the simulator's site directory, which simulated hosts load as plain files, aside)."""
    found: dict[str, tuple[str, str]] = {}
    for path in sorted((root / "tpuslice").rglob("*.py")):
        rel = path.relative_to(root)
        if "sim_site" in rel.parts:
            continue
        name = ".".join(rel.with_suffix("").parts)
        name = name.removesuffix(".__init__")
        found[name] = (str(rel), path.read_text())
    return found


def _imports(tree: ast.AST) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement, and whether it is inside a function."""

    def visit(
        node: ast.AST, in_function: bool
    ) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, in_function
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            yield from visit(child, inner)

    yield from visit(tree, False)


@functools.cache
def parsed(text: str, path: str) -> ast.Module:
    """A module's tree, parsed once for every check and planted test (none changes it)."""
    return ast.parse(text, filename=path)


@functools.cache
def baseline() -> frozenset[str]:
    """The violations in the package as it is (none, when its own test passes)."""
    return frozenset(check(sources()))


def read_imports(
    modules: Mapping[str, tuple[str, str]],
) -> tuple[list[Edge], list[str]]:
    """The import edges between tpuslice modules, and the violations found on the way
    (testing imports, Ray private imports, private names)."""
    edges: list[Edge] = []
    problems: list[str] = []
    for name, (path, text) in modules.items():
        tree = parsed(text, path)
        is_package = path.endswith("__init__.py")
        for node, in_function in _imports(tree):
            where = f"{path}:{node.lineno}"
            targets: list[tuple[str, str | None]] = []
            if isinstance(node, ast.Import):
                targets = [(alias.name, None) for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    package = name if is_package else name.rsplit(".", 1)[0]
                    for _ in range(node.level - 1):
                        package = package.rsplit(".", 1)[0]
                    base = f"{package}.{base}" if base else package
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    targets.append((full, None) if full in modules else (base, alias.name))
            for target, imported_name in targets:
                if target.split(".")[0] == "ray" and any(
                    part.startswith("_") for part in target.split(".")[1:]
                ):
                    if name not in RAY_PRIVATE_ALLOWED:
                        problems.append(
                            f"{where}: imports Ray's private {target}; only tpuslice._tpu._ray may"
                        )
                    continue
                if not target.startswith("tpuslice"):
                    continue
                if target not in modules:
                    target = (
                        target.rsplit(".", 1)[0] if target.rsplit(".", 1)[0] in modules else target
                    )
                if target not in modules:
                    problems.append(f"{where}: imports {target}, which is not a tpuslice module")
                    continue
                if (
                    imported_name is not None
                    and imported_name.startswith("_")
                    and not imported_name.startswith("__")
                    and target != name
                ):
                    problems.append(
                        f"{where}: imports the private name {imported_name} from {target}; "
                        "make it public in its module, or move the code that needs it there"
                    )
                if target.startswith("tpuslice.testing") and not name.startswith(
                    "tpuslice.testing"
                ):
                    problems.append(
                        f"{where}: production module {name} imports {target}; the simulator "
                        "is tpuslice._sim, and tpuslice.testing is for tests only"
                    )
                if target == name:
                    continue
                edges.append(Edge(name, target, where, in_function))
    return edges, problems


def layer_violations(edges: list[Edge]) -> list[str]:
    """Imports that go up the layers."""
    found = []
    for edge in edges:
        if edge.target == "tpuslice" and edge.source.split(".")[1:2] in (["cli"], ["testing"]):
            continue  # the command line and test helpers use the public names
        source, target = rank_of(edge.source), rank_of(edge.target)
        if target > source:
            found.append(
                f"{edge.where}: {edge.source} (layer {sorted(LAYERS[source])}) imports "
                f"{edge.target} (layer {sorted(LAYERS[target])}), a layer above it"
            )
    return found


def circles(edges: list[Edge]) -> list[str]:
    """One line per import circle found (depth-first search over the module graph)."""
    graph: dict[str, list[Edge]] = {}
    for edge in edges:
        graph.setdefault(edge.source, []).append(edge)
    found: list[str] = []
    state: dict[str, int] = {}
    stack: list[Edge] = []

    def visit(module: str) -> None:
        state[module] = 1
        for edge in graph.get(module, []):
            if state.get(edge.target) == 1:
                loop = [e for e in stack[[e.source for e in stack].index(edge.target) :]]
                loop.append(edge)
                found.append(
                    "import circle: " + " -> ".join(f"{e.source} ({e.where})" for e in loop)
                )
            elif edge.target not in state:
                stack.append(edge)
                visit(edge.target)
                stack.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    return found


def view_writes(modules: Mapping[str, tuple[str, str]]) -> list[str]:
    """Each place a module of ``tpuslice._view`` names a KV writer (a call, or a
    reference handed on as a callback)."""
    found = []
    for name, (path, text) in modules.items():
        if name != "tpuslice._view" and not name.startswith("tpuslice._view."):
            continue
        for node in ast.walk(parsed(text, path)):
            named = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
            if named in KV_WRITERS:
                found.append(
                    f"{path}:{node.lineno}: names Ray's KV writer {named}; tpuslice._view "
                    "only reads: write from the layer of the code that needs it"
                )
    return found


def simulator_names(modules: Mapping[str, tuple[str, str]]) -> list[str]:
    """Each place a module below ``tpuslice._sim`` names the simulator in its code: one of
    its settings (``TPUSLICE_SIM_*``), or its modules in code run as a string."""
    found = []
    for name, (path, text) in modules.items():
        if rank_of(name) >= rank_of("tpuslice._sim"):
            continue
        tree = parsed(text, path)
        docstrings = {
            id(node.value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if id(node) in docstrings:
                    continue
                if "TPUSLICE_SIM" in node.value or "tpuslice._sim" in node.value:
                    found.append(
                        f"{path}:{node.lineno}: production code names the simulator; it "
                        "must reach production only through what a TPU VM offers"
                    )
    return found


def check(modules: Mapping[str, tuple[str, str]]) -> list[str]:
    """Every violation in these modules."""
    edges, problems = read_imports(modules)
    return (
        problems
        + layer_violations(edges)
        + circles(edges)
        + view_writes(modules)
        + simulator_names(modules)
    )


def planted(module: str, text: str, *more: tuple[str, str]) -> list[str]:
    """The violations that planting these modules beside the real ones adds."""
    modules = sources()
    before = baseline()
    for name, source in [(module, text), *more]:
        modules[name] = (name.replace(".", "/") + ".py", source)
    return [found for found in check(modules) if found not in before]


def test_the_package_keeps_its_layers() -> None:
    assert check(sources()) == []


def test_every_subpackage_says_what_it_is_and_what_it_may_import() -> None:
    for name, (path, text) in sources().items():
        if path.endswith("__init__.py") and name != "tpuslice":
            docstring = ast.get_docstring(ast.parse(text)) or ""
            assert "May import:" in docstring or name == "tpuslice.testing", path


def test_every_subpackage_has_a_layer() -> None:
    for name in sources():
        rank_of(name)


def test_an_import_up_the_layers_fails_naming_file_line_and_rule() -> None:
    found = planted("tpuslice._tpu.planted", '"""x"""\nfrom tpuslice._run import run\n')
    assert found == [
        "tpuslice/_tpu/planted.py:2: tpuslice._tpu.planted (layer ['_tpu']) imports "
        "tpuslice._run.run (layer ['_run']), a layer above it"
    ]


def test_a_pure_tpu_module_importing_a_seam_to_ray_or_the_os_fails() -> None:
    found = planted("tpuslice._tpu.planted", "from tpuslice._tpu import _ray\n")
    assert found == [
        "tpuslice/_tpu/planted.py:1: tpuslice._tpu.planted (layer ['_tpu']) imports "
        "tpuslice._tpu._ray (layer ['_tpu._auth', '_tpu._connection', '_tpu._process', "
        "'_tpu._ray']), "
        "a layer above it"
    ]


def test_the_queue_importing_the_rest_of_reserve_fails() -> None:
    found = planted("tpuslice._reserve.queue.planted", "from tpuslice._reserve import claim\n")
    assert found == [
        "tpuslice/_reserve/queue/planted.py:1: tpuslice._reserve.queue.planted (layer "
        "['_reserve.queue']) imports tpuslice._reserve.claim (layer ['_reserve']), "
        "a layer above it"
    ]


def test_a_circle_fails_even_through_an_import_inside_a_function() -> None:
    found = planted(
        "tpuslice._reserve.planted_a",
        "def later():\n    from tpuslice._reserve import planted_b\n",
        ("tpuslice._reserve.planted_b", "from tpuslice._reserve import planted_a\n"),
    )
    assert len(found) == 1 and found[0].startswith("import circle: ")
    assert "tpuslice/_reserve/planted_a.py:2" in found[0]
    assert "tpuslice/_reserve/planted_b.py:1" in found[0]


def test_a_circle_fails_even_through_an_import_for_type_checking_only() -> None:
    found = planted(
        "tpuslice._reserve.planted_a",
        "if TYPE_CHECKING:\n    from tpuslice._reserve.planted_b import B\n",
        ("tpuslice._reserve.planted_b", "from tpuslice._reserve import planted_a\n"),
    )
    assert len(found) == 1 and "tpuslice/_reserve/planted_a.py:2" in found[0]


def test_production_code_importing_testing_fails() -> None:
    found = planted("tpuslice._run.planted", "from tpuslice.testing import checks\n")
    assert found[0].startswith("tpuslice/_run/planted.py:1: production module")
    assert len(found) == 2 and "a layer above it" in found[1]  # testing is the top layer


def test_ray_private_names_outside_ray_py_fail() -> None:
    found = planted("tpuslice._host.planted", "import ray._private.services\n")
    assert found == [
        "tpuslice/_host/planted.py:1: imports Ray's private ray._private.services; "
        "only tpuslice._tpu._ray may"
    ]


def test_a_private_name_from_another_module_fails() -> None:
    found = planted("tpuslice._run.planted", "from tpuslice._reserve.claim import _hosts\n")
    assert len(found) == 1 and "the private name _hosts from tpuslice._reserve.claim" in found[0]


def test_the_view_writing_into_rays_kv_fails() -> None:
    found = planted(
        "tpuslice._view.planted",
        "from tpuslice._tpu import _ray\n\n_ray.kv_delete('tpu-free/n1', 'tpuslice')\n",
    )
    assert found == [
        "tpuslice/_view/planted.py:3: names Ray's KV writer kv_delete; tpuslice._view only "
        "reads: write from the layer of the code that needs it"
    ]


def test_production_code_naming_the_simulator_fails() -> None:
    found = planted(
        "tpuslice._run.planted",
        'import os\n\nif os.environ.get("TPUSLICE_SIM_HOST_ROOT"):\n    pass\n',
        ("tpuslice._run.planted_b", "from tpuslice._sim import libtpu\n"),
    )
    assert found == [
        "tpuslice/_run/planted_b.py:1: tpuslice._run.planted_b (layer ['_run']) imports "
        "tpuslice._sim.libtpu (layer ['_sim']), a layer above it",
        "tpuslice/_run/planted.py:3: production code names the simulator; it must reach "
        "production only through what a TPU VM offers",
    ]
