"""The service's delivery component: builds a decision's messages, runs the worker, and answers
tenants' questions about their webhooks (list, redeliver)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry

from crossaudit.kernel.errors import InvalidInputError
from crossaudit.kernel.results import Decision
from crossaudit.service.grants import TenantGrants
from crossaudit.service.outbox.decisionlog import FileSink, HttpSink
from crossaudit.service.outbox.destinations import origin_of
from crossaudit.service.outbox.limits import DeliveryLimits
from crossaudit.service.outbox.rows import outbox_rows
from crossaudit.service.outbox.webhooks import KIND as WEBHOOK_KIND
from crossaudit.service.outbox.webhooks import WebhookSender
from crossaudit.service.outbox.worker import BatchSender, OutboxWorker
from crossaudit.store.base import AuditRecord, OutboxRecord, OutboxState, Store


@dataclass(frozen=True)
class DeliveryConfig:
    """The operator's delivery settings (``crossaudit serve --decision-log-url/--decision-log-dir``)."""

    decision_log_url: str | None = None  # POST batches of decision-log entries here
    decision_log_dir: Path | None = None  # append decision-log entries as JSONL files here
    limits: DeliveryLimits = field(default_factory=DeliveryLimits)
    run_worker: bool = True  # False: messages are recorded, another process delivers them

    def check(self) -> None:
        if self.decision_log_url:
            try:
                origin_of(self.decision_log_url)
            except ValueError as exc:
                raise InvalidInputError(f"--decision-log-url: {exc}") from None


class Deliveries:
    def __init__(
        self,
        store: Store,
        grants: TenantGrants,
        config: DeliveryConfig | None = None,
        *,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.store = store
        self.config = config or DeliveryConfig()
        self.config.check()
        limits = self.config.limits
        sinks: list[BatchSender] = []
        if self.config.decision_log_url:
            sinks.append(HttpSink(self.config.decision_log_url, limits))
        if self.config.decision_log_dir is not None:
            sinks.append(FileSink(self.config.decision_log_dir))
        self.decision_log_kinds = tuple(s.kind for s in sinks)
        self.worker = OutboxWorker(
            store,
            webhooks=WebhookSender(grants.webhook, grants.source, limits),
            sinks=sinks,
            limits=limits,
            registry=registry,
        )

    def rows(self, decision: Decision, audit: AuditRecord, now: float) -> list[OutboxRecord]:
        return outbox_rows(
            decision, audit, decision_log_kinds=self.decision_log_kinds, limits=self.config.limits, now=now
        )

    def recorded(self, rows: Sequence[OutboxRecord]) -> None:
        if rows:
            self.worker.wake()

    def start(self) -> None:
        if self.config.run_worker:
            self.worker.start()

    async def aclose(self) -> None:
        await self.worker.aclose()

    # --- what a tenant may see and do: its own webhooks (the decision log is the operator's) ---

    async def list_deliveries(
        self, tenant: str, *, state: OutboxState | None = None, limit: int = 100
    ) -> list[OutboxRecord]:
        return await self.store.list_outbox(tenant, state=state, kind=WEBHOOK_KIND, limit=limit)

    async def redeliver(self, tenant: str, delivery_id: str) -> OutboxRecord:
        if not delivery_id or len(delivery_id) > 64:
            raise InvalidInputError("a delivery id is required")
        msg = await self.store.redeliver_outbox(tenant, delivery_id, time.time(), kind=WEBHOOK_KIND)
        self.worker.wake()
        return msg
