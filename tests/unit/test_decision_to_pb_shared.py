"""decision_to_pb copies a result shared by several rules from its first message: the answer is
the one each result converted alone gives."""

from __future__ import annotations

from crossaudit.api import convert
from crossaudit.kernel.results import Action, Decision, EvaluatorResult, RuleResult, Span, Status


def _decision(results: list[EvaluatorResult]) -> Decision:
    rules = [
        RuleResult(rule=f"r{i}", status=Status.PASS, passed=True, score=1.0, threshold=0.5, evaluators=[e])
        for i, e in enumerate(results)
    ]
    return Decision(policy="p", policy_version="1", passed=True, action=Action.ALLOW, rules=rules, decision_id="d")


def _alone(results: list[EvaluatorResult]) -> list[object]:
    return [convert.evaluator_result_to_pb(e) for e in results]


def test_copies_of_one_result_differ_only_where_they_differ() -> None:
    e = EvaluatorResult(
        evaluator="kw",
        kind="custom",
        status=Status.PASS,
        score=1.0,
        details={"n": 80, "nested": {"a": [1, 2]}},
        spans=[Span(start=0, end=3, label="x", score=0.5)],
        violations=["v"],
        latency_ms=0.3,
        cached=True,
        provenance={"kind": "custom", "image_id": "sha256:abc"},
    )
    results = [
        e,
        e.model_copy(update={"status": Status.FAIL}),  # another rule's vote on the same call
        e.model_copy(update={"details": {"n": 81}}),
        e.model_copy(update={"provenance": {"kind": "custom"}}),
        e.model_copy(update={"violations": []}),
        e.model_copy(update={"error_type": "X"}),
        e,
    ]
    got = convert.decision_to_pb(_decision(results))
    assert [r.evaluators[0] for r in got.rules] == _alone(results)


def test_equal_but_differently_typed_details_stay_apart() -> None:
    e = EvaluatorResult(evaluator="kw", kind="custom", status=Status.PASS, score=1.0, details={"x": True})
    results = [e, e.model_copy(update={"details": {"x": 1}}), e.model_copy(update={"details": {"x": 1.0}})]
    got = convert.decision_to_pb(_decision(results))
    assert [r.evaluators[0] for r in got.rules] == _alone(results)
    assert got.rules[0].evaluators[0].details["x"] is True and got.rules[1].evaluators[0].details["x"] == 1
