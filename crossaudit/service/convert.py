"""Plain models ↔ protobuf messages. The only module that knows both sides; proto types
never leave ``crossaudit/service`` (the SDK client reuses these converters)."""

from __future__ import annotations

import json
import math
import time
from typing import Any

from google.protobuf import json_format, struct_pb2, timestamp_pb2

from crossaudit.kernel.errors import InvalidInputError, PolicyIssue
from crossaudit.kernel.results import (
    WIRE_INT_MAX,
    Action,
    ActionOutcome,
    Decision,
    EvaluatorResult,
    RuleResult,
    Span,
    Status,
    wire_text,
)
from crossaudit.service.decoding import depth_message
from crossaudit.store.base import (
    AuditRecord,
    DeploymentRecord,
    EvaluatorRecord,
    PolicySummaryRecord,
    PolicyVersionRecord,
    ReviewKind,
    ReviewRecord,
    ReviewState,
    iso_seconds,
)
from crossaudit.v1 import audit_pb2 as audit_pb
from crossaudit.v1 import evaluation_pb2 as ev_pb
from crossaudit.v1 import evaluator_pb2 as evr_pb
from crossaudit.v1 import policy_pb2 as pol_pb
from crossaudit.v1 import review_pb2 as rev_pb

ACTION_TO_PB = {a: ev_pb.Action.Value(f"ACTION_{a.name}") for a in Action}
ACTION_FROM_PB = {v: k for k, v in ACTION_TO_PB.items()}
STATUS_TO_PB = {s: ev_pb.Status.Value(f"STATUS_{s.name}") for s in Status}
STATUS_FROM_PB = {v: k for k, v in STATUS_TO_PB.items()}
REVIEW_KIND_TO_PB = {k: rev_pb.ReviewKind.Value(f"REVIEW_KIND_{k.name}") for k in ReviewKind}
REVIEW_KIND_FROM_PB = {v: k for k, v in REVIEW_KIND_TO_PB.items()}
REVIEW_STATE_TO_PB = {s: rev_pb.ReviewState.Value(f"REVIEW_STATE_{s.name}") for s in ReviewState}
REVIEW_STATE_FROM_PB = {v: k for k, v in REVIEW_STATE_TO_PB.items()}


def _jsonable(value: Any) -> Any:
    """Struct-compatible copy (tuples → lists, enums/objects → str, NaN/inf → None, integers
    beyond ±2^53 → str, lone surrogates → U+FFFD), so that converting never fails. Evaluator
    results were already refused at the sandbox boundary when they needed any of this."""

    def fix(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, int) and not isinstance(v, bool) and not -WIRE_INT_MAX <= v <= WIRE_INT_MAX:
            return str(v)
        if isinstance(v, str):
            return wire_text(v)
        if isinstance(v, dict):
            return {wire_text(str(k)): fix(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [fix(x) for x in v]
        return v

    return fix(json.loads(json.dumps(value, default=str)))


def to_struct(doc: dict[str, Any] | None) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    if doc:
        s.update(_jsonable(doc))
    return s


def from_struct(s: struct_pb2.Struct | None, *, max_depth: int | None = None, what: str = "struct") -> dict[str, Any]:
    """The Struct as a dict; with ``max_depth``, deeper nesting is an InvalidInputError."""
    if s is None:
        return {}
    doc = json_format.MessageToDict(s)
    if max_depth is not None and _depth(doc) > max_depth:
        raise InvalidInputError(f"{what} is {depth_message(max_depth)}")
    return doc


def _depth(doc: Any) -> int:
    deepest = 0
    stack = [(doc, 1)]
    while stack:
        cur, depth = stack.pop()
        if isinstance(cur, dict | list):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in (cur.values() if isinstance(cur, dict) else cur))
    return deepest


def timestamp(seconds: float | None) -> timestamp_pb2.Timestamp | None:
    if seconds is None:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def from_timestamp(ts: timestamp_pb2.Timestamp, present: bool = True) -> float | None:
    if not present:
        return None
    return ts.seconds + ts.nanos / 1e9


# --- decisions --------------------------------------------------------------------------


def outcome_to_pb(o: ActionOutcome) -> ev_pb.ActionOutcome:
    return ev_pb.ActionOutcome(rule=o.rule, action=ACTION_TO_PB[o.action], params=to_struct(o.params))


def evaluator_result_to_pb(e: EvaluatorResult) -> ev_pb.EvaluatorResult:
    msg = ev_pb.EvaluatorResult(
        evaluator=e.evaluator,
        kind=e.kind,
        status=STATUS_TO_PB[e.status],
        violations=e.violations,
        details=to_struct(e.details),
        spans=[ev_pb.Span(start=s.start, end=s.end, label=s.label, score=s.score) for s in e.spans],
        latency_ms=e.latency_ms,
        attempts=e.attempts,
        cached=e.cached,
        error=e.error or "",
        error_type=e.error_type or "",
    )
    if e.score is not None:
        msg.score = e.score
    if e.passed is not None:
        msg.passed = e.passed
    return msg


def rule_to_pb(r: RuleResult) -> ev_pb.RuleResult:
    msg = ev_pb.RuleResult(
        rule=r.rule,
        status=STATUS_TO_PB[r.status],
        passed=r.passed,
        action=ACTION_TO_PB[r.action] if r.action is not None else ev_pb.ACTION_UNSPECIFIED,
        evaluators=[evaluator_result_to_pb(e) for e in r.evaluators],
        fallback_used=r.fallback_used,
        reason=r.reason,
        latency_ms=r.latency_ms,
    )
    if r.score is not None:
        msg.score = r.score
    if r.threshold is not None:
        msg.threshold = r.threshold
    if r.outcome is not None:
        msg.outcome.CopyFrom(outcome_to_pb(r.outcome))
    return msg


def decision_to_pb(
    d: Decision, *, revision: int = 0, environment: str = "", review_ids: list[str] | None = None, request_id: str = ""
) -> ev_pb.EvaluateResponse:
    msg = ev_pb.EvaluateResponse(
        decision_id=d.decision_id,
        policy=d.policy,
        policy_version=d.policy_version,
        policy_revision=revision,
        environment=environment,
        passed=d.passed,
        action=ACTION_TO_PB[d.action],
        rules=[rule_to_pb(r) for r in d.rules],
        outcomes=[outcome_to_pb(o) for o in d.outcomes],
        errored_rules=d.errored_rules,
        latency_ms=d.latency_ms,
        review_ids=review_ids or [],
        request_id=request_id,
    )
    if d.modified_response is not None:
        msg.modified_response = d.modified_response
    return msg


def _opt(msg: Any, name: str) -> Any:
    return getattr(msg, name) if msg.HasField(name) else None


def outcome_from_pb(o: ev_pb.ActionOutcome) -> ActionOutcome:
    return ActionOutcome(rule=o.rule, action=ACTION_FROM_PB[o.action], params=from_struct(o.params))


def decision_fields_from_pb(msg: ev_pb.EvaluateResponse) -> dict[str, Any]:
    """Keyword arguments of :class:`crossaudit.kernel.results.Decision` (plus service extras)."""
    rules = []
    for r in msg.rules:
        rules.append(
            RuleResult(
                rule=r.rule,
                status=STATUS_FROM_PB[r.status],
                passed=r.passed,
                score=_opt(r, "score"),
                threshold=_opt(r, "threshold"),
                action=ACTION_FROM_PB[r.action] if r.action else None,
                evaluators=[
                    EvaluatorResult(
                        evaluator=e.evaluator,
                        kind=e.kind,
                        status=STATUS_FROM_PB[e.status],
                        score=_opt(e, "score"),
                        passed=_opt(e, "passed"),
                        violations=list(e.violations),
                        details=from_struct(e.details),
                        spans=[Span(start=s.start, end=s.end, label=s.label, score=s.score) for s in e.spans],
                        latency_ms=e.latency_ms,
                        attempts=e.attempts,
                        cached=e.cached,
                        error=e.error or None,
                        error_type=e.error_type or None,
                    )
                    for e in r.evaluators
                ],
                fallback_used=r.fallback_used,
                reason=r.reason,
                latency_ms=r.latency_ms,
                outcome=outcome_from_pb(r.outcome) if r.HasField("outcome") else None,
            )
        )
    return {
        "policy": msg.policy,
        "policy_version": msg.policy_version,
        "passed": msg.passed,
        "action": ACTION_FROM_PB[msg.action],
        "rules": rules,
        "modified_response": _opt(msg, "modified_response"),
        "outcomes": [outcome_from_pb(o) for o in msg.outcomes],
        "errored_rules": list(msg.errored_rules),
        "latency_ms": msg.latency_ms,
        "decision_id": msg.decision_id,
        "policy_revision": msg.policy_revision,
        "environment": msg.environment,
        "review_ids": list(msg.review_ids),
        "request_id": msg.request_id,
    }


# --- policies, evaluators, reviews ------------------------------------------------------


def issue_to_pb(i: PolicyIssue) -> pol_pb.PolicyIssue:
    return pol_pb.PolicyIssue(message=i.message, path=i.path, file=i.file, line=i.line or 0, column=i.column or 0)


def issue_from_pb(i: pol_pb.PolicyIssue) -> PolicyIssue:
    return PolicyIssue(message=i.message, path=i.path, file=i.file, line=i.line or None, column=i.column or None)


def version_to_pb(v: PolicyVersionRecord) -> pol_pb.PolicyVersion:
    return pol_pb.PolicyVersion(
        name=v.name,
        version=v.version,
        declared_version=v.declared_version,
        digest=v.digest,
        description=v.description,
        created_at=timestamp(v.created_at),
    )


def deployment_to_pb(d: DeploymentRecord) -> pol_pb.Deployment:
    return pol_pb.Deployment(
        name=d.name, environment=d.environment, version=d.version, deployed_at=timestamp(d.deployed_at)
    )


def summary_to_pb(s: PolicySummaryRecord) -> pol_pb.PolicySummary:
    return pol_pb.PolicySummary(
        name=s.name, latest_version=s.latest_version, deployments=[deployment_to_pb(d) for d in s.deployments]
    )


def evaluator_to_pb(e: EvaluatorRecord, include_code: bool = False) -> evr_pb.Evaluator:
    return evr_pb.Evaluator(
        id=e.id,
        name=e.name,
        version=e.version,
        language=e.language,
        dependencies=list(e.dependencies),
        digest=e.digest,
        created_at=timestamp(e.created_at),
        code=e.code if include_code else "",
        description=e.description,
    )


def review_to_pb(r: ReviewRecord, now: float | None = None) -> rev_pb.Review:
    now = time.time() if now is None else now
    is_open = r.state is ReviewState.OPEN
    escalate_at = iso_seconds(r.params.get("escalate_at"))
    due_at = iso_seconds(r.params.get("review_due_at"))
    msg = rev_pb.Review(
        id=r.id,
        decision_id=r.decision_id,
        policy=r.policy,
        policy_revision=r.policy_revision,
        environment=r.environment,
        rule=r.rule,
        kind=REVIEW_KIND_TO_PB[r.kind],
        state=REVIEW_STATE_TO_PB[r.state],
        params=to_struct(r.params),
        created_at=timestamp(r.created_at),
        reviewer=r.reviewer,
        note=r.note,
        escalated=is_open and escalate_at is not None and escalate_at <= now,
        overdue=is_open and due_at is not None and due_at <= now,
    )
    if r.resolved_at is not None:
        msg.resolved_at.CopyFrom(timestamp(r.resolved_at))
    return msg


def audit_to_pb(a: AuditRecord) -> audit_pb.DecisionRecord:
    msg = audit_pb.DecisionRecord(
        decision_id=a.decision_id,
        policy=a.policy,
        policy_revision=a.policy_revision,
        policy_version=a.policy_version,
        policy_digest=a.policy_digest,
        environment=a.environment,
        passed=a.passed,
        action=a.action,
        rules=[to_struct(r) for r in a.rules],
        errored_rules=a.errored_rules,
        latency_ms=a.latency_ms,
        prompt_sha256=a.prompt_sha256,
        response_sha256=a.response_sha256,
        context_sha256=a.context_sha256,
        modified_response_sha256=a.modified_response_sha256 or "",
        created_at=timestamp(a.created_at),
        request_id=a.request_id,
    )
    if a.prompt is not None:
        msg.prompt = a.prompt
    if a.response is not None:
        msg.response = a.response
    return msg
