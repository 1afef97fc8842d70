"""The records the store persists and the API answers with: plain frozen dataclasses (no proto
types, no ORM objects). The store (:mod:`crossaudit.store.base`) reads and writes them; the
codec (:mod:`crossaudit.api.convert`) maps them to their messages; the SDK hands them out.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

# Review kinds and states belong to the review rules (orchestrator.reviews).
from orchestrator.reviews import ReviewKind, ReviewState

RETAINED_ROW_BYTES = 256  # a retained row's fixed part (ids, names, times), counted like AUDIT_ROW_BYTES


@dataclass(frozen=True)
class PolicyVersionRecord:
    tenant: str
    name: str
    version: int  # immutable revision number, 1, 2, ... per (tenant, name)
    declared_version: str  # the policy's own ``version`` field
    digest: str  # sha256 of content
    description: str
    content: str
    created_at: float


@dataclass(frozen=True)
class DeploymentRecord:
    tenant: str
    name: str
    environment: str
    version: int
    deployed_at: float


@dataclass(frozen=True)
class PolicySummaryRecord:
    name: str
    latest_version: int
    deployments: tuple[DeploymentRecord, ...] = ()


@dataclass(frozen=True)
class EvaluatorRecord:
    id: str  # UUID
    tenant: str
    name: str
    version: int  # 1, 2, ... per (tenant, name)
    language: str
    dependencies: tuple[str, ...]
    digest: str  # content address (CodeBundle.digest)
    code: str
    description: str
    created_at: float


@dataclass(frozen=True)
class AuditRecord:
    """One answered decision. Raw text only when the policy or the server asks for it."""

    decision_id: str
    tenant: str
    policy: str
    policy_revision: int
    policy_version: str
    policy_digest: str
    environment: str
    passed: bool
    action: str
    rules: list[dict[str, Any]]  # per-rule status, score, action, latency, evaluators (no raw text)
    errored_rules: list[str]
    latency_ms: float
    prompt_sha256: str
    response_sha256: str
    context_sha256: str
    created_at: float
    request_id: str = ""
    prompt: str | None = None
    response: str | None = None
    modified_response_sha256: str | None = None
    # What was cut to keep the record within limits.max_audit_bytes_per_decision ("" = nothing):
    # the setting, its value, the parts removed and the size before.
    truncated: str = ""
    # Its retained inputs (docs/retention.md): kept until then (None: never retained), and when
    # an erasure removed them and the raw text above (None: never erased). Replay says which.
    inputs_retained_until: float | None = None
    inputs_erased_at: float | None = None
    # What decided it (docs/evidence.md): policy, engine, each evaluator's provenance.
    receipt: dict[str, Any] = field(default_factory=dict)
    # Its place in its tenant's decision log, assigned when it is written (None: written while
    # the log was off, or not by the server), and the leaf hash (hex) the server computed.
    log_seq: int | None = None
    leaf_hash: str | None = None
    # The trace of its Evaluate span (docs/observability.md), hex, when that span was sampled
    # (None: tracing off or not sampled). Beside the record, not in its leaf or receipt.
    trace_id: str | None = None
    span_id: str | None = None


@dataclass(frozen=True)
class ReviewRecord:
    id: str
    tenant: str
    decision_id: str
    policy: str
    policy_revision: int
    environment: str
    rule: str
    kind: ReviewKind
    state: ReviewState
    params: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    resolved_at: float | None = None
    reviewer: str = ""
    note: str = ""


@dataclass(frozen=True)
class FeedbackRecord:
    id: str
    tenant: str
    decision_id: str
    rule: str
    label: str
    comment: str
    created_at: float


@dataclass(frozen=True)
class LabelRecord:
    """A person's label on one rule of one decision, with the decision's recorded rules: a resolved
    review (``source`` "review", ``label`` its state: approved or rejected) or a feedback label
    (``source`` "feedback", ``label`` false_positive or false_negative). What each one means as an
    expected outcome: ``crossaudit.governance.labels`` (docs/calibration.md)."""

    source: str
    id: str  # the review's or the feedback's id
    decision_id: str
    rule: str
    label: str
    labelled_at: float  # a review's resolved_at, a feedback's created_at
    decided_at: float  # the decision's created_at
    decision_rules: list[dict[str, Any]]  # the audit record's rules (status, passed, score, threshold, ...)


class OutboxState(str, enum.Enum):
    PENDING = "pending"  # waiting for its next attempt (or being attempted under a lease)
    DELIVERED = "delivered"
    DEAD = "dead"  # out of attempts, or refused for good: redelivery puts it back to pending


@dataclass(frozen=True)
class OutboxRecord:
    """One message to deliver (a webhook call, one decision for the decision log), written in the
    same transaction as the decision that caused it: delivered at least once, never lost.

    ``id`` is the delivery id the receiver sees (stable across retries, for idempotency).
    ``lease_until`` > now means a worker holds it; settling is fenced on the lease it claimed.
    """

    id: str
    tenant: str
    kind: str  # "webhook", or a decision-log sink ("decision_log:http", "decision_log:file")
    decision_id: str
    rule: str
    payload: dict[str, Any]
    state: OutboxState = OutboxState.PENDING
    attempts: int = 0
    next_attempt_at: float = 0.0
    lease_until: float = 0.0
    last_error: str = ""
    last_status: int = 0
    created_at: float = 0.0
    delivered_at: float | None = None


@dataclass(frozen=True)
class RetainedRecord:
    """A decision's retained inputs, sealed (crossaudit.governance.vault): only ciphertext is stored.
    ``index``: blind-index digests of its context's top-level scalar fields (erasure by field)."""

    tenant: str
    decision_id: str
    policy: str
    environment: str
    created_at: float
    expires_at: float
    key_id: str  # the tenant data key that sealed it
    nonce: bytes
    ciphertext: bytes
    index: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        """Bytes it costs its tenant's audit quota: ciphertext, nonce, index digests, fixed part."""
        return RETAINED_ROW_BYTES + len(self.ciphertext) + len(self.nonce) + sum(len(d) for d in self.index)


@dataclass(frozen=True)
class TenantKeyRecord:
    """A tenant's data key, wrapped by the operator key ``operator_key_id`` (never stored bare)."""

    tenant: str
    key_id: str
    operator_key_id: str
    wrapped: bytes
    created_at: float


@dataclass(frozen=True)
class ErasureRecord:
    """One erasure of retained inputs: what asked for it, never the value it matched."""

    id: str
    tenant: str
    selector_kind: str  # "decision" or "context_field"
    selector_digest: str  # a digest of the selector (a keyed one for a context field's value)
    decisions: int  # decisions whose inputs and raw text were removed
    created_at: float
    actor: str


@dataclass(frozen=True)
class CheckpointRecord:
    """A signed tree head of a tenant's decision log: its first ``size`` leaves hash to
    ``root`` (hex); ``note`` is the signed checkpoint text, ``frontier`` the tree's right edge
    (hex hashes) so the next checkpoint extends it without re-reading older leaves."""

    tenant: str
    size: int
    root: str
    key_id: str
    note: str
    frontier: list[str]
    created_at: float


class CandidateState(str, enum.Enum):
    RUNNING = "running"
    PROMOTED = "promoted"  # made the active version (a normal deployment)
    DISCARDED = "discarded"  # ended by its author; the active version never changed
    ROLLED_BACK = "rolled_back"  # a canary that left its bounds, ended automatically


class CandidateMode(str, enum.Enum):
    SHADOW = "shadow"  # evaluated off the answer path on a sample; never answers
    CANARY = "canary"  # answers a sticky share of traffic, real actions included


@dataclass(frozen=True)
class CandidateRecord:
    """A policy version tried beside the active one in one environment (at most one running per
    tenant, policy and environment). Everything a restart needs is here: the mode, the share, the
    bounds it started with and the shadow's running totals."""

    id: str
    tenant: str
    name: str
    environment: str
    mode: CandidateMode
    version: int  # the candidate's policy revision (stored, never made active until promoted)
    active_version: int  # the revision that was active when it started
    share: float  # shadow: the sampled fraction of decisions; canary: the fraction of keys it answers
    canary_key: str  # canary: the request-context field whose value picks the sticky share
    notify_url: str  # canary: where its automatic rollback is announced ("" = nowhere)
    bounds: dict[str, Any]  # canary: the rollback bounds it started with (RolloutLimits' names)
    state: CandidateState
    started_at: float
    ended_at: float | None = None
    reason: str = ""
    # shadow totals, added to atomically as the shadow workers record diffs
    evaluated: int = 0
    agreed: int = 0
    pass_to_fail: int = 0
    fail_to_pass: int = 0
    action_changes: int = 0
    errors: int = 0
    dropped: int = 0
    diffs_stored: int = 0


@dataclass(frozen=True)
class ShadowDiffRecord:
    """One sampled decision evaluated under a shadow candidate: the live answer beside the
    candidate's, per rule. ``error``: the candidate failed to decide (recorded, never raised)."""

    tenant: str
    candidate_id: str
    decision_id: str
    created_at: float
    live_passed: bool
    live_action: str
    candidate_passed: bool
    candidate_action: str
    rules: list[dict[str, Any]]  # {rule, live_status, live_score, candidate_status, candidate_score, flipped}
    error: str = ""
    changed: bool = False  # the answer or some rule differs, or the candidate errored


@dataclass(frozen=True)
class HistoryRecord:
    """One entry of a policy's deployment history in an environment: deploys, rollbacks and the
    candidates' lifecycle (``shadow``, ``canary``, ``promote``, ``discard``, ``canary_rollback``)."""

    name: str
    environment: str
    version: int
    kind: str
    at: float
