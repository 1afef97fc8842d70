"""Functions a newcomer can read: none longer than MAX_LINES without its reason written above it
(a comment starting ``# Long:`` on the lines just before the ``def`` or its decorators)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("crossaudit", "orchestrator", "sandbox", "tools")
MAX_LINES = 80
GENERATED = ("_pb2.py", "_pb2_grpc.py")


def _long_functions_without_a_reason() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name.endswith(GENERATED) or "images" in path.relative_to(ROOT).parts:
                continue
            lines = path.read_text(encoding="utf-8").splitlines()
            for node in ast.walk(ast.parse("\n".join(lines))):
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length <= MAX_LINES:
                    continue
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
                above = []
                for line in reversed(lines[:first]):
                    if not line.strip().startswith("#"):
                        break
                    above.append(line.strip())
                if not any(c.startswith("# Long:") for c in above):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_long_functions_say_why() -> None:
    assert _long_functions_without_a_reason() == []
