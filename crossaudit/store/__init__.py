"""Persistence: the :class:`Store` interface and its embedded SQLite implementation."""

from crossaudit.store.base import (
    AuditRecord,
    DeploymentRecord,
    EvaluatorRecord,
    FeedbackRecord,
    OutboxRecord,
    OutboxState,
    PolicySummaryRecord,
    PolicyVersionRecord,
    ReviewKind,
    ReviewRecord,
    ReviewState,
    Store,
)
from crossaudit.store.sqlite import SQLiteStore

__all__ = [
    "AuditRecord",
    "DeploymentRecord",
    "EvaluatorRecord",
    "FeedbackRecord",
    "OutboxRecord",
    "OutboxState",
    "PolicySummaryRecord",
    "PolicyVersionRecord",
    "ReviewKind",
    "ReviewRecord",
    "ReviewState",
    "SQLiteStore",
    "Store",
]
