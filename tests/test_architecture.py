"""The package's shape (docs/architecture.md): no import circle among ocrd's modules, of
any kind — imports at the top, inside functions and under TYPE_CHECKING all count — and
no relative imports (a module is named the same way everywhere)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ocrd"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    base = PACKAGE.parent / Path(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def imports_of(path: Path) -> tuple[set[str], list[str]]:
    """The ocrd modules that the module at `path` imports (`from ocrd.x import y` counts
    as ocrd.x.y where that is a module, else as ocrd.x), and its relative imports."""
    found: set[str] = set()
    relative: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                relative.append(f"{path.name}:{node.lineno}")
                continue
            if node.module and node.module.split(".")[0] == "ocrd":
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    found.add(full if is_module(full) else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "ocrd")
    return found, relative


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
