"""The package's shape (docs/architecture.md): its packages in layers, each importing only
its own layer and those below (`LAYERS`); no import circle among its modules; imports at
the top, inside functions and under TYPE_CHECKING all count; no relative imports (a
module is named the same way everywhere)."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ocrd"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str, package: Path = PACKAGE) -> bool:
    base = package.parent / Path(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imports_of(path: Path) -> tuple[set[str], list[str]]:
    """The ocrd modules that the module at `path` imports (`from ocrd.x import y` counts
    as ocrd.x.y where that is a module, else as ocrd.x), and its relative imports."""
    found = {name for name, _ in import_lines(path)}
    relative = [f"{path.name}:{node.lineno}" for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.ImportFrom) and node.level]
    return found, relative


def import_lines(path: Path, package: Path = PACKAGE) -> list[tuple[str, int]]:
    """Every import of an ocrd module in the file at `path`, with its line."""
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if not node.level and node.module and node.module.split(".")[0] == "ocrd":
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    found.append((full if is_module(full, package) else node.module,
                                  node.lineno))
        elif isinstance(node, ast.Import):
            found.extend((a.name, node.lineno) for a in node.names
                         if a.name.split(".")[0] == "ocrd")
    return found


# ocrd's packages, top to bottom (docs/architecture.md, "The layers"): a module imports
# from its own layer and the layers below it, never from one above. The bottom layer is
# the vocabulary every package shares (top-level modules of ocrd).
LAYERS: list[tuple[str, ...]] = [
    ("__main__",),
    ("cli",),
    ("service",),
    ("web",),
    ("pipeline",),
    ("intake",),
    ("work",),
    ("engines",),
    ("vllm_model",),
    ("layout",),
    ("outputs",),
    ("render",),
    ("config",),
    ("ocrd", "errors", "names", "safefs", "conditions", "live"),
]


def layer_of(module: str) -> int:
    """The index in LAYERS of the package (or top-level module) `module` belongs to."""
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "ocrd"
    for n, members in enumerate(LAYERS):
        if top in members:
            return n
    raise AssertionError(f"{module}: its package {top!r} is in no layer of LAYERS")


def upward_imports(package: Path = PACKAGE) -> list[str]:
    """`file:line: importer -> imported` for every import into a higher layer."""
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package.parent)
        parts = list(rel.with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for imported, line in import_lines(path, package):
            if layer_of(imported) < layer_of(name):
                found.append(f"{rel}:{line}: {name} -> {imported}")
    return found


def graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        name = module_name(path)
        found, _ = imports_of(path)
        edges[name] = {m for m in found if m != name}
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm,
    iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in edges:
                    continue
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_the_circle_finder_finds_circles() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}, "f": {"g"},
             "g": {"f", "d"}}
    assert sorted(circles(edges)) == [["a", "b", "c"], ["f", "g"]]


def test_the_graph_sees_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    """What the graph counts: the imports inside a function and under TYPE_CHECKING of
    a module that has both (pipeline/pages.py imports its Staging only for types)."""
    found, _ = imports_of(PACKAGE / "pipeline" / "pages.py")
    assert "ocrd.outputs.assets" in found  # under TYPE_CHECKING
    found, _ = imports_of(PACKAGE / "render" / "pool.py")
    assert "ocrd.render.pages" in found  # inside a function (the worker's)


def test_no_import_circle_among_ocrds_modules() -> None:
    edges = graph()
    assert len(edges) > 80, "the graph should hold every module of the package"
    assert circles(edges) == []


def test_imports_are_absolute() -> None:
    relative = [r for p in PACKAGE.rglob("*.py") for r in imports_of(p)[1]]
    assert relative == []


def test_every_package_says_what_it_holds() -> None:
    missing = [str(p.relative_to(PACKAGE.parent)) for p in PACKAGE.rglob("__init__.py")
               if not ast.get_docstring(ast.parse(p.read_text()))]
    assert missing == []


def test_every_module_is_in_a_layer() -> None:
    for path in PACKAGE.rglob("*.py"):
        layer_of(module_name(path))


def test_no_package_imports_from_a_layer_above_it() -> None:
    assert upward_imports() == []


def test_an_upward_import_is_named_with_its_file_and_line(tmp_path: Path) -> None:
    """The layer check itself: an import of the pipeline added to the ledger (a layer
    below it) is found, by file and line, in a copy of the package."""
    copy = tmp_path / "ocrd"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    outcomes = copy / "work" / "outcomes.py"
    lines = outcomes.read_text().splitlines()
    lines.append("from ocrd.pipeline.document import Converter")
    outcomes.write_text("\n".join(lines) + "\n")
    assert upward_imports(copy) == [
        f"ocrd/work/outcomes.py:{len(lines)}: ocrd.work.outcomes -> ocrd.pipeline.document"]
    # imports inside a function count too
    lazy = copy / "render" / "formats.py"
    lazy.write_text(lazy.read_text() + "\n\ndef f():\n    from ocrd.web import app\n")
    assert any(x.startswith("ocrd/render/formats.py:") and x.endswith("-> ocrd.web.app")
               for x in upward_imports(copy))
