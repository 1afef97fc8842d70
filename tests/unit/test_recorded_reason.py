"""An audit record keeps an evaluator's error by its class and the SHA-256 of its message, never
the message (which may quote the request), whatever kind of evaluator failed and however the
engine quoted it in the rule's reason (docs/retention.md); the caller's answer keeps it."""

from __future__ import annotations

import pytest

from crossaudit.kernel.canonical import sha256_text
from crossaudit.kernel.results import Action, Decision, EvaluatorResult, RuleResult, Status
from crossaudit.service import records

SECRET = "alice-zq5521@example.com"


class _Version:
    version = 1
    digest = "0" * 64


@pytest.mark.parametrize(
    ("message", "error_type", "cls"),
    [
        (f"evaluator raised ValueError: invalid literal for int() with base 10: {SECRET!r}", "SandboxCodeError",
         "SandboxCodeError ValueError"),
        (f"KeyError: {SECRET!r}", "EvaluatorError", "EvaluatorError KeyError"),
        (f"provider answered 400: unparseable {SECRET}", "LLMProviderError", "LLMProviderError"),
        (f"{SECRET}: not a number", None, "error"),  # no class in the message: the request's words are not one
    ],
)  # fmt: skip
def test_the_record_keeps_the_class_and_digest_of_an_error_never_its_message(
    message: str, error_type: str | None, cls: str
) -> None:
    failed = EvaluatorResult(evaluator="parses", status=Status.ERROR, error=message, error_type=error_type)
    fallback = EvaluatorResult(evaluator="backup", status=Status.TIMEOUT, error=f"{SECRET} took too long")
    reason = f"no verdict (fail-closed): parses: {message}; backup: {fallback.error}"
    rule = RuleResult(rule="r", status=Status.ERROR, passed=False, action=Action.BLOCK,
                      evaluators=[failed, fallback], reason=reason)  # fmt: skip
    d = Decision(policy="p", policy_version="1", passed=False, action=Action.BLOCK, rules=[rule], decision_id="d1",
                 errored_rules=["r"])  # fmt: skip
    rec = records.audit_record("acme", d, _Version(), "production", SECRET, "", None, raw=False,  # type: ignore[arg-type]
                               request_id="q", now=1.0)  # fmt: skip
    kept = rec.rules[0]["reason"]
    assert SECRET not in kept and SECRET not in repr(rec.rules)
    assert kept.startswith("no verdict (fail-closed): parses: ")
    assert f"parses: {cls} (error text not kept; sha256 {sha256_text(message)})" in kept
    assert f"backup: error (error text not kept; sha256 {sha256_text(fallback.error or '')})" in kept
    assert rule.reason == reason  # the answer to the caller is untouched


def test_a_reason_without_error_text_is_kept_as_it_is() -> None:
    ok = EvaluatorResult(evaluator="e", status=Status.PASS, score=1.0)
    rule = RuleResult(rule="r", status=Status.PASS, passed=True, evaluators=[ok], reason="weighted mean 1.0 >= 0.5")
    assert records.recorded_reason(rule) == "weighted mean 1.0 >= 0.5"
