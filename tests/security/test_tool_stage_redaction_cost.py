"""Redacting a tool call's arguments runs on the server's event loop, so its cost must stay linear
in the arguments (at most ``engine_limits.max_content_bytes``) whatever the model wrote: a megabyte
of one string holding a hundred thousand findings, or a hundred thousand tokens before as many
findings, is redacted in about a second, not the minutes a quadratic path would block every
tenant's requests for."""

from __future__ import annotations

import json
import re
import time

from crossaudit.kernel.limits import EngineLimits
from crossaudit.kernel.results import Span
from orchestrator.engine.tools import redact_arguments

LIMIT = EngineLimits().max_content_bytes
FOUND = "ab@cd.ef"
BUDGET_S = 10.0  # linear is about a second; the quadratic paths took 40 s to over 5 minutes


def spans_at(text: str, pattern: str) -> list[tuple[Span, str]]:
    return [(Span(start=m.start(), end=m.end(), label="EMAIL"), "[{label}]") for m in re.finditer(pattern, text)]


def timed(text: str, pattern: str = re.escape(FOUND)) -> tuple[str, float]:
    assert len(text.encode()) <= LIMIT
    spans = spans_at(text, pattern)
    assert len(spans) > 40_000
    t0 = time.process_time()
    out = redact_arguments(text, spans)
    return out, time.process_time() - t0


def test_many_findings_in_one_string_are_redacted_in_linear_time() -> None:
    n = (LIMIT - 64) // len(FOUND + " ")
    out, took = timed(json.dumps({"a": (FOUND + " ") * n}))
    assert took < BUDGET_S
    assert json.loads(out) == {"a": "[EMAIL] " * n}


def test_many_tokens_before_many_findings_are_redacted_in_linear_time() -> None:
    n = (LIMIT - 64) // (len("1,") + len(f'"{FOUND}",'))
    out, took = timed("[" + "1," * n + ",".join([f'"{FOUND}"'] * n) + "]")
    assert took < BUDGET_S
    assert json.loads(out) == [1] * n + ["[EMAIL]"] * n


def test_many_keys_redacted_alike_in_one_object_are_made_unique_in_linear_time() -> None:
    n = (LIMIT - 64) // len('"a9999999@cd.ef": 1, ')
    text = "{" + ", ".join(f'"a{i}@cd.ef": 1' for i in range(n)) + "}"
    out, took = timed(text, r"a\d+@cd\.ef")  # every key redacted to the same text
    assert took < BUDGET_S
    keys = list(json.loads(out))
    assert keys[:3] == ["[EMAIL]", "[EMAIL] (2)", "[EMAIL] (3)"] and len(set(keys)) == n
