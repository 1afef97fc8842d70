"""Store records for tests: one factory each, with neutral defaults a test overrides by keyword."""

from __future__ import annotations

import time
import uuid
from typing import Any

from crossaudit.api.records import AuditRecord, ReviewRecord
from orchestrator.reviews import ReviewKind, ReviewState


def audit_record(decision_id: str | None = None, tenant: str = "t1", **fields: Any) -> AuditRecord:
    """An audit record of a failed ``custom`` decision of policy ``p`` in production, made now."""
    values: dict[str, Any] = {
        "policy": "p",
        "policy_revision": 1,
        "policy_version": "1",
        "policy_digest": "x",
        "environment": "production",
        "passed": False,
        "action": "custom",
        "rules": [],
        "errored_rules": [],
        "latency_ms": 1.0,
        "prompt_sha256": "",
        "response_sha256": "",
        "context_sha256": "",
        "created_at": time.time(),
        **fields,
    }
    return AuditRecord(decision_id=decision_id or str(uuid.uuid4()), tenant=tenant, **values)


def review_record(decision_id: str, tenant: str = "t1", **fields: Any) -> ReviewRecord:
    """An open ``require_review`` review of rule ``r`` of policy ``p`` in production, made now,
    with a random id."""
    values: dict[str, Any] = {
        "id": str(uuid.uuid4()),
        "policy": "p",
        "policy_revision": 1,
        "environment": "production",
        "rule": "r",
        "kind": ReviewKind.REQUIRE_REVIEW,
        "state": ReviewState.OPEN,
        "created_at": time.time(),
        **fields,
    }
    return ReviewRecord(decision_id=decision_id, tenant=tenant, **values)
