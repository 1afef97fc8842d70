"""What decisions leave behind: audit records, review items, feedback.

The builders turn a decision into the records written with it (atomically, before the answer
is sent); :class:`Records` reads them back and takes people's feedback and resolutions.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

from crossaudit.kernel.errors import InvalidInputError
from crossaudit.kernel.results import Decision
from crossaudit.orchestrator import reviews
from crossaudit.service import inputs
from crossaudit.service.config import ServiceLimits
from crossaudit.service.tenants import Tenants
from crossaudit.store.base import (
    AuditRecord,
    FeedbackRecord,
    PolicyVersionRecord,
    ReviewRecord,
    ReviewState,
    Store,
    sha256_json,
    sha256_text,
)


def review_records(tenant: str, d: Decision, revision: int, env: str, now: float) -> list[ReviewRecord]:
    """The open review items ``d`` creates (which rules ask for one: ``crossaudit.orchestrator.reviews``)."""
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
) -> AuditRecord:
    """The audit record of ``d``: hashes of the texts, and the texts themselves only when ``raw``."""
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
                "reason": r.reason,
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
        context_sha256=sha256_json(dict(context or {})),
        created_at=now,
        request_id=request_id,
        prompt=prompt if raw else None,
        response=response if raw else None,
        modified_response_sha256=sha256_text(d.modified_response) if d.modified_response is not None else None,
    )


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

    async def list_decisions(self, tenant: str, *, policy: str = "", limit: int = 0) -> list[AuditRecord]:
        return await self.store.list_decisions(tenant, policy=policy or None, limit=self._cap(limit))

    async def submit_feedback(
        self, tenant: str, decision_id: str, *, rule: str = "", label: str, comment: str = ""
    ) -> FeedbackRecord:
        self._name(decision_id, "decision_id")
        if not inputs.LABEL.match(label or ""):
            raise InvalidInputError("label must be 1-64 characters: letters, digits, '_', '.', ':' or '-'")
        if len(comment.encode()) > self.limits.max_feedback_comment_bytes:
            raise InvalidInputError(f"comment is longer than {self.limits.max_feedback_comment_bytes} bytes")
        await self.tenants.load_feedback(tenant)  # before adding, so the new label is counted once
        rec = await self.store.add_feedback(tenant, decision_id, rule=rule, label=label, comment=comment)
        if rule:
            decision = await self.store.get_decision(tenant, decision_id)
            self.tenants.feedback(tenant).add(decision.policy, rule, label)
        return rec

    # Auto-approval is applied when the queue is read (no timer): see crossaudit.orchestrator.reviews.timing.

    async def list_reviews(
        self, tenant: str, *, state: ReviewState | None = None, policy: str = "", limit: int = 0
    ) -> list[ReviewRecord]:
        cap = self._cap(limit)
        await self.store.auto_approve_due(tenant, time.time())
        return await self.store.list_reviews(tenant, state=state, policy=policy or None, limit=cap)

    async def resolve_review(
        self, tenant: str, review_id: str, state: ReviewState, *, reviewer: str = "", note: str = ""
    ) -> ReviewRecord:
        self._name(review_id, "review id")
        if state is ReviewState.OPEN:
            raise InvalidInputError("resolve a review as approved, rejected or dismissed")
        if len(note.encode()) > self.limits.max_feedback_comment_bytes:
            raise InvalidInputError(f"note is longer than {self.limits.max_feedback_comment_bytes} bytes")
        await self.store.auto_approve_due(tenant, time.time())
        return await self.store.resolve_review(
            tenant, review_id, state, reviewer=reviewer[: self.limits.max_name_length], note=note
        )
