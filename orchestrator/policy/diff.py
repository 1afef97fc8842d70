"""What changed between two versions of a policy, in words: ``crossaudit policy diff A B``.

Policies are compared as the DSL reads them, not as text: rules and evaluators by name (so a
reordered file is not a change, a reordered rule list is reported once), each field by its value
with defaults filled in (``enabled: true`` written out is no change), nested configs key by key.
``${NAME}`` references are compared as written: a diff never expands a secret. Long values (code,
prompts) are shown by size and digest, so a diff stays a summary a reviewer reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from crossaudit.kernel.canonical import sha256_text
from crossaudit.kernel.dsl import Policy
from crossaudit.kernel.yamlsafe import shown_key

Kind = Literal["added", "removed", "changed"]
MAX_SHOWN_CHARS = 80  # a longer value is shown as its size and digest


@dataclass(frozen=True)
class PolicyChange:
    """One difference: ``area`` (policy, settings, evaluator, rule, test_case), the item's
    ``name`` ("" for the policy itself and its settings), the dotted ``field`` inside it ("" when
    the whole item was added or removed)."""

    kind: Kind
    area: str
    name: str
    field: str = ""
    before: Any = None
    after: Any = None

    @property
    def subject(self) -> str:
        return f"{self.area} {self.name!r}" if self.name else self.area

    def describe(self) -> str:
        if self.kind == "added":
            return f"{self.subject} added" + (f": {_summary(self.after)}" if self.after else "")
        if self.kind == "removed":
            return f"{self.subject} removed"
        if self.field == "order":
            return f"{self.subject}: order {', '.join(self.before)} -> {', '.join(self.after)}"
        what = f"{self.subject}: {self.field}" if self.field else self.subject
        if self.before is None:
            return f"{what} set to {show(self.after)}"
        if self.after is None:
            return f"{what} unset (was {show(self.before)})"
        return f"{what} {show(self.before)} -> {show(self.after)}{_effect(self)}"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "area": self.area,
            "name": self.name,
            "field": self.field,
            "before": self.before,
            "after": self.after,
            "text": self.describe(),
        }


def diff_policies(old: Policy, new: Policy) -> list[PolicyChange]:
    """Every difference from ``old`` to ``new``, the policy's own fields first, then its settings,
    evaluators, rules and test cases, each in ``new``'s order (removed ones after)."""
    changes: list[PolicyChange] = []
    for field in ("name", "version", "description"):
        before, after = getattr(old, field), getattr(new, field)
        if before != after:
            changes.append(PolicyChange("changed", "policy", "", field, before, after))
    changes += _fields("policy", "", "metadata", _dump(old.metadata), _dump(new.metadata))
    changes += _fields("settings", "", "", _dump(old.settings), _dump(new.settings))
    changes += _named("evaluator", old.evaluators, new.evaluators)
    changes += _named("rule", old.rules, new.rules)
    changes += _named("test_case", old.test_cases, new.test_cases)
    return changes


def _dump(model: Any) -> dict[str, Any]:
    return model.model_dump(mode="json", exclude_none=True)


def _named(area: str, old: list[Any], new: list[Any]) -> list[PolicyChange]:
    before = {item.name: _dump(item) for item in old}
    after = {item.name: _dump(item) for item in new}
    changes: list[PolicyChange] = []
    for name, doc in after.items():
        if name not in before:
            changes.append(PolicyChange("added", area, name, after=doc))
        else:
            changes += _fields(area, name, "", before[name], doc)
    changes += [PolicyChange("removed", area, name, before=doc) for name, doc in before.items() if name not in after]
    kept_old = [n for n in before if n in after]
    kept_new = [n for n in after if n in before]
    if area == "rule" and kept_old != kept_new:  # rules run and chain in their written order
        changes.append(PolicyChange("changed", "rules", "", "order", kept_old, kept_new))
    return changes


def _fields(area: str, name: str, prefix: str, old: Any, new: Any) -> list[PolicyChange]:
    """Dicts key by key (nested configs too); anything else, lists included, as a whole value."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[PolicyChange] = []
        for key in [*old, *(k for k in new if k not in old)]:
            shown = shown_key(key)  # no escape sequence reaches a terminal
            path = f"{prefix}.{shown}" if prefix else shown
            out += _fields(area, name, path, old.get(key), new.get(key))
        return out
    if old == new:
        return []
    return [PolicyChange("changed", area, name, prefix, old, new)]


def show(value: Any) -> str:
    """A value as a reviewer reads it: short JSON, or its size and digest when long."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)
    if len(text) <= MAX_SHOWN_CHARS and "\n" not in text:
        return _printable(json.dumps(value, ensure_ascii=False) if isinstance(value, str) else text)
    digest = sha256_text(text)[:12]
    lines = text.count("\n") + 1
    return f"<{len(text)} chars, {lines} line{'s' if lines != 1 else ''}, sha256 {digest}>"


def _printable(text: str) -> str:
    """JSON escapes only C0 controls: DEL, C1 controls (an 8-bit CSI or OSC), bidi overrides and
    line separators would reach a terminal raw, or make a diff read as something it is not."""
    return "".join(ch if ch.isprintable() else f"\\u{ord(ch):04x}" for ch in text)


def _summary(doc: Any) -> str:
    """An added item in a few words: its kind and what it runs (rules: evaluator, threshold, action)."""
    if not isinstance(doc, dict):
        return show(doc)
    parts = []
    for key in ("type", "evaluator", "evaluators", "threshold", "action", "expected_result"):
        if key in doc:
            value = doc[key]
            if key == "evaluators" and isinstance(value, list):
                value = [e.get("name", e) if isinstance(e, dict) else e for e in value]
            parts.append(f"{key} {show(value)}")
    return ", ".join(parts)


def _effect(change: PolicyChange) -> str:
    """What a threshold move does: a rule passes when the score is at least its threshold."""
    if change.area != "rule" or change.field != "threshold":
        return ""
    before, after = change.before, change.after
    if not isinstance(before, int | float) or not isinstance(after, int | float) or before == after:
        return ""
    return " (lower: fewer responses fail)" if after < before else " (higher: more responses fail)"
