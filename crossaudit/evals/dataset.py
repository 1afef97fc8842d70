"""Dataset rows (the shared contract of issue 24; eval-core owns this module)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Row:
    line: int  # 1-based line (JSONL) or record number (CSV, header = line 1)
    id: str  # the row's "id" field, else f"line-{line}"
    prompt: str | None  # None: text not available (a production row without retained inputs)
    response: str | None
    context: dict[str, Any]
    passed: bool | None  # expected decision-level outcome (None: not labelled)
    action: str | None  # expected decision action (allow, warn, flag, modify, custom, require_review, block)
    rules: dict[str, bool]  # expected per-rule outcome: True = the rule should pass, False = should fail
    scores: dict[str, float]  # recorded per-rule scores (production rows without text), else empty
    source: str = ""  # where the row came from ("file", "review:<id>", "feedback:<id>")
