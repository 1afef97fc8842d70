"""The outbox rows a decision writes with its audit record."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from crossaudit.api.records import AuditRecord, OutboxRecord, OutboxState
from crossaudit.kernel.results import Action, Decision
from crossaudit.outbox import decisionlog
from crossaudit.outbox.limits import DeliveryLimits
from crossaudit.outbox.webhooks import KIND as WEBHOOK_KIND
from crossaudit.outbox.webhooks import webhook_payload


def outbox_rows(
    decision: Decision,
    audit: AuditRecord,
    *,
    decision_log_kinds: Sequence[str],
    limits: DeliveryLimits,
    now: float,
) -> list[OutboxRecord]:
    """One webhook row per failed rule whose action is ``custom`` (its rendered request), and one
    decision-log row per configured sink. A body over the size limit is recorded dead, with the
    reason, rather than dropped: the audit log and the outbox keep agreeing."""
    rows: list[OutboxRecord] = []
    for outcome in decision.outcomes:
        if outcome.action is not Action.CUSTOM or "request" not in outcome.params:
            continue
        common = dict(
            id=str(uuid.uuid4()),
            tenant=audit.tenant,
            decision_id=audit.decision_id,
            rule=outcome.rule,
            kind=WEBHOOK_KIND,
            next_attempt_at=now,
            created_at=now,
        )
        try:
            payload = webhook_payload(outcome.params["request"], outcome.params.get("payload", {}), limits)
            rows.append(OutboxRecord(payload=payload, **common))  # type: ignore[arg-type]
        except ValueError as exc:
            rows.append(
                OutboxRecord(
                    payload={"url": str(outcome.params["request"].get("url", ""))},
                    state=OutboxState.DEAD,
                    last_error=str(exc),
                    **common,
                )
            )  # type: ignore[arg-type]
    if decision_log_kinds:
        entry = decisionlog.entry(audit)
        for kind in decision_log_kinds:
            rows.append(
                OutboxRecord(
                    id=str(uuid.uuid4()),
                    tenant=audit.tenant,
                    decision_id=audit.decision_id,
                    rule="",
                    kind=kind,
                    payload=entry,
                    next_attempt_at=now,
                    created_at=now,
                )
            )
    return rows
