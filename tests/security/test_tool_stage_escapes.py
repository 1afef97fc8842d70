"""A tool call's arguments at ``stage: tool_call`` are judged as the tool will read them: a model
that spells a finding with JSON escapes (``\\u0040`` for ``@``, ``\\/``, a surrogate pair for an
astral character) cannot slip it past an evaluator that reads the text, and a redaction of such a
spelling leaves nothing of the finding in ``modified_response``. Arguments that a tool's parser
could read otherwise than the guard's (a number out of range, a lone surrogate) are refused as
``InvalidInputError`` before any evaluator runs, so no rule's ``fallback.on_error: allow`` can be
made to let them through by an error the model provokes."""

from __future__ import annotations

import asyncio
import json
import re
import textwrap
from typing import Any

import pytest

from crossaudit.kernel.errors import InvalidInputError
from crossaudit.kernel.results import Span, Verdict
from orchestrator.engine.engine import Engine
from orchestrator.evaluators.base import EvaluationInput, Evaluator
from orchestrator.policy import load_policy

EMAIL = re.compile(r"[\w.+-]+@[\w-]+\.[\w.]+")
SECRET = "jane.doe@example.com"


class EmailFinder(Evaluator):
    """Reads the text it is given, as the agents example's custom evaluator does."""

    kind = "custom"

    async def evaluate(self, inp: EvaluationInput, *, timeout: float) -> Verdict:
        spans = [Span(start=m.start(), end=m.end(), label="EMAIL") for m in EMAIL.finditer(inp.response)]
        return Verdict(score=0.0 if spans else 1.0, spans=spans)


class ContextReader(Evaluator):
    """Reads the context as a custom evaluator's sandbox receives it: as JSON."""

    kind = "custom"

    async def evaluate(self, inp: EvaluationInput, *, timeout: float) -> Verdict:
        json.dumps(dict(inp.context), allow_nan=False, ensure_ascii=False).encode()  # raises on what JSON cannot carry
        return Verdict(score=1.0)


class Factory:
    def build(self, spec: Any, policy: Any) -> Evaluator:
        return EmailFinder(spec.name) if spec.name == "emails" else ContextReader(spec.name)


POLICY = load_policy(
    textwrap.dedent(
        """\
        name: tool-escapes
        description: e-mail addresses in arguments redacted
        version: "1.0"
        evaluators:
          - {name: emails, type: custom, config: {code: "def evaluate(p, r, c): pass"}}
          - {name: reader, type: custom, config: {code: "def evaluate(p, r, c): pass"}}
        rules:
          - name: redact
            evaluator: emails
            stage: tool_call
            action: modify
            action_config: {replacement_text: "[{label}]"}
          - name: fail_open
            evaluator: reader
            stage: tool_call
            action: block
            fallback: {on_error: allow}
        """
    )
)


def evaluate(arguments: str) -> Any:
    engine = Engine(Factory())
    return asyncio.run(engine.evaluate(POLICY, "", arguments, {"tool": {"name": "send_email"}}, stage="tool_call"))


@pytest.mark.parametrize(
    "arguments",
    [
        '{"to": "jane.doe\\u0040example.com"}',  # the @ escaped
        '{"to": "\\u006aane.doe@example\\u002ecom"}',  # letters and the dot escaped
        '{"to": "jane.doe@example.com\\/x"}',  # an escaped solidus beside it
        '{"to": "\\u006A\\u0061\\u006E\\u0065\\u002E\\u0064\\u006F\\u0065\\u0040\\u0065xample.com"}',  # upper-case hex
        '{"\\u006aane.doe\\u0040example.com": 1}',  # in a key
        '{"to": ["\\ud83d\\ude00 jane.doe\\u0040example.com"]}',  # after a surrogate pair
    ],
)
def test_an_escaped_finding_is_found_and_redacted(arguments: str) -> None:
    d = evaluate(arguments)
    assert d.action.value == "modify", d
    out = d.modified_response
    assert out is not None
    assert SECRET not in json.dumps(json.loads(out), ensure_ascii=False)  # nothing the tool would read
    assert "[EMAIL]" in json.dumps(json.loads(out), ensure_ascii=False)


def test_escapes_that_hide_nothing_are_judged_as_the_value_they_spell() -> None:
    d = evaluate('{"to": "a\\nb", "q": "say \\"hi\\"", "e": "caf\\u00e9", "x": "jane.doe@example.com"}')
    assert json.loads(d.modified_response) == {"to": "a\nb", "q": 'say "hi"', "e": "café", "x": "[EMAIL]"}


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ('{"to": "jane.doe@example.com", "n": 1e999}', "out of range"),
        ('{"to": "jane.doe@example.com", "n": -1E400}', "out of range"),
        ('{"to": "jane.doe@example.com", "s": "\\ud800"}', "surrogate"),
        ('{"to": "jane.doe@example.com", "s": "x\\udc00y"}', "surrogate"),
        ('{"to": "jane.doe@example.com", "\\ud83d": 1}', "surrogate"),
    ],
)
def test_arguments_a_tool_could_read_otherwise_are_refused_before_any_evaluator(arguments: str, named: str) -> None:
    with pytest.raises(InvalidInputError, match=named):
        evaluate(arguments)
