"""Review items: what a failed ``require_review`` or ``flag`` rule leaves for people, and how
its timing plays out.

One module owns the rules so that the engine (which stamps deadlines on the outcome), the
service (which turns a decision into items), the store (which auto-approves) and the wire
converter (which reports ``escalated``/``overdue``) cannot drift apart. Everything here is a
pure function of its arguments and an explicit ``now``: no clock, no I/O. It sits below the
store so the store may call it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from crossaudit.kernel.durations import duration_seconds
from crossaudit.kernel.results import Action, Decision


class ReviewKind(StrEnum):
    REQUIRE_REVIEW = "require_review"
    FLAG = "flag"


class ReviewState(StrEnum):
    OPEN = "open"
    APPROVED = "approved"
    REJECTED = "rejected"
    DISMISSED = "dismissed"


KINDS = {Action.REQUIRE_REVIEW: ReviewKind.REQUIRE_REVIEW, Action.FLAG: ReviewKind.FLAG}

# Absolute deadlines stamped into an item's params (ISO-8601), from the action_config durations.
ESCALATE_AT = "escalate_at"
DUE_AT = "review_due_at"
AUTO_APPROVE_AT = "auto_approve_at"
DEADLINES: dict[ReviewKind, tuple[tuple[str, str], ...]] = {
    ReviewKind.FLAG: (("auto_escalate_after", ESCALATE_AT),),
    ReviewKind.REQUIRE_REVIEW: (("max_review_time", DUE_AT), ("auto_approve_after", AUTO_APPROVE_AT)),
}


@dataclass(frozen=True)
class ReviewItem:
    """A review a decision asks for, before the service gives it an id and the store a row."""

    rule: str
    kind: ReviewKind
    params: dict[str, Any]


@dataclass(frozen=True)
class ReviewTiming:
    """Where an item stands at a given time. Only an open item escalates, goes overdue or is
    auto-approved: a resolution is final, whatever its deadlines say."""

    escalated: bool = False
    overdue: bool = False
    auto_approve: bool = False


@dataclass(frozen=True)
class Resolution:
    state: ReviewState
    reviewer: str
    note: str


AUTO_REVIEWER = "auto"
AUTO_APPROVAL = Resolution(ReviewState.APPROVED, AUTO_REVIEWER, "auto-approved (auto_approve_after)")


def deadlines(action: Action, params: Mapping[str, Any], now: dt.datetime) -> dict[str, str | None]:
    """The absolute deadlines for the durations ``params`` gives (e.g. ``escalate_at`` for
    ``auto_escalate_after``). Stamped when the rule fails, so a later policy change or a restart
    never moves an existing item's deadline."""
    kind = KINDS.get(action)
    if kind is None:
        return {}
    return {at: _after(now, params[duration]) for duration, at in DEADLINES[kind] if duration in params}


def items(decision: Decision) -> list[ReviewItem]:
    """One item per failed rule whose action asks for a review, carrying the rule's outcome params."""
    return [
        ReviewItem(rule=r.rule, kind=KINDS[r.action], params=dict(r.outcome.params) if r.outcome else {})
        for r in decision.rules
        if not r.passed and r.action in KINDS
    ]


def timing(kind: ReviewKind, state: ReviewState, params: Mapping[str, Any], now: float) -> ReviewTiming:
    """Escalated, overdue and auto-approval at ``now`` (epoch seconds). Computed when read rather
    than by a timer, so nothing runs in the background and a restart loses nothing."""
    if state is not ReviewState.OPEN:
        return ReviewTiming()
    return ReviewTiming(
        escalated=_reached(params.get(ESCALATE_AT), now),
        overdue=_reached(params.get(DUE_AT), now),
        auto_approve=kind is ReviewKind.REQUIRE_REVIEW and _reached(params.get(AUTO_APPROVE_AT), now),
    )


def iso_seconds(value: Any) -> float | None:
    """Epoch seconds of an ISO-8601 timestamp param (``escalate_at``, ...), or None; a naive time is UTC."""
    if not isinstance(value, str):
        return None
    try:
        ts = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=dt.UTC)
    return ts.timestamp()


def _after(now: dt.datetime, duration: str | None) -> str | None:
    return (now + dt.timedelta(seconds=duration_seconds(duration))).isoformat() if duration else None


def _reached(deadline: Any, now: float) -> bool:
    at = iso_seconds(deadline)
    return at is not None and at <= now
