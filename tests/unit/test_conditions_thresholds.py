"""Conditions (all 11 operators), derived context, dynamic thresholds, consensus, actions."""

from __future__ import annotations

import datetime as dt

import pytest

from crossaudit.kernel.dsl import (
    Condition,
    ConsensusStrategy,
    DynamicThresholdConfig,
    FeedbackConfig,
    ModifyConfig,
)
from crossaudit.kernel.durations import duration_seconds
from crossaudit.kernel.errors import InvalidInputError
from crossaudit.kernel.results import EvaluatorResult, RuleResult, Span, Status
from orchestrator.engine import actions
from orchestrator.engine.conditions import check
from orchestrator.engine.consensus import Ballot, combine
from orchestrator.engine.context import build_context
from orchestrator.engine.thresholds import FeedbackStats, dynamic_threshold, feedback_adjusted, in_time_range

CTX = {
    "user": {"id": "user-123", "role": "viewer", "tags": ["a", "b"], "age": 41},
    "request": {"ip": "192.168.1.77", "ip6": "2001:db8::5", "user_agent": "Mozilla SomeBot/1.0"},
    "content": {"type": "chat_message"},
}


def cond(field: str, op: str, value: object) -> bool:
    return check(Condition(field=field, operator=op, value=value), CTX)


@pytest.mark.parametrize(
    ("field", "op", "value", "expected"),
    [
        ("user.id", "equals", "user-123", True),
        ("user.id", "equals", "user-124", False),
        ("user.age", "equals", 41.0, True),  # gRPC Structs carry numbers as floats
        ("user.role", "not_equals", "admin", True),
        ("user.role", "not_equals", "viewer", False),
        ("request.user_agent", "contains", "Bot", True),
        ("request.user_agent", "contains", "curl", False),
        ("user.tags", "contains", "a", True),
        ("request.user_agent", "not_contains", "curl", True),
        ("request.user_agent", "not_contains", "Bot", False),
        ("request.user_agent", "starts_with", "Mozilla", True),
        ("request.user_agent", "starts_with", "Bot", False),
        ("request.user_agent", "ends_with", "/1.0", True),
        ("request.user_agent", "ends_with", "Mozilla", False),
        ("user.role", "in", ["viewer", "editor"], True),
        ("user.role", "in", ["admin"], False),
        ("request.ip", "in", ["10.0.0.0/8", "192.168.1.0/24"], True),
        ("request.ip", "in", ["192.168.1.77"], True),
        ("request.ip6", "in", ["2001:db8::/32"], True),
        ("user.role", "not_in", ["admin", "moderator"], True),
        ("request.ip", "not_in", ["192.168.1.0/24"], False),
        ("request.ip", "not_in", ["10.0.0.0/8"], True),
        ("user.age", "greater_than", 40, True),
        ("user.age", "greater_than", 41, False),
        ("user.age", "less_than", 42, True),
        ("user.age", "less_than", 41, False),
        ("request.user_agent", "regex_match", r"Some[Bb]ot/\d+", True),
        ("request.user_agent", "regex_match", r"^Bot", False),
    ],
)
def test_operators(field: str, op: str, value: object, expected: bool) -> None:
    assert cond(field, op, value) is expected


@pytest.mark.parametrize(
    ("op", "expected"),
    [
        ("equals", False),
        ("not_equals", True),
        ("in", False),
        ("not_in", True),
        ("contains", False),
        ("not_contains", True),
        ("greater_than", False),
        ("regex_match", False),
    ],
)
def test_missing_field_semantics(op: str, expected: bool) -> None:
    value = [1] if op in ("in", "not_in") else (1 if op == "greater_than" else "x")
    assert cond("user.missing.deep", op, value) is expected


def test_regex_cannot_backtrack_catastrophically() -> None:
    # A backtracking engine would not answer in the universe's age (the test's timeout ends it):
    # answering at all is the outcome; how fast is the machine's business.
    ctx = {"t": "a" * 100_000 + "!"}
    assert check(Condition(field="t", operator="regex_match", value="^(a+)+$"), ctx) is False


def test_derived_context_time_content_and_overrides() -> None:
    now = dt.datetime(2024, 1, 1, 23, 30, tzinfo=dt.UTC)  # a Monday
    ctx = build_context({"user": {"role": "x"}}, "hello", timezone="Asia/Tokyo", now=now)
    assert ctx["time"]["hour"] == 8 and ctx["time"]["day_of_week"] == "tuesday"
    assert ctx["content"]["length"] == 5 and len(ctx["content"]["hash"]) == 64
    pinned = build_context({"time": {"hour": 3}, "content": {"length": 9}}, "hello", now=now)
    assert pinned["time"]["hour"] == 3 and pinned["content"]["length"] == 9
    assert pinned["time"]["day_of_week"] == "monday"


def test_dynamic_threshold_each_modifier_and_clamp() -> None:
    cfg = DynamicThresholdConfig(
        base_threshold=0.8,
        user_trust_modifier=0.1,
        content_sensitivity_modifier=-0.2,
        time_of_day_modifier={"09:00-17:00": 0.0, "17:00-09:00": -0.1},
    )
    at = lambda hour, **extra: {"time": {"hour": hour, "minute": 0}, **extra}  # noqa: E731
    assert dynamic_threshold(cfg, at(10))[0] == pytest.approx(0.8)
    assert dynamic_threshold(cfg, at(10, user={"trusted": True}))[0] == pytest.approx(0.9)
    assert dynamic_threshold(cfg, at(10, user={"trust_score": 0.5}))[0] == pytest.approx(0.85)
    assert dynamic_threshold(cfg, at(10, content={"sensitive": True}))[0] == pytest.approx(0.6)
    assert dynamic_threshold(cfg, at(10, content={"sensitivity": 0.5}))[0] == pytest.approx(0.7)
    assert dynamic_threshold(cfg, at(20))[0] == pytest.approx(0.7)
    assert dynamic_threshold(cfg, at(3))[0] == pytest.approx(0.7)  # wraps midnight
    high = DynamicThresholdConfig(base_threshold=0.95, user_trust_modifier=0.5)
    assert dynamic_threshold(high, at(10, user={"trusted": True}))[0] == 1.0
    low = DynamicThresholdConfig(base_threshold=0.1, content_sensitivity_modifier=-0.5)
    assert dynamic_threshold(low, at(10, content={"sensitive": True}))[0] == 0.0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("hour", "nine"),
        ("hour", "x" * 10_000),
        ("hour", [1, 2]),
        ("hour", {"h": 1}),
        ("hour", None),
        ("hour", True),
        ("hour", float("nan")),
        ("hour", float("inf")),
        ("hour", 1e300),
        ("hour", 10**400),
        ("hour", 24),
        ("hour", -1),
        ("hour", 9.5),
        ("minute", "half past"),
        ("minute", float("nan")),
        ("minute", 60),
        ("minute", False),
    ],
)
def test_a_time_of_day_the_caller_pinned_that_is_not_a_time_is_refused_naming_the_field(
    field: str, value: object
) -> None:
    cfg = DynamicThresholdConfig(base_threshold=0.5, time_of_day_modifier={"09:00-17:00": 0.1})
    ctx = {"time": {"hour": 10, "minute": 0, field: value}}
    with pytest.raises(InvalidInputError, match=rf"context time\.{field} must be") as e:
        dynamic_threshold(cfg, ctx)
    assert len(str(e.value)) < 200  # never the value at length


def test_a_pinned_time_of_day_may_be_an_integral_number_or_numeric_text() -> None:
    cfg = DynamicThresholdConfig(base_threshold=0.5, time_of_day_modifier={"09:00-17:00": 0.1})
    for hour, minute in ((9, 0), (9.0, 0.0), ("9", "0"), (" 16 ", "59"), (16, 59)):
        assert dynamic_threshold(cfg, {"time": {"hour": hour, "minute": minute}})[0] == pytest.approx(0.6)
    for hour in (8, 17, "23", 0):
        assert dynamic_threshold(cfg, {"time": {"hour": hour, "minute": 0}})[0] == pytest.approx(0.5)


def test_trust_and_sensitivity_that_are_not_finite_numbers_count_as_absent() -> None:
    cfg = DynamicThresholdConfig(base_threshold=0.5, user_trust_modifier=0.2, content_sensitivity_modifier=-0.2)
    for v in (10**400, float("nan"), "0.9", [1]):
        assert dynamic_threshold(cfg, {"user": {"trust_score": v}, "content": {"sensitivity": v}})[0] == 0.5
    assert dynamic_threshold(cfg, {"user": {"trust_score": float("inf")}})[0] == pytest.approx(0.7)


def test_conditions_over_integers_too_large_for_a_float_or_for_text_never_raise() -> None:
    huge = 10**5000
    ctx = {"n": huge}
    assert check(Condition(field="n", operator="greater_than", value=5), ctx)
    assert not check(Condition(field="n", operator="less_than", value=5), ctx)
    assert not check(Condition(field="n", operator="equals", value=5), ctx)
    assert check(Condition(field="n", operator="equals", value=huge), ctx)
    # past the interpreter's int-to-text limit it has no text: text operators do not match it
    assert not check(Condition(field="n", operator="starts_with", value="1"), ctx)
    assert not check(Condition(field="n", operator="contains", value="0"), ctx)
    assert not check(Condition(field="n", operator="regex_match", value="^1"), ctx)
    assert not check(Condition(field="n", operator="in", value=[1, 2]), ctx)


def test_time_range_wrap_around_boundaries() -> None:
    minute = lambda h, m=0: h * 60 + m  # noqa: E731
    assert in_time_range("17:00-09:00", minute(17))
    assert in_time_range("17:00-09:00", minute(23, 59))
    assert in_time_range("17:00-09:00", minute(0))
    assert in_time_range("17:00-09:00", minute(8, 59))
    assert not in_time_range("17:00-09:00", minute(9))
    assert not in_time_range("17:00-09:00", minute(12))
    assert in_time_range("09:00-17:00", minute(9)) and not in_time_range("09:00-17:00", minute(17))


def test_feedback_adjusts_threshold_only_with_enough_labels() -> None:
    cfg = FeedbackConfig(collect_user_feedback=True, update_model=True, feedback_weight=0.1, min_feedback_count=10)
    assert feedback_adjusted(0.8, cfg, FeedbackStats(total=5, false_positive=5))[0] == 0.8
    assert feedback_adjusted(0.8, cfg, FeedbackStats(total=10, false_positive=10))[0] == pytest.approx(0.7)
    assert feedback_adjusted(0.8, cfg, FeedbackStats(total=10, false_negative=5))[0] == pytest.approx(0.85)
    off = FeedbackConfig(collect_user_feedback=True, update_model=False)
    assert feedback_adjusted(0.8, off, FeedbackStats(total=100, false_positive=100))[0] == 0.8
    not_collected = FeedbackConfig(collect_user_feedback=False, update_model=True)
    assert feedback_adjusted(0.8, not_collected, FeedbackStats(total=100, false_positive=100))[0] == 0.8


@pytest.mark.parametrize(
    ("strategy", "scores", "passed"),
    [
        ("weighted_average", [(0.9, 0.4, True), (0.8, 0.4, True), (0.2, 0.2, False)], False),  # 0.72 < 0.8
        ("weighted_average", [(0.9, 0.4, True), (0.8, 0.4, True), (0.9, 0.2, True)], True),
        ("majority", [(0.9, 1, True), (0.85, 1, True), (0.1, 1, False)], True),
        ("majority", [(0.9, 1, True), (0.1, 1, False), (0.1, 1, False)], False),
        ("majority", [(0.9, 1, True), (0.1, 1, False)], False),  # a tie is not a majority
        ("unanimous", [(0.9, 1, True), (0.85, 1, True)], True),
        ("unanimous", [(0.9, 1, True), (0.7, 1, False)], False),
        ("unanimous", [(0.9, 1, True), (None, 1, False)], False),  # no verdict votes fail
    ],
)
def test_consensus(strategy: str, scores: list[tuple[float | None, float, bool]], passed: bool) -> None:
    ballots = [Ballot(score=s, weight=w, vote=v) for s, w, v in scores]
    _, ok, why = combine(ConsensusStrategy(strategy), ballots, 0.8)
    assert ok is passed, why


def _rule_result(spans: list[Span] = (), violations: list[str] = ()) -> RuleResult:
    ev = EvaluatorResult(evaluator="e", status=Status.FAIL, score=0.0, spans=list(spans), violations=list(violations))
    return RuleResult(rule="r", status=Status.FAIL, passed=False, evaluators=[ev])


def test_modify_redact_replace_summarize() -> None:
    text = "Call Jane at 555-1234. The weather is nice. Email jane@x.io now."
    spans = [Span(start=5, end=9, label="PERSON"), Span(start=13, end=21, label="PHONE_NUMBER")]
    redact = ModifyConfig(strategy="redact", replacement_text="[{label}]")
    assert actions.apply_modifications(text, [(redact, _rule_result(spans))]) == (
        "Call [PERSON] at [PHONE_NUMBER]. The weather is nice. Email jane@x.io now."
    )
    words = ModifyConfig(strategy="redact")
    assert actions.apply_modifications(
        "a BadWord here, badword there", [(words, _rule_result(violations=["badword"]))]
    ) == ("a [REDACTED] here, [REDACTED] there")
    replace = ModifyConfig(strategy="replace", replacement_text="[removed]")
    assert actions.apply_modifications(text, [(replace, _rule_result(spans))]) == "[removed]"
    summarize = ModifyConfig(strategy="summarize")
    assert actions.apply_modifications(text, [(summarize, _rule_result(spans))]) == (
        "The weather is nice. Email jane@x.io now."
    )
    keep = ModifyConfig(strategy="summarize", preserve_meaning=True, replacement_text="[x]")
    assert actions.apply_modifications(text, [(keep, _rule_result(spans))]).startswith("Call [x] at [x].")
    overlapping = [Span(start=0, end=4), Span(start=2, end=9)]
    assert (
        actions.apply_modifications(text, [(words, _rule_result(overlapping))]) == "[REDACTED] at 555-1234." + text[22:]
    )


def test_durations() -> None:
    assert duration_seconds("24h") == 86400
    assert duration_seconds("2h") == 7200
    assert duration_seconds("30m") == 1800
    assert duration_seconds("1.5d") == 129600
