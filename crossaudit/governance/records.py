"""What decisions leave behind: audit records, review items, feedback.

The builders turn a decision into the records written with it (atomically, before the answer
is sent); :class:`Records` reads them back and takes people's feedback and resolutions.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from crossaudit.api.records import AuditRecord, FeedbackRecord, PolicyVersionRecord, ReviewRecord
from crossaudit.evidence.leaf import receipt_text
from crossaudit.governance.labels import recorded_rules
from crossaudit.kernel.canonical import sha256_json, sha256_text
from crossaudit.kernel.errors import InvalidInputError, NotFoundError, PermissionDeniedError
from crossaudit.kernel.results import Decision, EvaluatorResult, RuleResult, Status
from crossaudit.service import inputs
from crossaudit.service.config import ServiceLimits
from crossaudit.service.principals import LIST_REVIEWS, RESOLVE_REVIEW, REVIEWER_ROLE_PARAM, Principal, Role
from crossaudit.service.tenants import Tenants
from crossaudit.store.base import NUL_REPLACEMENT, Store, audit_rules_json, audit_size
from orchestrator import reviews
from orchestrator.engine.engine import NO_VERDICT_HEADS
from orchestrator.reviews import ReviewState


def review_records(tenant: str, d: Decision, revision: int, env: str, now: float) -> list[ReviewRecord]:
    """The open review items ``d`` creates (which rules ask for one: ``orchestrator.reviews``)."""
    return [
        ReviewRecord(
            id=str(uuid.uuid4()),
            tenant=tenant,
            decision_id=d.decision_id,
            policy=d.policy,
            policy_revision=revision,
            environment=env,
            rule=item.rule,
            kind=item.kind,
            state=ReviewState.OPEN,
            params=item.params,
            created_at=now,
        )
        for item in reviews.items(d)
    ]


RECEIPT_FORMAT = "crossaudit.receipt/v1"
EMPTY_CONTEXT_SHA256 = sha256_json({})  # most decisions carry no context: its digest once


def engine_version() -> str:
    """The CrossAudit version that decided (the installed distribution's)."""
    return _ENGINE_VERSION


def _installed_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("crossaudit")
    except PackageNotFoundError:  # a source tree that is not installed
        return "unknown"


_ENGINE_VERSION = _installed_version()


TOOL_STAGES = ("tool_call", "tool_result")


def judged_tool(stage: str, context: Mapping[str, Any] | None) -> dict[str, str]:
    """At a tool stage, the tool call a decision judged: the context's ``tool.name`` and
    ``tool.call_id`` (checked by the engine: strings within engine_limits.max_tool_name_chars)."""
    tool = context.get("tool") if stage in TOOL_STAGES and isinstance(context, Mapping) else None
    if not isinstance(tool, Mapping):
        return {}
    return {k: tool[k] for k in ("name", "call_id") if isinstance(tool.get(k), str) and tool[k]}


def decision_subject(stage: str, context: Mapping[str, Any] | None, response: str) -> dict[str, Any] | None:
    """What a tool stage's decision judged, for its receipt (docs/agents.md): the stage, the tool's
    name and call id and, at tool_call, the digest of the arguments as sent (the response's: the
    arguments' text itself is kept only where the policy keeps raw text). None at other stages."""
    if stage not in TOOL_STAGES:
        return None
    tool: dict[str, Any] = judged_tool(stage, context)
    if stage == "tool_call":
        tool["arguments_sha256"] = sha256_text(response)
    return {"stage": stage, "tool": tool}


def decision_receipt(
    d: Decision, rec: PolicyVersionRecord, env: str, subject: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """What decided ``d``: the policy version (name, declared version, revision, digest), the
    engine, and per rule each evaluator's result identity and provenance (docs/evidence.md);
    ``subject``: what a tool stage's decision judged (:func:`decision_subject`), else absent."""
    evaluators = []
    for r in d.rules:
        for e in r.evaluators:
            evaluators.append(
                {
                    "rule": r.rule,
                    "evaluator": e.evaluator,
                    "kind": e.kind,
                    "status": e.status.value,
                    "cached": e.cached,
                    "identity": e.identity,
                    "provenance": dict(e.provenance),
                }
            )
    receipt: dict[str, Any] = {
        "format": RECEIPT_FORMAT,
        "engine": {"name": "crossaudit", "version": _ENGINE_VERSION},
        "policy": {
            "name": d.policy,
            "version": d.policy_version,
            "revision": rec.version,
            "digest": rec.digest,
            "environment": env,
        },
        "evaluators": evaluators,
    }
    if subject is not None:
        receipt["subject"] = dict(subject)
    return receipt


def receipt_json(receipt: Mapping[str, Any]) -> str:
    """A receipt built by :func:`decision_receipt` as the store writes it, byte for byte
    ``crossaudit.evidence.leaf.receipt_text`` (JSON, sorted keys, no spaces, ASCII), by orjson: its
    sorted compact output is the same text for a document of strings, integers, booleans and
    nulls, which is all a receipt holds (no floats, by its builder's types), whenever it is ASCII
    without DEL; otherwise (a name json.dumps escapes) the canonical encoder writes it."""
    try:
        out = orjson.dumps(receipt, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # not a type orjson writes as json.dumps does (default=str): the canonical encoder
        return receipt_text(receipt)
    return out.decode() if out.isascii() and b"\x7f" not in out else receipt_text(receipt)


# A Python exception's class at the start of an evaluator's message ("ValueError: ...", custom
# code's "evaluator raised ValueError: ..."): a name that ends like an exception class, so no word
# of the request is taken for one.
_EXCEPTION_CLASS = re.compile(
    r"(?:evaluator raised )?([A-Za-z_][A-Za-z0-9_.]{0,99}(?:Error|Exception|Warning|Exit|Interrupt|Timeout)): "
)
ERROR_TEXT_NOT_KEPT = "error text not kept"


def error_digest(e: EvaluatorResult) -> str:
    """What an audit record keeps of an evaluator's error message, which may quote the request
    (custom code's ``int(prompt)`` fails with the prompt in it): the error's class (the Python
    exception's at the start of the message, else the CrossAudit error's) and the message's
    SHA-256, so whoever holds the message (the caller was answered with it) can match it."""
    message = e.error or ""
    found = _EXCEPTION_CLASS.match(message)
    cls = e.error_type or "error"
    if found and found.group(1) != cls:  # both: what CrossAudit saw, then what the code raised
        cls = f"{cls} {found.group(1)}"
    return f"{cls} ({ERROR_TEXT_NOT_KEPT}; sha256 {sha256_text(message)})"


NO_VERDICT = (Status.ERROR, Status.TIMEOUT)
# What a record keeps of a rule's reason the engine would not have written: a reason with a
# verdict quotes no evaluator's message (only how many gave none), so one that does is not kept.
REASON_NOT_KEPT = "reason not kept: it quoted an evaluator's error"


def _errors_kept(evaluators: list[EvaluatorResult]) -> str:
    return "; ".join(f"{e.evaluator}: {error_digest(e)}" for e in evaluators)


def recorded_reason(r: RuleResult) -> str:
    """``r.reason`` as the audit record keeps it, never with an evaluator's error message (the
    answer to the caller keeps the message; the record never holds it, so no erasure has to reach
    into the rules the log's leaf commits to: docs/retention.md).

    A rule with no verdict (the engine's ``no verdict (fail-closed): name: message; ...``) is
    recorded from its parts, not by editing that text, which holds the messages (a message may
    quote another's, or the names, or the separators): the head the engine wrote, matched whole
    among the ones it writes (``NO_VERDICT_HEADS``: policy values), then for every evaluator that
    gave no verdict its name and :func:`error_digest`. A reason with a verdict is kept as it is,
    unless an error message is found in it (the engine writes none there): then
    :data:`REASON_NOT_KEPT` and the digests."""
    failed = [e for e in r.evaluators if e.status in NO_VERDICT]
    if r.status in NO_VERDICT:
        head = max((h for h in NO_VERDICT_HEADS if r.reason.startswith(h)), key=len, default="no verdict: ")
        return head + _errors_kept(failed)
    if any(e.error and e.error in r.reason for e in r.evaluators):
        quoted = [e for e in r.evaluators if e.error or e.status in NO_VERDICT]
        return f"{REASON_NOT_KEPT}; {_errors_kept(quoted)}"
    return r.reason


def audit_record(
    tenant: str,
    d: Decision,
    rec: PolicyVersionRecord,
    env: str,
    prompt: str,
    response: str,
    context: Mapping[str, Any] | None,
    *,
    raw: bool,
    request_id: str,
    now: float,
    stage: str = "",
) -> AuditRecord:
    """The audit record of ``d``: hashes of the texts, and the texts themselves only when ``raw``;
    at a tool stage its receipt names the tool call judged (:func:`decision_subject`)."""
    rules = []
    for r in d.rules:
        rules.append(
            {
                "rule": r.rule,
                "status": r.status.value,
                "passed": r.passed,
                "score": r.score,
                "threshold": r.threshold,
                "action": r.action.value if r.action else None,
                "latency_ms": round(r.latency_ms, 3),
                "fallback_used": r.fallback_used,
                "reason": recorded_reason(r),
                "evaluators": [
                    {
                        "evaluator": e.evaluator,
                        "kind": e.kind,
                        "status": e.status.value,
                        "score": e.score,
                        "latency_ms": round(e.latency_ms, 3),
                        "attempts": e.attempts,
                        "cached": e.cached,
                        "error_type": e.error_type,
                        "violations": list(e.violations) if raw else len(e.violations),
                    }
                    for e in r.evaluators
                ],
            }
        )
    return AuditRecord(
        decision_id=d.decision_id,
        tenant=tenant,
        policy=d.policy,
        policy_revision=rec.version,
        policy_version=d.policy_version,
        policy_digest=rec.digest,
        environment=env,
        passed=d.passed,
        action=d.action.value,
        rules=rules,
        errored_rules=list(d.errored_rules),
        latency_ms=d.latency_ms,
        prompt_sha256=sha256_text(prompt),
        response_sha256=sha256_text(response),
        context_sha256=sha256_json(dict(context)) if context else EMPTY_CONTEXT_SHA256,
        created_at=now,
        request_id=request_id,
        prompt=prompt.replace("\0", NUL_REPLACEMENT) if raw else None,  # measured as stored (PostgreSQL)
        response=response.replace("\0", NUL_REPLACEMENT) if raw else None,
        modified_response_sha256=sha256_text(d.modified_response) if d.modified_response is not None else None,
        receipt=decision_receipt(d, rec, env, decision_subject(stage, context, response)),
    )


AUDIT_DECISION_KEY = "limits.max_audit_bytes_per_decision"
_encode_string = json.encoder.encode_basestring_ascii  # type: ignore[attr-defined]  # json.dumps' own
REASON_CHARS = 256  # a rule's reason kept by a cut-down record


def _rules(rec: AuditRecord, rule: Callable[[dict[str, Any]], dict[str, Any]]) -> list[dict[str, Any]]:
    return [rule(r) for r in rec.rules]


def _no_violations(r: dict[str, Any]) -> dict[str, Any]:
    evs = [
        {**e, "violations": len(e["violations"])} if isinstance(e.get("violations"), list) else e
        for e in r.get("evaluators", [])
    ]
    return {**r, "evaluators": evs}


def _short_reason(r: dict[str, Any]) -> dict[str, Any]:
    reason = r.get("reason")
    return {**r, "reason": reason[:REASON_CHARS]} if isinstance(reason, str) else r


def _evaluator_count(r: dict[str, Any]) -> dict[str, Any]:
    evs = r.get("evaluators")
    return {**r, "evaluators": len(evs)} if isinstance(evs, list) else r


def _verdict_only(r: dict[str, Any]) -> dict[str, Any]:
    return {k: r.get(k) for k in ("rule", "status", "passed", "action")}


# What a record over the per-decision cap loses, in order, until it fits: the bulk first, the
# verdict never (passed, action and errored rules stay whole, so the record agrees with the answer).
_CUTS: tuple[tuple[str, Callable[[AuditRecord], AuditRecord]], ...] = (
    ("violations", lambda a: dataclasses.replace(a, rules=_rules(a, _no_violations))),
    ("prompt and response text", lambda a: dataclasses.replace(a, prompt=None, response=None)),
    ("rule reasons", lambda a: dataclasses.replace(a, rules=_rules(a, _short_reason))),
    ("evaluator results", lambda a: dataclasses.replace(a, rules=_rules(a, _evaluator_count))),
    ("rule details", lambda a: dataclasses.replace(a, rules=_rules(a, _verdict_only))),
    ("rules", lambda a: dataclasses.replace(a, rules=[])),
)


def _violations_json_bytes(rec: AuditRecord) -> int | None:
    """What the raw violations add to :func:`audit_rules_json` of ``rec`` over their counts
    (``_no_violations``), exactly, one string at a time; None when there are none to measure."""
    extra, found = 0, False
    for r in rec.rules:
        for e in r.get("evaluators", ()) if isinstance(r.get("evaluators"), list) else ():
            vs = e.get("violations") if isinstance(e, dict) else None
            if not isinstance(vs, list):
                continue
            if not all(isinstance(v, str) for v in vs):
                return None
            found = True
            listed = 2 + sum(len(_encode_string(v)) for v in vs) + 2 * max(0, len(vs) - 1)  # [a, b]
            extra += listed - len(str(len(vs)))
    return extra if found else None


def fit_audit(rec: AuditRecord, cap: int, receipt: str | None = None) -> tuple[AuditRecord, int, str]:
    """``rec``, its size and its rules encoded, when it fits ``cap`` bytes; otherwise the record
    cut down by :data:`_CUTS` until it does (or nothing more can go), with ``truncated`` saying
    which setting cut what from how large. An answered decision's record is never dropped. The
    rules are encoded once, here, and written as they are (``Store.record_decision(rules_json=)``).
    ``receipt``: the receipt's text when the caller has it (no cut changes the receipt)."""
    if receipt is None:
        receipt = receipt_text(rec.receipt)
    bulk = _violations_json_bytes(rec)
    if bulk is None or bulk <= cap:  # small enough to encode whole: it is written as it is if it fits
        rules_json = audit_rules_json(rec)
        size = audit_size(rec, rules_json, receipt)
        if size <= cap:
            return rec, size, rules_json
    else:  # measured without encoding the bulk (megabytes would hold the interpreter lock for its length)
        rec = _CUTS[0][1](rec)
        size = audit_size(rec, None, receipt) + bulk
    before, cut = size, []
    for i, (name, step) in enumerate(_CUTS):
        if not (i == 0 and bulk is not None and bulk > cap):  # that cut is made already
            rec = step(rec)
        cut.append(name)
        # the note saying what went is part of the record: it is measured with it
        note = f"{AUDIT_DECISION_KEY}={cap}: cut {', '.join(cut)} (was {before} bytes)"
        rec = dataclasses.replace(rec, truncated=note)
        if audit_size(rec, None, receipt) <= cap:
            break
    rules_json = audit_rules_json(rec)
    return rec, audit_size(rec, rules_json, receipt), rules_json


class Records:
    """Audit log, review queue and feedback of each tenant, as callers see them."""

    def __init__(self, store: Store, tenants: Tenants, *, limits: ServiceLimits) -> None:
        self.store = store
        self.tenants = tenants
        self.limits = limits

    def _name(self, value: str, what: str) -> str:
        return inputs.required(value, what, self.limits.max_name_length)

    def _cap(self, limit: int) -> int:
        if limit < 0:
            raise InvalidInputError("limit must not be negative")
        return min(limit or self.limits.max_list_items, self.limits.max_list_items)

    async def get_decision(self, tenant: str, decision_id: str) -> AuditRecord:
        self._name(decision_id, "decision_id")
        return await self.store.get_decision(tenant, decision_id)

    async def list_decisions(
        self, tenant: str, *, policy: str = "", limit: int = 0, since: float | None = None, until: float | None = None
    ) -> list[AuditRecord]:
        policy = inputs.policy_name(policy, self.limits.max_name_length) if policy else ""
        # An answer of up to max_list_items records of up to max_audit_bytes_per_decision each was
        # read whole (256 MiB) and could not be sent anyway: the page stops at half the answer limit.
        return await self.store.list_decisions(
            tenant,
            policy=policy or None,
            limit=self._cap(limit),
            since=since,
            until=until,
            max_bytes=self.limits.max_send_message_bytes // 2,
        )

    async def submit_feedback(
        self, tenant: str, decision_id: str, *, rule: str = "", label: str, comment: str = ""
    ) -> FeedbackRecord:
        self._name(decision_id, "decision_id")
        if not inputs.LABEL.fullmatch(label or ""):
            raise InvalidInputError("label must be 1-64 characters: letters, digits, '_', '.', ':' or '-'")
        if len(comment.encode()) > self.limits.max_feedback_comment_bytes:
            raise InvalidInputError(f"comment is longer than {self.limits.max_feedback_comment_bytes} bytes")
        await self.tenants.load_feedback(tenant)  # before adding, so the new label is counted once
        rec = await self.store.add_feedback(tenant, decision_id, rule=rule, label=label, comment=comment)
        if rule:
            decision = await self.store.get_decision(tenant, decision_id)
            score = recorded_rules(decision.rules)[0].get(rule)
            self.tenants.feedback(tenant).add(decision.policy, rule, label, score)
        return rec

    # Auto-approval is applied when the queue is read (no timer): see orchestrator.reviews.timing.

    @staticmethod
    def _check_principal(tenant: str, principal: Principal | None, method: str) -> None:
        if principal is None:  # in-process callers that already decided (tests, bootstrap)
            return
        if principal.tenant != tenant:
            raise PermissionDeniedError("a principal acts only in its own tenant")
        principal.require(method)

    async def list_reviews(
        self,
        tenant: str,
        *,
        state: ReviewState | None = None,
        policy: str = "",
        limit: int = 0,
        principal: Principal | None = None,
    ) -> list[ReviewRecord]:
        """The queue, oldest first. A reviewer's queue holds only the items it may resolve (no
        ``reviewer_role``, or one of its ``reviewer_roles``): filtered among the first
        ``max_list_items`` items of the tenant's queue, then capped at ``limit``."""
        self._check_principal(tenant, principal, LIST_REVIEWS)
        policy = inputs.policy_name(policy, self.limits.max_name_length) if policy else ""
        cap = self._cap(limit)
        await self.store.auto_approve_due(tenant, time.time())
        if principal is None or principal.role is Role.ADMIN:  # an admin sees everything
            return await self.store.list_reviews(tenant, state=state, policy=policy or None, limit=cap)
        recs = await self.store.list_reviews(
            tenant, state=state, policy=policy or None, limit=self.limits.max_list_items
        )
        return [r for r in recs if principal.sees(r.params)][:cap]

    async def get_review(self, tenant: str, review_id: str, *, principal: Principal | None = None) -> ReviewRecord:
        """One item of ``tenant`` (NOT_FOUND otherwise, and for a reviewer whose queue would not hold it)."""
        self._name(review_id, "review id")
        self._check_principal(tenant, principal, LIST_REVIEWS)
        rec = await self.store.get_review(tenant, review_id)
        if principal is not None and not principal.sees(rec.params):
            raise NotFoundError(f"review {review_id!r} not found")
        return rec

    async def resolve_review(
        self,
        tenant: str,
        review_id: str,
        state: ReviewState,
        *,
        reviewer: str = "",
        note: str = "",
        principal: Principal | None = None,
    ) -> ReviewRecord:
        """Close an open item. With a ``principal`` (every gRPC call and console form): its role
        must allow ResolveReview and, unless an admin, its ``reviewer_roles`` must hold the item's
        ``reviewer_role`` (PERMISSION_DENIED); the item is looked up in ``tenant`` only, so another
        tenant's id is NOT_FOUND; the resolver recorded is the principal's name when it has one."""
        self._name(review_id, "review id")
        self._check_principal(tenant, principal, RESOLVE_REVIEW)
        if state is ReviewState.OPEN:
            raise InvalidInputError("resolve a review as approved, rejected or dismissed")
        if len(note.encode()) > self.limits.max_feedback_comment_bytes:
            raise InvalidInputError(f"note is longer than {self.limits.max_feedback_comment_bytes} bytes")
        if principal is not None:
            # reviewer_role is stamped when the item is created and never changes, so checking it
            # before the store's atomic open→resolved transition leaves no race.
            item = await self.store.get_review(tenant, review_id)
            principal.require_resolve(review_id, item.params.get(REVIEWER_ROLE_PARAM))
            reviewer = principal.reviewer_identity(reviewer)
        await self.store.auto_approve_due(tenant, time.time())
        return await self.store.resolve_review(
            tenant, review_id, state, reviewer=reviewer[: self.limits.max_name_length], note=note
        )
