"""No two product modules import each other, at module level or inside a function
(tools/import_circles.py); and the finder sees a circle where there is one."""

from __future__ import annotations

from pathlib import Path

from tools.import_circles import cycles, import_graph, pairs

ROOT = Path(__file__).resolve().parents[2]


def test_no_import_circles_in_product_code() -> None:
    graph = import_graph(ROOT)
    assert "crossaudit.service.server" in graph  # it read the tree
    assert pairs(graph) == []
    assert cycles(graph) == []


def test_finder_sees_function_level_and_longer_circles(tmp_path: Path) -> None:
    pkg = tmp_path / "crossaudit"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from crossaudit.b import x\n")
    (pkg / "b.py").write_text("def f():\n    from crossaudit import a\n")
    (pkg / "c.py").write_text("from . import d\n")
    (pkg / "d.py").write_text("import crossaudit.e\n")
    (pkg / "e.py").write_text("from crossaudit.c import y\n")
    graph = import_graph(tmp_path)
    assert pairs(graph) == [("crossaudit.a", "crossaudit.b")]
    assert cycles(graph) == [["crossaudit.a", "crossaudit.b"], ["crossaudit.c", "crossaudit.d", "crossaudit.e"]]
