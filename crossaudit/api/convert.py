"""Plain models ↔ protobuf messages: the one codec of the API's answers, both directions.

The servicers encode with the ``*_to_pb`` functions and the SDK decodes with the matching
``*_from_pb`` ones, so a field cannot be added on one side and forgotten on the other. Answers
decode to the store's records (``crossaudit.store.base``) or to the models derived from them
(``crossaudit.api.models``). A decoded record's ``tenant`` is empty: the caller's API key
decides the tenant and no message repeats it; a ``content``/``code`` the message leaves out
is empty too, as in the store's own listings."""

from __future__ import annotations

import json
import math
import time
from typing import Any

from google.protobuf import struct_pb2, timestamp_pb2

from crossaudit.api.models import (
    DeployResult,
    LabelledDecision,
    LabelPage,
    PolicyInfo,
    PromoteResult,
    RemoteDecision,
    ReviewInfo,
    RevisionCounts,
    RollbackResult,
    ServerInfo,
    ShadowReport,
    UploadedEvaluator,
)
from crossaudit.api.records import (
    AuditRecord,
    CandidateMode,
    CandidateRecord,
    CandidateState,
    DeploymentRecord,
    ErasureRecord,
    EvaluatorRecord,
    HistoryRecord,
    OutboxRecord,
    OutboxState,
    PolicySummaryRecord,
    PolicyVersionRecord,
    ReviewRecord,
    ShadowDiffRecord,
)
from crossaudit.api.replayreport import Bucket, LLMEstimate, ReplayProgress, ReplayReport, RuleDiff
from crossaudit.evidence.notes import PublicKey
from crossaudit.evidence.proofs import ConsistencyProof, InclusionProof
from crossaudit.evidence.verify import Entry, LogChunk
from crossaudit.kernel.errcodec import from_item
from crossaudit.kernel.errors import CrossAuditError, InvalidInputError, PolicyIssue
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
from crossaudit.v1 import audit_pb2 as audit_pb
from crossaudit.v1 import delivery_pb2 as dlv_pb
from crossaudit.v1 import evaluation_pb2 as ev_pb
from crossaudit.v1 import evaluator_pb2 as evr_pb
from crossaudit.v1 import info_pb2 as info_pb
from crossaudit.v1 import policy_pb2 as pol_pb
from crossaudit.v1 import replay_pb2 as rpl_pb
from crossaudit.v1 import review_pb2 as rev_pb
from orchestrator.reviews import ReviewKind, ReviewState, timing

ACTION_TO_PB = {a: ev_pb.Action.Value(f"ACTION_{a.name}") for a in Action}
ACTION_FROM_PB = {v: k for k, v in ACTION_TO_PB.items()}
STATUS_TO_PB = {s: ev_pb.Status.Value(f"STATUS_{s.name}") for s in Status}
STATUS_FROM_PB = {v: k for k, v in STATUS_TO_PB.items()}
REVIEW_KIND_TO_PB = {k: rev_pb.ReviewKind.Value(f"REVIEW_KIND_{k.name}") for k in ReviewKind}
REVIEW_KIND_FROM_PB = {v: k for k, v in REVIEW_KIND_TO_PB.items()}
REVIEW_STATE_TO_PB = {s: rev_pb.ReviewState.Value(f"REVIEW_STATE_{s.name}") for s in ReviewState}
REVIEW_STATE_FROM_PB = {v: k for k, v in REVIEW_STATE_TO_PB.items()}


def depth_message(max_depth: int) -> str:
    return f"nested too deeply: Struct/list values may nest at most {max_depth} levels (max_struct_depth)"


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

    if isinstance(value, dict) and _plain_flat(value):
        return value  # the common case (flat details of scalars): nothing to fix, no JSON round trip
    return fix(json.loads(json.dumps(value, default=str)))


def _plain_flat(doc: dict[Any, Any]) -> bool:
    """Whether ``doc`` is one level of str keys and values a Struct takes exactly as they are."""
    for k, v in doc.items():
        if type(k) is not str or not _sendable(k):
            return False
        t = type(v)
        if v is None or t is bool:
            continue
        if t is str:
            if not _sendable(v):
                return False
        elif t is int:
            if not -WIRE_INT_MAX <= v <= WIRE_INT_MAX:
                return False
        elif t is not float or not math.isfinite(v):
            return False
    return True


def _sendable(text: str) -> bool:
    return text.isascii() or wire_text(text) is text


def to_struct(doc: dict[str, Any] | None) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    if doc:
        s.update(_jsonable(doc))
    return s


def from_struct(s: struct_pb2.Struct | None, *, max_depth: int | None = None, what: str = "struct") -> dict[str, Any]:
    """The Struct as a dict; with ``max_depth``, deeper nesting is an InvalidInputError, and so
    is a NaN or infinite number (JSON has none). Integral numbers within ±2^53 come back as
    ints: a Struct carries every number as a double, and ``3`` should not read back as ``3.0``."""
    if s is None or not s.fields:
        return {}
    try:
        doc = _struct_dict(s)
    except ValueError:
        raise InvalidInputError(f"{what} holds a NaN or infinite number, which JSON cannot carry") from None
    if max_depth is not None and _depth(doc) > max_depth:
        raise InvalidInputError(f"{what} is {depth_message(max_depth)}")
    return doc


def _struct_dict(s: struct_pb2.Struct) -> dict[str, Any]:
    return {k: _value(v) for k, v in s.fields.items()}


def _value(v: struct_pb2.Value) -> Any:
    kind = v.WhichOneof("kind")
    if kind == "string_value":
        return v.string_value
    if kind == "number_value":
        n = v.number_value
        if not math.isfinite(n):
            raise ValueError("non-finite number")
        return int(n) if n.is_integer() and -WIRE_INT_MAX <= n <= WIRE_INT_MAX else n
    if kind == "bool_value":
        return v.bool_value
    if kind == "struct_value":
        return _struct_dict(v.struct_value)
    if kind == "list_value":
        return [_value(x) for x in v.list_value.values]
    return None  # null_value, or no kind set


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
    return seconds(ts)


def seconds(ts: timestamp_pb2.Timestamp) -> float:
    """Epoch seconds of a timestamp every message of its kind carries (unset reads as 0.0)."""
    return ts.seconds + ts.nanos / 1e9


# --- decisions --------------------------------------------------------------------------


# Answers are built in place (``repeated.add()``, ``field.update``): constructing each nested
# message first and passing it in makes upb copy every rule and evaluator result once more.


def _fill_outcome(msg: ev_pb.ActionOutcome, o: ActionOutcome) -> None:
    msg.rule = o.rule
    msg.action = ACTION_TO_PB[o.action]
    if o.params:
        msg.params.update(_jsonable(o.params))


def outcome_to_pb(o: ActionOutcome) -> ev_pb.ActionOutcome:
    msg = ev_pb.ActionOutcome()
    _fill_outcome(msg, o)
    return msg


def _fill_evaluator_result(msg: ev_pb.EvaluatorResult, e: EvaluatorResult) -> None:
    msg.evaluator = e.evaluator
    msg.kind = e.kind
    msg.status = STATUS_TO_PB[e.status]
    if e.violations:
        msg.violations.extend(e.violations)
    if e.details:
        msg.details.update(_jsonable(e.details))
    for s in e.spans:
        msg.spans.add(start=s.start, end=s.end, label=s.label, score=s.score)
    msg.latency_ms = e.latency_ms
    msg.attempts = e.attempts
    msg.cached = e.cached
    if e.error:
        msg.error = e.error
    if e.error_type:
        msg.error_type = e.error_type
    if e.score is not None:
        msg.score = e.score
    if e.passed is not None:
        msg.passed = e.passed
    if e.provenance:
        msg.provenance.update(e.provenance)


def evaluator_result_to_pb(e: EvaluatorResult) -> ev_pb.EvaluatorResult:
    msg = ev_pb.EvaluatorResult()
    _fill_evaluator_result(msg, e)
    return msg


# A decision's rules mostly share their evaluators' results (one call, a copy per rule that
# differs at most in its status): the first copy is converted, the others copied from it in C.
_Shared = dict[tuple[Any, ...], list[tuple[EvaluatorResult, ev_pb.EvaluatorResult]]]


def _shared_key(e: EvaluatorResult) -> tuple[Any, ...]:
    return (e.evaluator, e.kind, e.identity, e.latency_ms, e.attempts, e.cached, e.score, e.passed, e.error)


def _fill_shared(msg: ev_pb.EvaluatorResult, e: EvaluatorResult, shared: _Shared) -> None:
    """``msg`` as :func:`_fill_evaluator_result` fills it, copied from an equal result's message
    of this decision (all but the status) when there is one."""
    seen = shared.setdefault(_shared_key(e), [])
    for other, done in seen:
        if (
            other.details == e.details
            and repr(other.details) == repr(e.details)  # 1 == True, but a Struct tells them apart
            and other.violations == e.violations
            and other.spans == e.spans
            and other.provenance == e.provenance
            and other.error_type == e.error_type
        ):
            msg.CopyFrom(done)
            msg.status = STATUS_TO_PB[e.status]
            return
    _fill_evaluator_result(msg, e)
    seen.append((e, msg))


def _fill_rule(msg: ev_pb.RuleResult, r: RuleResult, shared: _Shared | None = None) -> None:
    msg.rule = r.rule
    msg.status = STATUS_TO_PB[r.status]
    msg.passed = r.passed
    msg.action = ACTION_TO_PB[r.action] if r.action is not None else ev_pb.ACTION_UNSPECIFIED
    for e in r.evaluators:
        if shared is None:
            _fill_evaluator_result(msg.evaluators.add(), e)
        else:
            _fill_shared(msg.evaluators.add(), e, shared)
    msg.fallback_used = r.fallback_used
    msg.reason = r.reason
    msg.latency_ms = r.latency_ms
    if r.score is not None:
        msg.score = r.score
    if r.threshold is not None:
        msg.threshold = r.threshold
    if r.outcome is not None:
        _fill_outcome(msg.outcome, r.outcome)


def rule_to_pb(r: RuleResult) -> ev_pb.RuleResult:
    msg = ev_pb.RuleResult()
    _fill_rule(msg, r)
    return msg


def decision_to_pb(
    d: Decision,
    *,
    revision: int = 0,
    environment: str = "",
    review_ids: list[str] | None = None,
    request_id: str = "",
    stage: str = "",
    tool_name: str = "",
    tool_call_id: str = "",
) -> ev_pb.EvaluateResponse:
    """``stage``, ``tool_name``, ``tool_call_id``: what the decision judged (a tool stage's call)."""
    msg = ev_pb.EvaluateResponse(
        decision_id=d.decision_id,
        policy=d.policy,
        policy_version=d.policy_version,
        policy_revision=revision,
        environment=environment,
        passed=d.passed,
        action=ACTION_TO_PB[d.action],
        errored_rules=d.errored_rules,
        latency_ms=d.latency_ms,
        review_ids=review_ids or [],
        request_id=request_id,
        stage=stage,
        tool_name=tool_name,
        tool_call_id=tool_call_id,
    )
    shared: _Shared = {}
    for r in d.rules:
        _fill_rule(msg.rules.add(), r, shared)
    for o in d.outcomes:
        _fill_outcome(msg.outcomes.add(), o)
    if d.modified_response is not None:
        msg.modified_response = d.modified_response
    return msg


def _opt(msg: Any, name: str) -> Any:
    return getattr(msg, name) if msg.HasField(name) else None


def outcome_from_pb(o: ev_pb.ActionOutcome) -> ActionOutcome:
    return ActionOutcome(rule=o.rule, action=ACTION_FROM_PB[o.action], params=from_struct(o.params))


# Decisions read back from the wire are built with model_construct: every field comes from a
# typed protobuf field (valid UTF-8 strings, numbers, enums mapped above), so validating again
# would only cost the client ~20 pydantic validations per 10-rule decision.


def evaluator_result_from_pb(e: ev_pb.EvaluatorResult) -> EvaluatorResult:
    return EvaluatorResult.model_construct(
        evaluator=e.evaluator,
        kind=e.kind,
        status=STATUS_FROM_PB[e.status],
        score=_opt(e, "score"),
        passed=_opt(e, "passed"),
        violations=list(e.violations),
        details=from_struct(e.details),
        spans=[Span.model_construct(start=s.start, end=s.end, label=s.label, score=s.score) for s in e.spans],
        latency_ms=e.latency_ms,
        attempts=e.attempts,
        cached=e.cached,
        error=e.error or None,
        error_type=e.error_type or None,
        provenance=dict(e.provenance),
    )


def rule_from_pb(r: ev_pb.RuleResult) -> RuleResult:
    return RuleResult.model_construct(
        rule=r.rule,
        status=STATUS_FROM_PB[r.status],
        passed=r.passed,
        score=_opt(r, "score"),
        threshold=_opt(r, "threshold"),
        action=ACTION_FROM_PB[r.action] if r.action else None,
        evaluators=[evaluator_result_from_pb(e) for e in r.evaluators],
        fallback_used=r.fallback_used,
        reason=r.reason,
        latency_ms=r.latency_ms,
        outcome=outcome_from_pb(r.outcome) if r.HasField("outcome") else None,
    )


def decision_from_pb(msg: ev_pb.EvaluateResponse) -> RemoteDecision:
    return RemoteDecision.model_construct(
        policy=msg.policy,
        policy_version=msg.policy_version,
        passed=msg.passed,
        action=ACTION_FROM_PB[msg.action],
        rules=[rule_from_pb(r) for r in msg.rules],
        modified_response=_opt(msg, "modified_response"),
        outcomes=[outcome_from_pb(o) for o in msg.outcomes],
        errored_rules=list(msg.errored_rules),
        latency_ms=msg.latency_ms,
        decision_id=msg.decision_id,
        policy_revision=msg.policy_revision,
        environment=msg.environment,
        review_ids=list(msg.review_ids),
        request_id=msg.request_id,
        stage=msg.stage,
        tool_name=msg.tool_name,
        tool_call_id=msg.tool_call_id,
    )


def item_error_from_pb(err: ev_pb.ItemError, request_id: str) -> CrossAuditError:
    """A stream item's error, rebuilt by the one error codec (class, retryable flag, wire fields);
    the servicer encodes it with :func:`crossaudit.api.errors.item_fields`."""
    exc = from_item(err.code, err.message, err.retryable, err.error_type, err.detail)
    exc.request_id = request_id  # type: ignore[attr-defined]
    return exc


def stream_item_from_pb(item: ev_pb.EvaluateStreamResponse) -> RemoteDecision | CrossAuditError:
    """One EvaluateStream answer: its decision, or its own error (the stream goes on)."""
    if item.HasField("decision"):
        return decision_from_pb(item.decision)
    return item_error_from_pb(item.error, item.request_id)


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


def version_from_pb(m: pol_pb.PolicyVersion, content: str = "") -> PolicyVersionRecord:
    return PolicyVersionRecord(
        tenant="",
        name=m.name,
        version=m.version,
        declared_version=m.declared_version,
        digest=m.digest,
        description=m.description,
        content=content,
        created_at=seconds(m.created_at),
    )


def deployment_from_pb(m: pol_pb.Deployment) -> DeploymentRecord:
    return DeploymentRecord(
        tenant="", name=m.name, environment=m.environment, version=m.version, deployed_at=seconds(m.deployed_at)
    )


def summary_from_pb(m: pol_pb.PolicySummary) -> PolicySummaryRecord:
    return PolicySummaryRecord(m.name, m.latest_version, tuple(deployment_from_pb(d) for d in m.deployments))


def deploy_result_to_pb(r: DeployResult) -> pol_pb.DeployPolicyResponse:
    msg = pol_pb.DeployPolicyResponse(version=version_to_pb(r.version), created=r.created)
    if r.deployment is not None:
        msg.deployment.CopyFrom(deployment_to_pb(r.deployment))
    if r.candidate is not None:
        msg.candidate.CopyFrom(candidate_to_pb(r.candidate))
    return msg


def deploy_result_from_pb(m: pol_pb.DeployPolicyResponse) -> DeployResult:
    return DeployResult(
        version_from_pb(m.version),
        deployment_from_pb(m.deployment) if m.HasField("deployment") else None,
        m.created,
        candidate_from_pb(m.candidate) if m.HasField("candidate") else None,
    )


def candidate_to_pb(c: CandidateRecord) -> pol_pb.Candidate:
    msg = pol_pb.Candidate(
        id=c.id,
        name=c.name,
        environment=c.environment,
        mode=c.mode.value,
        version=c.version,
        active_version=c.active_version,
        share=c.share,
        canary_key=c.canary_key,
        notify_url=c.notify_url,
        state=c.state.value,
        started_at=timestamp(c.started_at),
        reason=c.reason,
        bounds={k: float(v) for k, v in c.bounds.items()},
    )
    if c.ended_at is not None:
        msg.ended_at.CopyFrom(timestamp(c.ended_at))
    return msg


def candidate_from_pb(m: pol_pb.Candidate, totals: pol_pb.ShadowReportResponse | None = None) -> CandidateRecord:
    """``totals``: a report's shadow totals, which the record carries."""
    counts = {}
    if totals is not None:
        names = ("evaluated", "agreed", "pass_to_fail", "fail_to_pass", "action_changes", "errors", "dropped")
        counts = {n: int(getattr(totals, n)) for n in (*names, "diffs_stored")}
    return CandidateRecord(
        id=m.id,
        tenant="",
        name=m.name,
        environment=m.environment,
        mode=CandidateMode(m.mode),
        version=m.version,
        active_version=m.active_version,
        share=m.share,
        canary_key=m.canary_key,
        notify_url=m.notify_url,
        bounds=dict(m.bounds),
        state=CandidateState(m.state),
        started_at=seconds(m.started_at),
        ended_at=from_timestamp(m.ended_at, m.HasField("ended_at")),
        reason=m.reason,
        **counts,
    )


def promote_to_pb(r: PromoteResult) -> pol_pb.PromotePolicyResponse:
    return pol_pb.PromotePolicyResponse(
        deployment=deployment_to_pb(r.deployment), candidate=candidate_to_pb(r.candidate)
    )


def promote_from_pb(m: pol_pb.PromotePolicyResponse) -> PromoteResult:
    return PromoteResult(deployment_from_pb(m.deployment), candidate_from_pb(m.candidate))


def _rule_diff_to_pb(r: dict[str, Any]) -> pol_pb.RuleDiff:
    return pol_pb.RuleDiff(
        rule=str(r.get("rule", "")),
        live_status=str(r.get("live_status", "")),
        live_score=r.get("live_score"),
        live_action=str(r.get("live_action", "")),
        candidate_status=str(r.get("candidate_status", "")),
        candidate_score=r.get("candidate_score"),
        candidate_action=str(r.get("candidate_action", "")),
        flipped=bool(r.get("flipped")),
    )


def _rule_diff_from_pb(m: pol_pb.RuleDiff) -> dict[str, Any]:
    return {
        "rule": m.rule,
        "live_status": m.live_status,
        "live_score": m.live_score if m.HasField("live_score") else None,
        "live_action": m.live_action,
        "candidate_status": m.candidate_status,
        "candidate_score": m.candidate_score if m.HasField("candidate_score") else None,
        "candidate_action": m.candidate_action,
        "flipped": m.flipped,
    }


def _counts_to_pb(c: RevisionCounts) -> pol_pb.RevisionCounts:
    return pol_pb.RevisionCounts(decisions=c.decisions, errored=c.errored, blocked=c.blocked)


def shadow_report_to_pb(r: ShadowReport) -> pol_pb.ShadowReportResponse:
    c = r.candidate
    return pol_pb.ShadowReportResponse(
        candidate=candidate_to_pb(c),
        evaluated=c.evaluated,
        agreed=c.agreed,
        pass_to_fail=c.pass_to_fail,
        fail_to_pass=c.fail_to_pass,
        action_changes=c.action_changes,
        errors=c.errors,
        dropped=c.dropped,
        diffs_stored=c.diffs_stored,
        rule_flips=r.rule_flips,
        samples=[
            pol_pb.ShadowDiff(
                decision_id=d.decision_id,
                created_at=timestamp(d.created_at),
                live_passed=d.live_passed,
                live_action=d.live_action,
                candidate_passed=d.candidate_passed,
                candidate_action=d.candidate_action,
                error=d.error,
                rules=[_rule_diff_to_pb(x) for x in d.rules],
            )
            for d in r.samples
        ],
        history=[pol_pb.HistoryEntry(version=h.version, kind=h.kind, at=timestamp(h.at)) for h in r.history],
        canary=_counts_to_pb(r.canary),
        active=_counts_to_pb(r.active),
    )


def shadow_report_from_pb(m: pol_pb.ShadowReportResponse) -> ShadowReport:
    cand = candidate_from_pb(m.candidate, m)
    samples = tuple(
        ShadowDiffRecord(
            tenant="",
            candidate_id=cand.id,
            decision_id=d.decision_id,
            created_at=seconds(d.created_at),
            live_passed=d.live_passed,
            live_action=d.live_action,
            candidate_passed=d.candidate_passed,
            candidate_action=d.candidate_action,
            rules=[_rule_diff_from_pb(x) for x in d.rules],
            error=d.error,
            changed=True,
        )
        for d in m.samples
    )
    history = tuple(HistoryRecord(cand.name, cand.environment, h.version, h.kind, seconds(h.at)) for h in m.history)
    return ShadowReport(
        candidate=cand,
        rule_flips=dict(m.rule_flips),
        samples=samples,
        history=history,
        canary=RevisionCounts(m.canary.decisions, m.canary.errored, m.canary.blocked),
        active=RevisionCounts(m.active.decisions, m.active.errored, m.active.blocked),
    )


def policy_info_to_pb(p: PolicyInfo) -> pol_pb.GetPolicyResponse:
    return pol_pb.GetPolicyResponse(
        version=version_to_pb(p.version), content=p.content, deployments=[deployment_to_pb(d) for d in p.deployments]
    )


def policy_info_from_pb(m: pol_pb.GetPolicyResponse) -> PolicyInfo:
    return PolicyInfo(version_from_pb(m.version, m.content), tuple(deployment_from_pb(d) for d in m.deployments))


def rollback_to_pb(r: RollbackResult) -> pol_pb.RollbackPolicyResponse:
    return pol_pb.RollbackPolicyResponse(deployment=deployment_to_pb(r.deployment), previous_version=r.previous_version)


def rollback_from_pb(m: pol_pb.RollbackPolicyResponse) -> RollbackResult:
    return RollbackResult(deployment_from_pb(m.deployment), m.previous_version)


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


def _evaluator_fields(m: evr_pb.Evaluator) -> dict[str, Any]:
    return {
        "id": m.id,
        "tenant": "",
        "name": m.name,
        "version": m.version,
        "language": m.language,
        "dependencies": tuple(m.dependencies),
        "digest": m.digest,
        "code": m.code,
        "description": m.description,
        "created_at": seconds(m.created_at),
    }


def evaluator_from_pb(m: evr_pb.Evaluator) -> EvaluatorRecord:
    return EvaluatorRecord(**_evaluator_fields(m))


def uploaded_to_pb(e: EvaluatorRecord, created: bool) -> evr_pb.UploadEvaluatorEvent:
    """The last event of an upload: the stored evaluator (without its code)."""
    return evr_pb.UploadEvaluatorEvent(evaluator=evaluator_to_pb(e), created=created)


def uploaded_from_pb(m: evr_pb.UploadEvaluatorEvent) -> UploadedEvaluator:
    return UploadedEvaluator(**_evaluator_fields(m.evaluator), created=m.created)


def review_to_pb(r: ReviewRecord, now: float | None = None) -> rev_pb.Review:
    at = timing(r.kind, r.state, r.params, time.time() if now is None else now)
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
        escalated=at.escalated,
        overdue=at.overdue,
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
        truncated=a.truncated,
    )
    if a.prompt is not None:
        msg.prompt = a.prompt
    if a.response is not None:
        msg.response = a.response
    if a.inputs_retained_until is not None:
        msg.inputs_retained_until.CopyFrom(timestamp(a.inputs_retained_until))
    if a.inputs_erased_at is not None:
        msg.inputs_erased_at.CopyFrom(timestamp(a.inputs_erased_at))
    if a.receipt:
        msg.receipt.CopyFrom(to_struct(a.receipt))
    if a.log_seq is not None:
        msg.log_seq = a.log_seq
    msg.leaf_hash = a.leaf_hash or ""
    msg.trace_id = a.trace_id or ""
    msg.span_id = a.span_id or ""
    return msg


def label_to_pb(row: LabelledDecision, msg: audit_pb.LabelledDecision) -> None:
    msg.source = row.source
    msg.id = row.id
    msg.decision_id = row.decision_id
    msg.rule = row.rule
    msg.label = row.label
    msg.should_pass = row.should_pass
    msg.labelled_at.CopyFrom(timestamp(row.labelled_at))
    msg.decided_at.CopyFrom(timestamp(row.decided_at))
    msg.scores.update(row.scores)
    msg.thresholds.update(row.thresholds)
    msg.recorded.update(row.recorded)
    if row.context is not None:  # the retained inputs, whole
        msg.retained = True
        msg.prompt = row.prompt or ""
        msg.response = row.response or ""
        msg.context.CopyFrom(to_struct(row.context))


def label_page_to_pb(page: LabelPage) -> audit_pb.ListLabelsResponse:
    msg = audit_pb.ListLabelsResponse(next_page_token=page.next_page_token)
    for row in page.labels:
        label_to_pb(row, msg.labels.add())
    return msg


def label_from_pb(m: audit_pb.LabelledDecision) -> LabelledDecision:
    return LabelledDecision(
        source=m.source,
        id=m.id,
        decision_id=m.decision_id,
        rule=m.rule,
        label=m.label,
        should_pass=m.should_pass,
        labelled_at=seconds(m.labelled_at),
        decided_at=seconds(m.decided_at),
        scores=dict(m.scores),
        thresholds=dict(m.thresholds),
        recorded=dict(m.recorded),
        prompt=m.prompt if m.retained else None,
        response=m.response if m.retained else None,
        context=from_struct(m.context, what="context") if m.retained else None,
    )


def label_page_from_pb(m: audit_pb.ListLabelsResponse) -> LabelPage:
    return LabelPage([label_from_pb(x) for x in m.labels], m.next_page_token)


def audit_from_pb(m: audit_pb.DecisionRecord) -> AuditRecord:
    return AuditRecord(
        decision_id=m.decision_id,
        tenant="",
        policy=m.policy,
        policy_revision=m.policy_revision,
        policy_version=m.policy_version,
        policy_digest=m.policy_digest,
        environment=m.environment,
        passed=m.passed,
        action=m.action,
        rules=[from_struct(r) for r in m.rules],
        errored_rules=list(m.errored_rules),
        latency_ms=m.latency_ms,
        prompt_sha256=m.prompt_sha256,
        response_sha256=m.response_sha256,
        context_sha256=m.context_sha256,
        created_at=seconds(m.created_at),
        request_id=m.request_id,
        prompt=_opt(m, "prompt"),
        response=_opt(m, "response"),
        modified_response_sha256=m.modified_response_sha256 or None,
        truncated=m.truncated,
        inputs_retained_until=seconds(m.inputs_retained_until) if m.HasField("inputs_retained_until") else None,
        inputs_erased_at=seconds(m.inputs_erased_at) if m.HasField("inputs_erased_at") else None,
        receipt=from_struct(m.receipt, what="receipt") if m.HasField("receipt") else {},
        log_seq=m.log_seq if m.HasField("log_seq") else None,
        leaf_hash=m.leaf_hash or None,
        trace_id=m.trace_id or None,
        span_id=m.span_id or None,
    )


def erasure_to_pb(e: ErasureRecord) -> audit_pb.Erasure:
    return audit_pb.Erasure(
        id=e.id,
        selector_kind=e.selector_kind,
        selector_digest=e.selector_digest,
        decisions=e.decisions,
        created_at=timestamp(e.created_at),
        actor=e.actor,
    )


def erasure_from_pb(m: audit_pb.Erasure) -> ErasureRecord:
    return ErasureRecord(
        id=m.id,
        tenant="",
        selector_kind=m.selector_kind,
        selector_digest=m.selector_digest,
        decisions=m.decisions,
        created_at=seconds(m.created_at),
        actor=m.actor,
    )


def review_from_pb(m: rev_pb.Review) -> ReviewInfo:
    """The review record with the flags the server computed when it read it."""
    return ReviewInfo(
        id=m.id,
        tenant="",
        decision_id=m.decision_id,
        policy=m.policy,
        policy_revision=m.policy_revision,
        environment=m.environment,
        rule=m.rule,
        kind=REVIEW_KIND_FROM_PB.get(m.kind, ReviewKind.FLAG),
        state=REVIEW_STATE_FROM_PB.get(m.state, ReviewState.OPEN),
        params=from_struct(m.params),
        created_at=seconds(m.created_at),
        resolved_at=from_timestamp(m.resolved_at, m.HasField("resolved_at")),
        reviewer=m.reviewer,
        note=m.note,
        escalated=m.escalated,
        overdue=m.overdue,
    )


# --- webhook deliveries -----------------------------------------------------------------

DELIVERY_STATE_TO_PB = {s: dlv_pb.DeliveryState.Value(f"DELIVERY_STATE_{s.name}") for s in OutboxState}
DELIVERY_STATE_FROM_PB = {v: k for k, v in DELIVERY_STATE_TO_PB.items()}


def delivery_to_pb(m: OutboxRecord) -> dlv_pb.Delivery:
    msg = dlv_pb.Delivery(
        id=m.id,
        decision_id=m.decision_id,
        rule=m.rule,
        url=str(m.payload.get("url", "")),
        method=str(m.payload.get("method", "")),
        state=DELIVERY_STATE_TO_PB[m.state],
        attempts=m.attempts,
        last_error=m.last_error,
        last_status=m.last_status,
        created_at=timestamp(m.created_at),
    )
    if m.state is OutboxState.PENDING:
        msg.next_attempt_at.CopyFrom(timestamp(m.next_attempt_at))
    if m.delivered_at is not None:
        msg.delivered_at.CopyFrom(timestamp(m.delivered_at))
    return msg


def delivery_from_pb(m: dlv_pb.Delivery) -> OutboxRecord:
    """The delivery as the tenant sees it (its body and headers stay on the server)."""
    return OutboxRecord(
        id=m.id,
        tenant="",
        kind="webhook",
        decision_id=m.decision_id,
        rule=m.rule,
        payload={"url": m.url, "method": m.method},
        state=DELIVERY_STATE_FROM_PB.get(m.state, OutboxState.PENDING),
        attempts=m.attempts,
        next_attempt_at=seconds(m.next_attempt_at) if m.HasField("next_attempt_at") else 0.0,
        last_error=m.last_error,
        last_status=m.last_status,
        created_at=seconds(m.created_at),
        delivered_at=from_timestamp(m.delivered_at, m.HasField("delivered_at")),
    )


# --- server info ------------------------------------------------------------------------


def server_info_to_pb(i: ServerInfo) -> info_pb.ServerInfo:
    return info_pb.ServerInfo(
        version=i.version,
        tenant=i.tenant,
        multi_tenant=i.multi_tenant,
        sandbox_backend=i.sandbox_backend,
        isolation=i.isolation,
        weaker_isolation=i.weaker_isolation,
    )


def server_info_from_pb(m: info_pb.ServerInfo) -> ServerInfo:
    return ServerInfo(
        version=m.version,
        tenant=m.tenant,
        multi_tenant=m.multi_tenant,
        sandbox_backend=m.sandbox_backend,
        isolation=m.isolation,
        weaker_isolation=m.weaker_isolation,
    )


def _samples_to_pb(b: Bucket) -> rpl_pb.ReplaySamples:
    return rpl_pb.ReplaySamples(count=b.count, decision_ids=b.samples)


def _samples_from_pb(m: rpl_pb.ReplaySamples) -> Bucket:
    return Bucket(count=m.count, samples=list(m.decision_ids))


def replay_progress_to_pb(p: ReplayProgress) -> rpl_pb.ReplayEvent:
    return rpl_pb.ReplayEvent(
        progress=rpl_pb.ReplayProgress(
            read=p.read, replayed=p.replayed, not_replayable=p.not_replayable, limit=p.limit, message=p.message
        )
    )


def replay_progress_from_pb(m: rpl_pb.ReplayProgress) -> ReplayProgress:
    return ReplayProgress(
        read=m.read, replayed=m.replayed, not_replayable=m.not_replayable, limit=m.limit, message=m.message
    )


def replay_report_to_pb(r: ReplayReport) -> rpl_pb.ReplayEvent:
    msg = rpl_pb.ReplayReport(
        policy=r.policy,
        candidate=r.candidate,
        environment=r.environment,
        since=r.since,
        until=r.until,
        read=r.read,
        replayed=r.replayed,
        unchanged=r.unchanged,
        changed=_samples_to_pb(r.changed),
        pass_to_fail=_samples_to_pb(r.pass_to_fail),
        fail_to_pass=_samples_to_pb(r.fail_to_pass),
        more=r.more,
        evaluator_runs=r.evaluator_runs,
        hint=r.hint,
    )
    for key, b in r.action_changes.items():
        msg.action_changes[key].CopyFrom(_samples_to_pb(b))
    for key, b in r.not_replayable.items():
        msg.not_replayable[key].CopyFrom(_samples_to_pb(b))
    for d in r.sorted_rules():
        msg.rules.append(
            rpl_pb.ReplayRuleDiff(
                rule=d.rule,
                change=d.change,
                compared=d.compared,
                pass_to_fail=_samples_to_pb(d.pass_to_fail),
                fail_to_pass=_samples_to_pb(d.fail_to_pass),
                score_shifts=_samples_to_pb(d.score_shifts),
                mean_shift=d.mean_shift,
                max_shift=d.max_shift,
            )
        )
    if r.estimate is not None:
        e = r.estimate
        msg.estimate.CopyFrom(
            rpl_pb.LLMEstimate(
                calls=e.calls,
                decisions=e.decisions,
                prompt_tokens=e.prompt_tokens,
                completion_tokens=e.completion_tokens,
                cost_usd=e.cost_usd,
                unpriced_models=sorted(e.unpriced_models),
            )
        )
    return rpl_pb.ReplayEvent(report=msg)


def replay_report_from_pb(m: rpl_pb.ReplayReport) -> ReplayReport:
    report = ReplayReport(
        policy=m.policy,
        candidate=m.candidate,
        environment=m.environment,
        since=m.since if m.HasField("since") else None,
        until=m.until if m.HasField("until") else None,
        read=m.read,
        replayed=m.replayed,
        unchanged=m.unchanged,
        changed=_samples_from_pb(m.changed),
        pass_to_fail=_samples_from_pb(m.pass_to_fail),
        fail_to_pass=_samples_from_pb(m.fail_to_pass),
        action_changes={k: _samples_from_pb(v) for k, v in m.action_changes.items()},
        not_replayable={k: _samples_from_pb(v) for k, v in m.not_replayable.items()},
        more=m.more,
        evaluator_runs=m.evaluator_runs,
        hint=m.hint,
    )
    for d in m.rules:
        diff = RuleDiff(
            rule=d.rule,
            change=d.change,
            compared=d.compared,
            pass_to_fail=_samples_from_pb(d.pass_to_fail),
            fail_to_pass=_samples_from_pb(d.fail_to_pass),
            score_shifts=_samples_from_pb(d.score_shifts),
            max_shift=d.max_shift,
        )
        diff.total_shift = d.mean_shift * diff.score_shifts.count
        report.rules[d.rule] = diff
    if m.HasField("estimate"):
        e = m.estimate
        report.estimate = LLMEstimate(
            calls=e.calls,
            decisions=e.decisions,
            prompt_tokens=e.prompt_tokens,
            completion_tokens=e.completion_tokens,
            cost_usd=e.cost_usd,
            unpriced_models=list(e.unpriced_models),
        )
    return report


# --- the decision log (docs/evidence.md) ------------------------------------------------------


def log_key_to_pb(log: str, key: PublicKey | None, trusted: list[PublicKey]) -> audit_pb.LogKey:
    msg = audit_pb.LogKey(log=log, trusted_vkeys=[k.vkey() for k in trusted], signing=key is not None)
    if key is not None:
        msg.key_id, msg.vkey, msg.pem = key.key_id, key.vkey(), key.pem()
    return msg


def log_chunk_to_pb(c: LogChunk) -> audit_pb.LogChunk:
    msg = audit_pb.LogChunk(
        log=c.log,
        start=c.start,
        frontier=c.frontier,
        head=c.head,
        checkpoints=c.checkpoints,
        covering_checkpoint=c.covering,
        covering_proof=[audit_pb.LogNode(lo=lo, hi=hi, hash=h) for lo, hi, h in c.covering_proof],
        last=c.last,
    )
    for entry, rules, receipt in c.entries:
        e = msg.entries.add(
            decision_id=entry.decision_id,
            stored_leaf=entry.stored_leaf or "",
            document=entry.document,
            rules=rules,
            receipt=receipt,
        )
        if entry.seq is not None:
            e.seq = entry.seq
    return msg


def log_chunk_from_pb(m: audit_pb.LogChunk) -> LogChunk:
    return LogChunk(
        entries=[
            (
                Entry(e.decision_id, e.seq if e.HasField("seq") else None, e.stored_leaf or None, e.document),
                e.rules,
                e.receipt,
            )
            for e in m.entries
        ],
        log=m.log,
        start=m.start,
        frontier=list(m.frontier),
        head=m.head,
        checkpoints=list(m.checkpoints),
        covering=m.covering_checkpoint,
        covering_proof=[(n.lo, n.hi, n.hash) for n in m.covering_proof],
        last=m.last,
    )


def inclusion_to_pb(p: InclusionProof) -> audit_pb.InclusionProof:
    return audit_pb.InclusionProof(
        decision_id=p.decision_id,
        seq=p.seq,
        document=p.document,
        leaf_hash=p.leaf_hash,
        tree_size=p.tree_size,
        path=p.path,
        checkpoint=p.checkpoint,
    )


def inclusion_from_pb(m: audit_pb.InclusionProof) -> InclusionProof:
    return InclusionProof(m.decision_id, m.seq, m.document, m.leaf_hash, m.tree_size, list(m.path), m.checkpoint)


def consistency_to_pb(p: ConsistencyProof) -> audit_pb.ConsistencyProof:
    return audit_pb.ConsistencyProof(old_checkpoint=p.old_checkpoint, new_checkpoint=p.new_checkpoint, path=p.path)


def consistency_from_pb(m: audit_pb.ConsistencyProof) -> ConsistencyProof:
    return ConsistencyProof(m.old_checkpoint, m.new_checkpoint, list(m.path))


def receipt_to_pb(a: AuditRecord, log: str) -> audit_pb.Receipt:
    msg = audit_pb.Receipt(
        decision_id=a.decision_id, receipt=to_struct(a.receipt), leaf_hash=a.leaf_hash or "", log=log
    )
    if a.log_seq is not None:
        msg.log_seq = a.log_seq
    return msg


def receipt_from_pb(m: audit_pb.Receipt) -> dict[str, Any]:
    return {
        "decision_id": m.decision_id,
        "log": m.log,
        "log_seq": m.log_seq if m.HasField("log_seq") else None,
        "leaf_hash": m.leaf_hash or None,
        "receipt": from_struct(m.receipt, what="receipt"),
    }
