"""A tool call's arguments redacted inside their values (orchestrator/engine/tools.py): the result
is valid JSON whatever the findings cover, and nothing outside a finding changes."""

from __future__ import annotations

import json

import pytest

from crossaudit.kernel.results import Span
from orchestrator.engine.tools import nesting_depth, redact_arguments


def spans_of(text: str, *found: str, label: str = "X") -> list[tuple[Span, str]]:
    out = []
    for f in found:
        start = text.index(f)
        out.append((Span(start=start, end=start + len(f), label=label), "[{label}]"))
    return out


def test_a_value_is_redacted_and_the_rest_is_byte_for_byte_the_same() -> None:
    text = '{ "to" : "jane@example.com",\n  "cc": ["x@y.z", 3] }'
    out = redact_arguments(text, spans_of(text, "jane@example.com", "x@y.z", label="EMAIL"))
    assert out == '{ "to" : "[EMAIL]",\n  "cc": ["[EMAIL]", 3] }'


@pytest.mark.parametrize(
    ("text", "found", "expected"),
    [
        ('{"a": "x jane@e.com y"}', '"x jane@e.com y"', {"a": "[X]"}),  # the quotes: only the value goes
        ('{"a": "one", "b": "two"}', 'one", "b": "tw', {"a": "[X]", "[X]": "[X]o"}),  # across a key too
        ('{"n": 4111111111111111}', "4111111111111111", {"n": "[X]"}),  # a number: the replacement, a string
        ('{"ok": true}', "true", {"ok": "[X]"}),
        ('{"a": "caf\\u00e9 jane@e.com"}', "jane@e.com", {"a": "café [X]"}),
        ('{"a": "\\u00e9t\\u00e9"}', "u00e9t", {"a": "[X]é"}),  # inside an escape: the whole character
        ('{"a": "\\ud83d\\ude00 hi"}', "ude00", {"a": "[X] hi"}),  # half a surrogate pair: the pair
        ('{"a": "say \\"hi\\" now"}', '\\"hi\\"', {"a": "say [X] now"}),
        ('{"jane@e.com": 1, "[X]": 2}', "jane@e.com", {"[X]": 1, "[X] (2)": 2}),  # a key: redacted, keys kept unique
        ('{"k": "v"}', ": ", {"k": "v"}),  # punctuation only: nothing of a value
    ],
)
def test_redaction_keeps_valid_json(text: str, found: str, expected: object) -> None:
    out = redact_arguments(text, spans_of(text, found))
    assert json.loads(out) == expected


def test_overlapping_and_out_of_order_findings_are_one_cut() -> None:
    text = '{"a": "0123456789"}'
    spans = [(Span(start=10, end=14, label="B"), "[B]"), (Span(start=7, end=12, label="A"), "[A]")]
    assert json.loads(redact_arguments(text, spans)) == {"a": "[A]789"}


def test_nesting_depth_ignores_brackets_in_strings() -> None:
    assert nesting_depth('{"a": "[[[[{{{{", "b": [[1]]}') == 3
    assert nesting_depth('"\\"[["') == 0


def test_a_large_argument_document_is_redacted_in_linear_time() -> None:
    items = [f'"k{i}": "v{i} jane@example.com"' for i in range(20_000)]
    text = "{" + ", ".join(items) + "}"
    start = 0
    spans = []
    for _ in range(20_000):
        start = text.index("jane@example.com", start)
        spans.append((Span(start=start, end=start + 16, label="EMAIL"), "[EMAIL]"))
        start += 16
    out = json.loads(redact_arguments(text, spans))
    assert out["k19999"] == "v19999 [EMAIL]" and len(out) == 20_000
