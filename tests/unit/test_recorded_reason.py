"""An audit record keeps an evaluator's error by its class and the SHA-256 of its message, never
the message (which may quote the request), whatever kind of evaluator failed and however the
engine quoted it in the rule's reason (docs/retention.md); the caller's answer keeps it."""

from __future__ import annotations

import pytest

from crossaudit.governance import records
from crossaudit.kernel.canonical import sha256_text
from crossaudit.kernel.results import Action, Decision, EvaluatorResult, RuleResult, Status

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


def _errored_rule(errors: list[tuple[str, str]], head: str = "no verdict (fail-closed): ", **kw: object) -> RuleResult:
    """A rule with no verdict as the engine reports it: its reason quotes each message."""
    evs = [EvaluatorResult(evaluator=n, status=Status.ERROR, error=m, error_type="SandboxCodeError") for n, m in errors]
    reason = head + "; ".join(f"{n}: {m}" for n, m in errors if m)
    fields: dict[str, object] = {"passed": False, "action": Action.BLOCK, **kw}
    return RuleResult(rule="r", status=Status.ERROR, evaluators=evs, reason=reason, **fields)  # type: ignore[arg-type]


def _kept(errors: list[tuple[str, str]], head: str = "no verdict (fail-closed): ") -> str:
    evs = [EvaluatorResult(evaluator=n, status=Status.ERROR, error=m, error_type="SandboxCodeError") for n, m in errors]
    return head + "; ".join(f"{e.evaluator}: {records.error_digest(e)}" for e in evs)


E_A = "evaluator raised ValueError: boom"
ADVERSARIAL = [
    # b's message quotes a prompt holding "a: <E_a>": replacing a's text rewrote b's copy
    [("a", E_A), ("b", f"evaluator raised ValueError: invalid literal for int(): '{SECRET} a: {E_A}'")],
    # one message a substring of the other, either way round
    [("a", SECRET), ("b", f"{SECRET} and more")],
    [("a", f"{SECRET} and more"), ("b", SECRET)],
    # the same message twice
    [("a", SECRET), ("b", SECRET)],
    # an empty message beside one that quotes
    [("a", ""), ("b", f"KeyError: {SECRET!r}")],
    # messages holding evaluator names, separators and the reason's own head
    [("a", f"a: b: {SECRET}"), ("b", f"b; a: {SECRET}")],
    [("a", f"no verdict (fail-closed): a: {SECRET}"), ("b", "a")],
    [("a", "a"), ("b", f"{SECRET}; a: a")],
]


@pytest.mark.parametrize("errors", ADVERSARIAL)
def test_no_text_of_any_error_message_reaches_the_record_however_the_messages_nest(
    errors: list[tuple[str, str]],
) -> None:
    rule = _errored_rule(errors)
    kept = records.recorded_reason(rule)
    assert "alice" not in kept and "boom" not in kept and "literal" not in kept
    # the record is built from the rule's parts alone: the head, each name, class and digest
    assert kept == _kept(errors)


@pytest.mark.parametrize(
    ("head", "passed", "action"),
    [
        ("no verdict (fail-closed): ", False, Action.BLOCK),
        ("no verdict (fallback.on_error=warn): ", False, Action.WARN),
        ("no verdict (fail-closed: modify had no verdict to redact with, escalated to block): ", False, Action.BLOCK),
        ("no verdict, allowed by fallback.on_error: ", True, None),
    ],
)
def test_the_head_of_a_no_verdict_reason_is_kept_only_as_the_engine_writes_it(
    head: str, passed: bool, action: Action | None
) -> None:
    errors = [("a", f"ValueError: {SECRET}")]
    assert records.recorded_reason(_errored_rule(errors, head, passed=passed, action=action)) == _kept(errors, head)
    # a head the engine never writes is not copied from the text
    forged = _errored_rule(errors, f"no verdict ({SECRET}): ", passed=passed, action=action)
    assert SECRET not in records.recorded_reason(forged)


def test_a_reason_with_a_verdict_that_quotes_an_error_is_not_kept() -> None:
    """Defence in depth: the engine writes no message into a reason with a verdict (only a count);
    one that holds a message anyway is recorded in the fixed form, not edited."""
    failed = EvaluatorResult(evaluator="a", status=Status.ERROR, error=f"ValueError: {SECRET}")
    ok = EvaluatorResult(evaluator="b", status=Status.PASS, score=1.0)
    rule = RuleResult(rule="r", status=Status.PASS, passed=True, evaluators=[ok, failed],
                      reason=f"weighted mean 1.0 >= 0.5; a: {failed.error}")  # fmt: skip
    kept = records.recorded_reason(rule)
    assert SECRET not in kept and "a: error ValueError (error text not kept; sha256 " in kept
    counted = RuleResult(rule="r", status=Status.PASS, passed=True, evaluators=[ok, failed],
                         reason="weighted mean 1.0 >= 0.5; 1 evaluator(s) gave no verdict")  # fmt: skip
    assert records.recorded_reason(counted) == counted.reason
