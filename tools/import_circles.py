"""Import circles between two product modules: ``python -m tools.import_circles``.

Reads every ``.py`` file under crossaudit/, orchestrator/, sandbox/ and tools/ with :mod:`ast` and
counts every import of another product module, at module level or inside a function (a lazy
import still ties the two modules together). ``from package import name`` counts as importing
``package.name`` when that is a module, else ``package``. Prints one line per pair of modules
that import each other (``a <-> b``), and longer circles (strongly connected groups of more than
two) one per line; exits 1 when there is any, 0 when none.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from pathlib import Path

ROOTS = ("crossaudit", "orchestrator", "sandbox", "tools")


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def product_modules(root: Path) -> dict[str, Path]:
    """Module name -> file, for every product module below ``root``."""
    modules: dict[str, Path] = {}
    for top in ROOTS:
        for path in sorted((root / top).rglob("*.py")):
            modules[module_name(root, path)] = path
    return modules


def imported(name: str, modules: dict[str, Path], tree: ast.AST, package: str) -> Iterable[str]:
    """The product modules ``tree`` (module ``name`` of package ``package``) imports."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield from _known(alias.name, modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                yield from _known(full if full in modules else base, modules)


def _known(name: str, modules: dict[str, Path]) -> Iterable[str]:
    """``name`` or the nearest enclosing package of it that is a product module."""
    while name:
        if name in modules:
            yield name
            return
        name = name.rpartition(".")[0]


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = product_modules(root)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = {m for m in imported(name, modules, tree, package) if m != name}
    return graph


def pairs(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Modules that import each other, each pair once, sorted."""
    return sorted({tuple(sorted((a, b))) for a, deps in graph.items() for b in deps if a in graph.get(b, ())})  # type: ignore[misc]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(groups)


def main(argv: list[str] | None = None) -> int:
    root = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent
    graph = import_graph(root)
    found = pairs(graph)
    for a, b in found:
        print(f"{a} <-> {b}")
    longer = [g for g in cycles(graph) if len(g) > 2]
    for group in longer:
        print("circle: " + " -> ".join(group))
    return 1 if found or longer else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
