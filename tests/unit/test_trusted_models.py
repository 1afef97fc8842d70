"""``trusted``: the engine's models built without validation are the validated ones."""

from __future__ import annotations

import pytest

from crossaudit.kernel.results import Decision, EvaluatorResult, RuleResult, Status, trusted


def test_trusted_equals_validated_with_fresh_defaults() -> None:
    values = {"rule": "r", "status": Status.PASS, "passed": True, "score": 0.5, "threshold": 0.5}
    a, b = trusted(RuleResult, dict(values)), trusted(RuleResult, dict(values))
    assert a == RuleResult(**values)
    assert a.model_dump_json() == RuleResult(**values).model_dump_json()  # the same keys in the same order
    a.evaluators.append(EvaluatorResult(evaluator="e", status=Status.PASS))
    assert b.evaluators == []  # a default factory's value is never shared


def test_trusted_full_copy_and_dump() -> None:
    ev = EvaluatorResult(evaluator="e", status=Status.FAIL, score=0.25, details={"k": [1]}, provenance={"kind": "x"})
    copy = trusted(EvaluatorResult, {**ev.__dict__, "cached": True})
    assert copy.model_dump() == {**ev.model_dump(), "cached": True}
    d = trusted(Decision, {"policy": "p", "policy_version": "1", "passed": True, "action": "allow", "rules": []})
    assert d.model_dump_json() == Decision(policy="p", policy_version="1", passed=True, action="allow",
                                           rules=[]).model_dump_json()  # fmt: skip


def test_trusted_refuses_missing_or_unknown_fields() -> None:
    with pytest.raises(TypeError, match="missing"):
        trusted(RuleResult, {"rule": "r", "status": Status.PASS})
    with pytest.raises(TypeError, match="unknown"):
        trusted(RuleResult, {"rule": "r", "status": Status.PASS, "passed": True, "scor": 1.0})
