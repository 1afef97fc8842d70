"""A tool stage's ``tool.name`` and ``tool.call_id`` are written into the decision
(``tool_name``, ``tool_call_id``), the audit receipt's ``subject`` (in the decision log's leaf)
and the console's decision page, where an auditor reads which tool was called. A model that names
its tool with a bidirectional override, a terminal escape, a line break or an invisible character
could make that record display as another tool (``send_email`` for what was not) or forge lines in
a terminal: such a name is refused, typed (``InvalidInputError``, naming the character, never
echoing the name), as a policy name is."""

from __future__ import annotations

import asyncio
import textwrap
from typing import Any

import pytest

from crossaudit.kernel.errors import InvalidInputError
from crossaudit.kernel.results import Verdict
from orchestrator.engine.engine import Engine
from orchestrator.evaluators.base import EvaluationInput, Evaluator
from orchestrator.policy import load_policy


class Passes(Evaluator):
    kind = "custom"

    async def evaluate(self, inp: EvaluationInput, *, timeout: float) -> Verdict:
        return Verdict(score=1.0)


class Factory:
    def build(self, spec: Any, policy: Any) -> Evaluator:
        return Passes(spec.name)


POLICY = load_policy(
    textwrap.dedent(
        """\
        name: tool-names
        description: every tool call judged
        version: "1.0"
        evaluators:
          - {name: a, type: custom, config: {code: "def evaluate(p, r, c): pass"}}
        rules:
          - {name: calls, evaluator: a, stage: tool_call, action: block}
          - {name: results, evaluator: a, stage: tool_result, action: block}
        """
    )
)

SPOOFS = [
    "liame_dnes\u202e",  # a right-to-left override: displays as another name
    "send_email\u2066x",  # an isolate
    "send\u200b_email",  # a zero-width space
    "send_email\x1b[2K\rread_file",  # a terminal escape rewriting the line
    "send_email\nread_file",  # a forged second line
    "send_email\x00",
    " send_email",  # looks like the name without the space
]


def evaluate(stage: str, tool: dict[str, str]) -> Any:
    return asyncio.run(Engine(Factory()).evaluate(POLICY, "", '{"a": 1}', {"tool": tool}, stage=stage))


@pytest.mark.parametrize("stage", ["tool_call", "tool_result"])
@pytest.mark.parametrize("field", ["name", "call_id"])
@pytest.mark.parametrize("spoof", SPOOFS)
def test_a_tool_name_or_call_id_that_displays_as_another_is_refused(stage: str, field: str, spoof: str) -> None:
    tool = {"name": "send_email", "call_id": "call_1", field: spoof}
    with pytest.raises(InvalidInputError, match=rf"context tool\.{field} cannot be judged") as info:
        evaluate(stage, tool)
    assert spoof not in str(info.value)


def test_names_as_models_write_them_are_judged() -> None:
    d = evaluate("tool_call", {"name": "get_weather-v2.1", "call_id": "call_9Xz-AbC_12"})
    assert d.passed
    d = evaluate("tool_result", {"name": "météo", "call_id": "toolu_01A09q90qw90lq917835lq9"})
    assert d.passed
