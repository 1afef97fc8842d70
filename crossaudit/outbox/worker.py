"""The delivery worker: leases due outbox rows, hands them to their sender, records each attempt.

One asyncio task per server. It polls every ``poll_interval_s`` and is woken at once when a
decision writes messages or an attempt ends. Webhooks are sent one request per message, at most
``max_inflight`` at a time and ``max_inflight_per_tenant`` per tenant (a tenant whose receiver
hangs holds only its own slots); a decision-log sink gets whole batches. Each attempt is bounded
in time, and its outcome is written fenced on the lease (a worker that lost its lease writes
nothing).

A claim leases only rows the worker can attempt at once: none of a tenant already at its share,
taken round-robin across the others (``Store.claim_outbox(per_tenant=, held=)``). It once leased
rows of a tenant at its share, handed them back and woke again at once: with a backlog to a
hanging receiver, 80-97% of a core for hours with no caller. Now nothing is handed back, and the
worker wakes only for a new decision, a finished attempt or its poll.

Across processes sharing one database, leases make each message go to one worker at a time:
a crashed worker's lease expires after ``lease_s`` and the message is tried again (at least once).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from crossaudit.api.records import OutboxRecord, OutboxState
from crossaudit.outbox.attempts import Attempt, next_delay
from crossaudit.outbox.limits import DeliveryLimits
from crossaudit.outbox.webhooks import KIND as WEBHOOK_KIND
from crossaudit.store.base import Store, StoreUnavailableError

log = logging.getLogger("crossaudit.delivery")
BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class MessageSender(Protocol):
    async def send(self, msg: OutboxRecord) -> Attempt: ...

    async def aclose(self) -> None: ...


class BatchSender(Protocol):
    kind: str

    async def send(self, batch: Sequence[OutboxRecord]) -> Attempt: ...

    async def aclose(self) -> None: ...


class DeliveryMetrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        kw: dict[str, Any] = {"registry": registry}
        self.attempts = Counter(
            "crossaudit_delivery_attempts_total",
            "Delivery attempts of webhooks and decision-log batches, by kind and outcome (delivered, retry, dead)",
            ["kind", "outcome"],
            **kw,
        )
        self.latency = Histogram(
            "crossaudit_delivery_attempt_seconds", "Duration of one delivery attempt", ["kind"], buckets=BUCKETS, **kw
        )
        self.messages = Gauge(  # every worker of `serve --workers N` reads the same store: its latest count
            "crossaudit_outbox_messages",
            "Outbox messages by kind and state",
            ["kind", "state"],
            multiprocess_mode="livemostrecent",
            **kw,
        )
        self.refused = Counter(
            "crossaudit_outbox_refused_total",
            "Messages not written because their tenant had delivery_limits.max_pending_per_tenant pending "
            "(their decisions were answered and recorded)",
            ["kind"],
            **kw,
        )


class OutboxWorker:
    def __init__(
        self,
        store: Store,
        *,
        webhooks: MessageSender | None,
        sinks: Sequence[BatchSender] = (),
        limits: DeliveryLimits | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.store = store
        self.webhooks = webhooks
        self.sinks: Mapping[str, BatchSender] = {s.kind: s for s in sinks}
        self.limits = limits or DeliveryLimits()
        self.metrics = DeliveryMetrics(registry)
        self.kinds = ([WEBHOOK_KIND] if webhooks is not None else []) + list(self.sinks)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._inflight: set[asyncio.Task[None]] = set()
        self._per_tenant: dict[str, int] = {}
        self._sink_busy: set[str] = set()
        self._counts_at = 0.0

    def wake(self) -> None:
        """A decision wrote messages: look now rather than at the next poll."""
        self._wake.set()

    def start(self) -> None:
        if self._task is None and self.kinds:
            self._task = asyncio.create_task(self._run(), name="crossaudit-outbox")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for t in list(self._inflight):
            t.cancel()
        if self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)
        for sender in (self.webhooks, *self.sinks.values()):
            if sender is not None:
                await sender.aclose()

    async def run_once(self) -> int:
        """Lease what is due now and start its attempts; returns how many messages were leased."""
        now = time.time()
        leased = 0
        free = self.limits.max_inflight - len(self._inflight)
        if self.webhooks is not None and free > 0:
            batch = await self.store.claim_outbox(
                [WEBHOOK_KIND],
                now,
                limit=min(free, self.limits.claim_batch),
                lease_s=self.limits.lease_s,
                per_tenant=self.limits.max_inflight_per_tenant,
                held=dict(self._per_tenant),
            )
            leased += len(batch)
            for msg in batch:
                # counted from the lease on (not when its task starts), so the next claim sees it
                self._per_tenant[msg.tenant] = self._per_tenant.get(msg.tenant, 0) + 1
                self._spawn(self._deliver_one(msg))
        for kind, sink in self.sinks.items():
            if kind in self._sink_busy:
                continue
            batch = await self.store.claim_outbox(
                [kind], now, limit=self.limits.decision_log_batch, lease_s=self.limits.lease_s
            )
            if batch:
                leased += len(batch)
                self._sink_busy.add(kind)
                self._spawn(self._deliver_batch(sink, batch))
        if now - self._counts_at >= self.limits.counts_interval_s:
            self._counts_at = now
            for (kind, state), n in (await self.store.outbox_counts()).items():
                self.metrics.messages.labels(kind, state).set(n)
        return leased

    async def _run(self) -> None:
        while True:
            self._wake.clear()  # before the claim: a wake during it is not lost
            try:
                await self.run_once()
            except StoreUnavailableError as exc:
                log.warning("outbox: store unavailable (%s); retrying", exc)
            except Exception:  # never let one bad row stop delivery for everyone
                log.exception("outbox: unexpected error; retrying")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.limits.poll_interval_s)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._inflight.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._inflight.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("outbox: delivery task failed: %r", task.exception())
        self._wake.set()  # a slot is free

    async def _attempt(self, kind: str, call: Any) -> Attempt:
        t0 = time.monotonic()
        try:
            async with asyncio.timeout(self.limits.request_timeout_s + self.limits.connect_timeout_s):
                return await call
        except TimeoutError:
            return Attempt(False, error="the attempt took too long")
        finally:
            self.metrics.latency.labels(kind).observe(time.monotonic() - t0)

    async def _deliver_one(self, msg: OutboxRecord) -> None:
        """One attempt of a message leased within its tenant's share (counted by run_once)."""
        assert self.webhooks is not None
        try:
            attempt = await self._attempt(WEBHOOK_KIND, self.webhooks.send(msg))
        finally:
            self._per_tenant[msg.tenant] -= 1
            if not self._per_tenant[msg.tenant]:
                del self._per_tenant[msg.tenant]
        await self._settle(WEBHOOK_KIND, msg, attempt)

    async def _deliver_batch(self, sink: BatchSender, batch: Sequence[OutboxRecord]) -> None:
        try:
            attempt = await self._attempt(sink.kind, sink.send(batch))
            for msg in batch:
                await self._settle(sink.kind, msg, attempt)
        finally:
            self._sink_busy.discard(sink.kind)

    async def _settle(self, kind: str, msg: OutboxRecord, attempt: Attempt) -> None:
        now = time.time()
        error = attempt.error[: self.limits.max_error_chars]
        if attempt.delivered:
            state, outcome, due = OutboxState.DELIVERED, "delivered", 0.0
        elif attempt.permanent or msg.attempts + 1 >= self.limits.max_attempts:
            state, outcome, due = OutboxState.DEAD, "dead", 0.0
        else:
            state, outcome = OutboxState.PENDING, "retry"
            due = now + next_delay(msg.attempts + 1, self.limits, attempt.retry_after_s)
        ok = await self.store.settle_outbox(
            msg, state=state, next_attempt_at=due, last_error=error, last_status=attempt.status, now=now
        )
        self.metrics.attempts.labels(kind, outcome).inc()
        if not ok:
            log.warning("outbox: lease on %s %s expired before its attempt was recorded", kind, msg.id)
        elif state is OutboxState.DEAD:
            log.warning(
                "outbox: %s %s of tenant %s is dead after %d attempt(s): %s",
                kind,
                msg.id,
                msg.tenant,
                msg.attempts + 1,
                error,
            )
