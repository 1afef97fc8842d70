"""What the gRPC API answers, as plain models, where a store record alone is not the answer.

Most answers are the store's records themselves (``crossaudit.store.base``); the models here
either derive from a record (adding what is computed when it is read) or group records the way
one response message does. The codec (:mod:`crossaudit.api.convert`) maps each of them to
its message and back, for the servicers and for the SDK, which re-exports them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from crossaudit.api.records import (
    CandidateRecord,
    DeploymentRecord,
    EvaluatorRecord,
    HistoryRecord,
    PolicyVersionRecord,
    ReviewRecord,
    ShadowDiffRecord,
)
from crossaudit.kernel.results import Decision


class RemoteDecision(Decision):
    """A Decision answered by the service: plus where it was decided and what it created."""

    policy_revision: int = 0
    environment: str = ""
    review_ids: list[str] = Field(default_factory=list)
    request_id: str = ""
    # What it judged: the request's stage and, at a tool stage, the tool call (docs/agents.md).
    stage: str = ""
    tool_name: str = ""
    tool_call_id: str = ""

    @property
    def modified_arguments(self) -> Any:
        """At the tool_call stage, the redacted arguments (parsed JSON: the engine redacts inside
        their values, so they stay valid); None when nothing was modified or at another stage."""
        if self.stage != "tool_call" or self.modified_response is None:
            return None
        return json.loads(self.modified_response)


@dataclass(frozen=True)
class ReviewInfo(ReviewRecord):
    """A review as read through the API: flags computed at read time, never stored."""

    escalated: bool = False  # an open flag past its escalate_at
    overdue: bool = False  # an open review past its review_due_at


@dataclass(frozen=True)
class UploadedEvaluator(EvaluatorRecord):
    """The answer to an upload: the stored record, and whether this upload created it."""

    created: bool = False  # False when identical content reused the existing version


@dataclass(frozen=True)
class DeployResult:
    version: PolicyVersionRecord  # without content (the caller sent it)
    deployment: DeploymentRecord | None  # None for a candidate: nothing was made active
    created: bool  # False when identical content reused an existing version
    candidate: CandidateRecord | None = None  # a shadow or canary deploy: the candidate it started


@dataclass(frozen=True)
class PromoteResult:
    deployment: DeploymentRecord  # the promoted version, now active
    candidate: CandidateRecord  # ended: promoted


@dataclass(frozen=True)
class RevisionCounts:
    """A revision's decisions in a canary's environment since it started (from the audit log)."""

    decisions: int = 0
    errored: int = 0  # with at least one errored rule
    blocked: int = 0

    def rate(self, n: int) -> float:
        return n / self.decisions if self.decisions else 0.0


@dataclass(frozen=True)
class ShadowReport:
    """A candidate's state, its shadow totals (on ``candidate``), per-rule flips and changed
    decisions, a canary's counts beside the active version's, and the history entries."""

    candidate: CandidateRecord
    rule_flips: dict[str, int] = field(default_factory=dict)
    samples: tuple[ShadowDiffRecord, ...] = ()
    history: tuple[HistoryRecord, ...] = ()
    canary: RevisionCounts = RevisionCounts()
    active: RevisionCounts = RevisionCounts()


@dataclass(frozen=True)
class PolicyInfo:
    version: PolicyVersionRecord  # with content
    deployments: tuple[DeploymentRecord, ...]  # every environment where the policy is deployed

    @property
    def content(self) -> str:
        return self.version.content


@dataclass(frozen=True)
class RollbackResult:
    deployment: DeploymentRecord
    previous_version: int


@dataclass(frozen=True)
class ServerInfo:
    """The server's version and where custom code runs (``weaker_isolation``: the process sandbox)."""

    version: str
    tenant: str
    multi_tenant: bool
    sandbox_backend: str
    isolation: str
    weaker_isolation: bool


@dataclass(frozen=True)
class LabelledDecision:
    """One label on one rule of one decision, with what the decision recorded."""

    source: str  # "review" | "feedback"
    id: str  # the review's or feedback's id
    decision_id: str
    rule: str
    label: str  # approved | rejected | false_positive | false_negative
    should_pass: bool
    labelled_at: float
    decided_at: float
    scores: dict[str, float] = field(default_factory=dict)  # rule -> recorded score (rules with one)
    thresholds: dict[str, float] = field(default_factory=dict)  # rule -> the threshold it was held to
    recorded: dict[str, bool] = field(default_factory=dict)  # rule -> did it pass (rules with a verdict)
    prompt: str | None = None  # retained inputs only (None: not retained, expired or erased)
    response: str | None = None
    context: dict[str, Any] | None = None


@dataclass(frozen=True)
class LabelPage:
    labels: list[LabelledDecision]
    next_page_token: str = ""  # "" = the last page
