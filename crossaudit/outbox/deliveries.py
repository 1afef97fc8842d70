"""The service's delivery component: builds a decision's messages, runs the worker, and answers
tenants' questions about their webhooks (list, redeliver)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry

from crossaudit.api.records import AuditRecord, OutboxRecord, OutboxState
from crossaudit.kernel.errors import InvalidInputError, QuotaExceededError
from crossaudit.kernel.results import Decision
from crossaudit.outbox.decisionlog import FileSink, HttpSink
from crossaudit.outbox.destinations import origin_of
from crossaudit.outbox.limits import DeliveryLimits
from crossaudit.outbox.rows import outbox_rows
from crossaudit.outbox.webhooks import KIND as WEBHOOK_KIND
from crossaudit.outbox.webhooks import WebhookSender
from crossaudit.outbox.worker import BatchSender, OutboxWorker
from crossaudit.service.grants import TenantGrants
from crossaudit.store.base import Store

log = logging.getLogger("crossaudit.delivery")


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


PENDING_SETTING = "delivery_limits.max_pending_per_tenant"
REFUSED_LOG_INTERVAL_S = 60.0  # refused webhooks are logged at most this often per tenant (with a count)
MAX_LOGGED_TENANTS = 1_000  # tenants whose refusals are being counted for the log (bounded memory)


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
        self._refused_log: dict[str, tuple[int, float]] = {}  # tenant -> (refused not yet logged, last log)
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

    @property
    def quotas(self) -> Mapping[str, int]:
        """Pending messages a tenant may have, by kind (``Store.record_decision(max_pending=)``).
        Webhooks only: the decision log is the operator's, and none of it is ever dropped."""
        return {WEBHOOK_KIND: self.config.limits.max_pending_per_tenant}

    def recorded(self, rows: Sequence[OutboxRecord], refused: Sequence[OutboxRecord] = ()) -> None:
        """A decision's messages were written, but for ``refused`` (over the tenant's quota):
        those are counted and logged, once a minute per tenant, never sent."""
        if len(rows) > len(refused):
            self.worker.wake()
        for msg in refused:
            self.worker.metrics.refused.labels(msg.kind).inc()
        if refused:
            self._log_refused(refused[0].tenant, len(refused))

    def _log_refused(self, tenant: str, n: int) -> None:
        """One warning per tenant per REFUSED_LOG_INTERVAL_S, with the count since the last one:
        a tenant's flood of decisions cannot flood the log (the metric counts every one)."""
        now = time.monotonic()
        unlogged, last = self._refused_log.get(tenant, (0, -REFUSED_LOG_INTERVAL_S))
        unlogged += n
        if now - last < REFUSED_LOG_INTERVAL_S:
            self._refused_log[tenant] = (unlogged, last)
            return
        if tenant not in self._refused_log and len(self._refused_log) >= MAX_LOGGED_TENANTS:
            self._refused_log.pop(next(iter(self._refused_log)))
        self._refused_log[tenant] = (0, now)
        log.warning(
            "tenant %s: %d webhook(s) not written, its pending webhooks are at %s (%d); their decisions "
            "were answered and recorded",
            tenant,
            unlogged,
            PENDING_SETTING,
            self.config.limits.max_pending_per_tenant,
        )

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
        limit = self.config.limits.max_pending_per_tenant
        try:
            msg = await self.store.redeliver_outbox(
                tenant, delivery_id, time.time(), kind=WEBHOOK_KIND, max_pending=limit
            )
        except QuotaExceededError as exc:
            raise QuotaExceededError(
                f"{exc.message} (delivery_limits.max_pending_per_tenant: {limit}); redeliver once some are "
                "delivered or dead",
                setting=PENDING_SETTING,
            ) from None
        self.worker.wake()
        return msg
