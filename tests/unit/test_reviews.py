"""The review rules on their own: which rules create items, their deadlines, and timing at a given time."""

from __future__ import annotations

import datetime as dt

from crossaudit.kernel.results import Action, ActionOutcome, Decision, RuleResult, Status
from orchestrator import reviews
from orchestrator.reviews import ReviewKind, ReviewState

NOW = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
PAST, FUTURE = "2020-01-01T00:00:00+00:00", "2999-01-01T00:00:00+00:00"


def test_deadlines_are_stamped_from_the_durations_of_review_actions_only() -> None:
    flag = reviews.deadlines(Action.FLAG, {"auto_escalate_after": "24h"}, NOW)
    assert flag == {"escalate_at": "2030-01-02T00:00:00+00:00"}
    review = reviews.deadlines(Action.REQUIRE_REVIEW, {"max_review_time": "1h", "auto_approve_after": "2d"}, NOW)
    assert review == {"review_due_at": "2030-01-01T01:00:00+00:00", "auto_approve_at": "2030-01-03T00:00:00+00:00"}
    assert reviews.deadlines(Action.REQUIRE_REVIEW, {}, NOW) == {}
    assert reviews.deadlines(Action.BLOCK, {"auto_escalate_after": "24h"}, NOW) == {}


def test_items_come_from_failed_review_rules_with_their_params() -> None:
    def rule(name: str, action: Action | None, passed: bool) -> RuleResult:
        outcome = ActionOutcome(rule=name, action=action, params={"n": name}) if action else None
        status = Status.PASS if passed else Status.FAIL
        return RuleResult(rule=name, status=status, passed=passed, action=action, outcome=outcome)

    decision = Decision(
        policy="p",
        policy_version="1",
        passed=False,
        action=Action.BLOCK,
        rules=[
            rule("f", Action.FLAG, False),
            rule("r", Action.REQUIRE_REVIEW, False),
            rule("ok", Action.FLAG, True),
            rule("b", Action.BLOCK, False),
        ],
    )
    assert reviews.items(decision) == [
        reviews.ReviewItem(rule="f", kind=ReviewKind.FLAG, params={"n": "f"}),
        reviews.ReviewItem(rule="r", kind=ReviewKind.REQUIRE_REVIEW, params={"n": "r"}),
    ]


def test_timing_applies_to_open_items_and_auto_approval_to_require_review() -> None:
    now = NOW.timestamp()
    params = {"escalate_at": PAST, "review_due_at": FUTURE, "auto_approve_at": PAST}
    flag = reviews.timing(ReviewKind.FLAG, ReviewState.OPEN, params, now)
    assert (flag.escalated, flag.overdue, flag.auto_approve) == (True, False, False)
    review = reviews.timing(ReviewKind.REQUIRE_REVIEW, ReviewState.OPEN, params, now)
    assert review.auto_approve
    nothing = reviews.ReviewTiming()
    assert reviews.timing(ReviewKind.REQUIRE_REVIEW, ReviewState.APPROVED, params, now) == nothing
    assert reviews.timing(ReviewKind.FLAG, ReviewState.OPEN, {"escalate_at": "not a time"}, now) == nothing


def test_naive_timestamps_are_utc() -> None:
    assert reviews.iso_seconds("2030-01-01T00:00:00") == NOW.timestamp()
    assert reviews.iso_seconds(None) is None
