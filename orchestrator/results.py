"""Plain result models shared by evaluators, the engine, the SDK and the service.

Scores are in [0, 1] where **1 means fully compliant**; a rule fails when its score is
below its threshold. These models never carry proto types (the service converts).
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


class Status(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    ERROR = "error"
    TIMEOUT = "timeout"
    SKIPPED = "skipped"


class Action(StrEnum):
    """Rule actions, declared from least to most severe (``severity`` relies on the order)."""

    CONTINUE = "continue"
    ALLOW = "allow"
    WARN = "warn"
    FLAG = "flag"
    MODIFY = "modify"
    CUSTOM = "custom"
    REQUIRE_REVIEW = "require_review"
    BLOCK = "block"

    @property
    def severity(self) -> int:
        return _SEVERITY[self]


# ``custom`` (a webhook) notifies but does not stop content: ranked with ``flag``.
_SEVERITY = {
    Action.CONTINUE: 0,
    Action.ALLOW: 0,
    Action.WARN: 1,
    Action.FLAG: 2,
    Action.CUSTOM: 2,
    Action.MODIFY: 3,
    Action.REQUIRE_REVIEW: 4,
    Action.BLOCK: 5,
}


class Span(BaseModel):
    """A located finding in the response text (used by ``modify``/redact)."""

    model_config = ConfigDict(frozen=True)

    start: int = Field(ge=0)
    end: int = Field(ge=0)
    label: str = ""
    score: float = Field(default=1.0, ge=0.0, le=1.0)


class Verdict(BaseModel):
    """What one evaluator call produces, before the engine adds timing and attempts."""

    score: float = Field(ge=0.0, le=1.0, description="1 = fully compliant")
    passed: bool | None = Field(default=None, description="the evaluator's own verdict, if it gives one")
    violations: list[str] = Field(default_factory=list)
    details: dict[str, Any] = Field(default_factory=dict)
    spans: list[Span] = Field(default_factory=list)

    @field_validator("score")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("score must be finite")
        return v


class EvaluatorResult(BaseModel):
    """One evaluator's outcome inside a rule: a verdict, or why there is none."""

    evaluator: str
    kind: str = ""  # llm | builtin | custom
    status: Status
    score: float | None = None
    passed: bool | None = None
    violations: list[str] = Field(default_factory=list)
    details: dict[str, Any] = Field(default_factory=dict)
    spans: list[Span] = Field(default_factory=list)
    latency_ms: float = 0.0
    attempts: int = 0
    cached: bool = False
    error: str | None = None  # human-readable reason for error/timeout
    error_type: str | None = None  # the CrossAuditError class name


class ActionOutcome(BaseModel):
    """The structured effect of a failed rule's action (rendered action_config)."""

    rule: str
    action: Action
    params: dict[str, Any] = Field(default_factory=dict)


class RuleResult(BaseModel):
    rule: str
    status: Status
    passed: bool
    score: float | None = None
    threshold: float | None = None
    action: Action | None = None  # the action applied (only when the rule failed)
    evaluators: list[EvaluatorResult] = Field(default_factory=list)
    fallback_used: bool = False
    reason: str = ""  # why skipped / errored / how the score was combined
    latency_ms: float = 0.0
    outcome: ActionOutcome | None = None


class Decision(BaseModel):
    """The answer to one evaluation request."""

    policy: str
    policy_version: str
    passed: bool
    action: Action
    rules: list[RuleResult]
    modified_response: str | None = None
    outcomes: list[ActionOutcome] = Field(default_factory=list)
    errored_rules: list[str] = Field(default_factory=list)
    latency_ms: float = 0.0
    decision_id: str = ""

    def rule(self, name: str) -> RuleResult:
        for r in self.rules:
            if r.rule == name:
                return r
        raise KeyError(name)
