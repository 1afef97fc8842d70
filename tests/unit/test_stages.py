"""Rule stages (``stage: input | output | both | tool_call | tool_result``): the DSL field, its validation, the engine's
filtering and the JSON Schema. The data-driven semantics are in tests/cases/stages/."""

from __future__ import annotations

import json
import textwrap
from typing import Any

import pytest

from crossaudit.kernel.dsl import Stage
from crossaudit.kernel.errors import InvalidInputError, PolicyValidationError
from crossaudit.kernel.results import Status, Verdict
from orchestrator.engine.engine import Engine, applies_at
from orchestrator.evaluators.base import EvaluationInput, Evaluator
from orchestrator.policy import load_policy
from orchestrator.policy.schema import policy_json_schema_text


class Counting(Evaluator):
    kind = "custom"

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.seen: list[tuple[str, str]] = []

    async def evaluate(self, inp: EvaluationInput, *, timeout: float) -> Verdict:
        self.seen.append((inp.prompt, inp.response))
        return Verdict(score=0.0 if "bad" in inp.response else 1.0)


class Factory:
    def __init__(self) -> None:
        self.built: dict[str, Counting] = {}

    def build(self, spec: Any, policy: Any) -> Evaluator:
        return self.built.setdefault(spec.name, Counting(spec.name))


def policy(rules: str) -> Any:
    return load_policy(
        textwrap.dedent(
            """\
            name: staged
            description: rules of each stage
            version: "1.0"
            evaluators:
              - {name: a, type: custom, config: {code: "def evaluate(p, r, c): pass"}}
              - {name: b, type: custom, config: {code: "def evaluate(p, r, c): pass"}}
            rules:
            """
        )
        + textwrap.indent(textwrap.dedent(rules), "  ")
    )


TWO_STAGES = """\
- {name: in_rule, evaluator: a, stage: input, action: flag}
- {name: out_rule, evaluator: b, stage: output, action: flag}
- {name: any_rule, evaluator: a, action: flag}
"""


def test_stage_defaults_to_both_and_is_validated() -> None:
    p = policy(TWO_STAGES)
    assert [r.stage for r in p.rules] == [Stage.INPUT, Stage.OUTPUT, Stage.BOTH]
    with pytest.raises(PolicyValidationError, match=r"rules\[0\]\.stage"):
        policy("- {name: r, evaluator: a, stage: pre_flight}\n")


@pytest.mark.parametrize(
    ("stage", "ran", "skipped"),
    [
        ("input", {"in_rule", "any_rule"}, {"out_rule"}),
        ("output", {"out_rule", "any_rule"}, {"in_rule"}),
        ("", {"in_rule", "out_rule", "any_rule"}, set()),
    ],
)
async def test_engine_runs_only_the_requests_stage(stage: str, ran: set[str], skipped: set[str]) -> None:
    p = policy(TWO_STAGES)
    factory = Factory()
    d = await Engine(factory).evaluate(p, "bad prompt", "bad answer", stage=stage)
    assert {r.rule for r in d.rules if r.status is Status.FAIL} == ran
    for name in skipped:
        r = d.rule(name)
        assert r.status is Status.SKIPPED and r.passed and r.action is None and r.evaluators == []
        assert r.reason == f"not applied at the {stage} stage (stage: {p.rule(name).stage.value})"
    assert [r.rule for r in d.rules] == [r for r in ("in_rule", "out_rule", "any_rule") if r in ran] + [
        r for r in ("in_rule", "out_rule", "any_rule") if r in skipped
    ]
    if stage == "input":
        assert "b" not in factory.built  # an output rule's evaluator is never built nor called


async def test_unknown_stage_is_invalid_input_and_not_echoed_whole() -> None:
    with pytest.raises(InvalidInputError, match="unknown stage") as info:
        await Engine(Factory()).evaluate(policy(TWO_STAGES), "p", "r", stage="x" * 10_000)
    assert len(info.value.message) < 200


def test_applies_at() -> None:
    p = policy(TWO_STAGES)
    in_rule, out_rule, any_rule = p.rules
    assert applies_at(in_rule, "input") and not applies_at(in_rule, "output") and applies_at(in_rule, "")
    assert applies_at(out_rule, "output") and not applies_at(out_rule, "input")
    assert applies_at(any_rule, "input") and applies_at(any_rule, "output")


@pytest.mark.parametrize(
    ("reader", "read", "problem"),
    [
        ("input", "output", "applies only at the output stage"),
        ("both", "input", "would read nothing at the output stage"),
        ("output", "input", "applies only at the input stage"),
        ("input", "input", None),
        ("input", "both", None),
        ("both", "both", None),
        ("tool_call", "both", "would read nothing at the tool_call stage: give 'first' stage tool_call"),
        ("tool_call", "input", "applies only at the input stage"),
        ("tool_result", "tool_call", "applies only at the tool_call stage"),
        ("both", "tool_call", "would read nothing at the input stage: give this rule stage tool_call"),
        ("output", "tool_result", "give this rule stage tool_result"),
        ("tool_call", "tool_call", None),
        ("tool_result", "tool_result", None),
    ],
)
def test_a_rule_may_read_only_rules_that_run_at_its_stages(reader: str, read: str, problem: str | None) -> None:
    rules = f"""\
    - {{name: first, evaluator: a, priority: 10, stage: {read}}}
    - name: second
      evaluator: b
      stage: {reader}
      conditions: [{{field: previous_rule.first.score, operator: less_than, value: 0.5}}]
    """
    if problem is None:
        policy(rules)
        return
    with pytest.raises(PolicyValidationError) as info:
        policy(rules)
    [issue] = info.value.issues
    assert problem in issue.message and "rules[1].conditions[0].field" in str(issue)


def test_the_json_schema_lists_the_stages() -> None:
    schema = json.loads(policy_json_schema_text())
    prop = schema["$defs"]["Rule"]["properties"]["stage"]
    assert prop["default"] == "both" and "input" in prop["description"]
    assert schema["$defs"]["Stage"]["enum"] == ["input", "output", "both", "tool_call", "tool_result"]


TOOL_STAGES = """\
- {name: call_rule, evaluator: a, stage: tool_call, action: flag}
- {name: result_rule, evaluator: b, stage: tool_result, action: flag}
- {name: any_rule, evaluator: a, action: flag}
"""


def test_both_is_input_and_output_never_a_tool_stage() -> None:
    call_rule, result_rule, any_rule = policy(TOOL_STAGES).rules
    assert applies_at(call_rule, "tool_call") and not applies_at(call_rule, "input")
    assert not applies_at(call_rule, "output") and not applies_at(call_rule, "tool_result")
    assert applies_at(result_rule, "tool_result") and not applies_at(result_rule, "tool_call")
    assert not applies_at(any_rule, "tool_call") and not applies_at(any_rule, "tool_result")
    assert applies_at(call_rule, "") and applies_at(result_rule, "")  # no stage named: every rule


async def test_tool_call_context_has_the_parsed_arguments_and_the_callers_tool() -> None:
    seen: list[dict[str, Any]] = []

    class Reading(Counting):
        async def evaluate(self, inp: EvaluationInput, *, timeout: float) -> Verdict:
            seen.append(inp.context["tool"])
            return Verdict(score=1.0)

    class F(Factory):
        def build(self, spec: Any, policy: Any) -> Evaluator:
            return Reading(spec.name)

    args = '{"to": ["a@b.c"], "n": 2, "nested": {"x": null}}'
    context = {"tool": {"name": "send", "call_id": "call_1", "arguments": {"forged": True}}}
    d = await Engine(F()).evaluate(policy(TOOL_STAGES), "p", args, context, stage="tool_call")
    assert d.passed
    assert seen == [{"name": "send", "call_id": "call_1", "arguments": json.loads(args)}]  # the caller's is replaced


@pytest.mark.parametrize(
    ("args", "context", "problem"),
    [
        ("not json", {"tool": {"name": "t"}}, "not valid JSON"),
        ('{"a": NaN}', {"tool": {"name": "t"}}, "not valid JSON"),
        ('{"a": 1, "a": 2}', {"tool": {"name": "t"}}, "given twice"),
        ("[" * 33 + "]" * 33, {"tool": {"name": "t"}}, "engine_limits.max_tool_arguments_depth"),
        ("[" * 100_000 + "]" * 100_000, {"tool": {"name": "t"}}, "engine_limits.max_tool_arguments_depth"),
        ("{}", {}, "context tool.name"),
        ("{}", {"tool": {"name": 7}}, "engine_limits.max_tool_name_chars"),
        ("{}", {"tool": {"name": "t" * 257}}, "engine_limits.max_tool_name_chars"),
        ("{}", {"tool": {"name": "t", "call_id": ["x"]}}, "tool.call_id"),
        ("{}", {"tool": "send"}, "context tool must be an object"),
    ],
)
async def test_a_tool_call_the_guard_cannot_read_as_the_tool_would_is_invalid_input(
    args: str, context: dict[str, Any], problem: str
) -> None:
    with pytest.raises(InvalidInputError) as info:
        await Engine(Factory()).evaluate(policy(TOOL_STAGES), "p", args, context, stage="tool_call")
    assert problem in info.value.message and len(info.value.message) < 300


async def test_tool_result_needs_no_tool_name_and_reads_any_text() -> None:
    d = await Engine(Factory()).evaluate(policy(TOOL_STAGES), "bad", "bad output, not JSON", stage="tool_result")
    assert {r.rule for r in d.rules if r.status is Status.FAIL} == {"result_rule"}


@pytest.mark.parametrize("strategy", ["replace", "summarize"])
def test_a_tool_call_modify_may_only_redact(strategy: str) -> None:
    rules = f"""\
    - {{name: r, evaluator: a, stage: tool_call, action: modify, action_config: {{strategy: {strategy}}}}}
    """
    with pytest.raises(PolicyValidationError) as info:
        policy(rules)
    [issue] = info.value.issues
    assert "can only redact" in issue.message and "rules[0].action_config.strategy" in str(issue)
    policy(rules.replace(strategy, "redact"))
    policy(rules.replace("tool_call", "tool_result"))  # a tool result is text: every strategy
