"""Every limit of webhook and decision-log delivery, named (see docs/limits.md)."""

from __future__ import annotations

from dataclasses import dataclass

from crossaudit.kernel.httpretry import RETRY_AFTER_MAX_S


@dataclass(frozen=True)
class DeliveryLimits:
    max_attempts: int = 12  # attempts of one message before it is dead (redeliver from the CLI/API)
    backoff_base_s: float = 2.0  # wait after the first failed attempt; doubles each attempt ...
    backoff_max_s: float = 3_600.0  # ... up to this; each wait is jittered to [wait/2, wait]
    retry_after_max_s: float = RETRY_AFTER_MAX_S  # a receiver's Retry-After is honoured up to this
    connect_timeout_s: float = 5.0  # TCP + TLS handshake with a receiver
    request_timeout_s: float = 10.0  # one whole attempt (connect, send, read the status)
    max_response_bytes: int = 64 * 1024  # read of a receiver's answer body (kept: its first 200 chars)
    max_body_bytes: int = 256 * 1024  # a rendered webhook payload larger than this is refused at decision time
    max_inflight: int = 16  # attempts in flight across tenants
    max_inflight_per_tenant: int = 4  # ... of which one tenant's (its slow receiver cannot starve others)
    claim_batch: int = 64  # messages leased per poll
    lease_s: float = 120.0  # a leased message is retried by another worker after this (a crashed worker)
    poll_interval_s: float = 1.0  # how often due messages are looked for (a new decision wakes it at once)
    decision_log_batch: int = 500  # decision-log entries per HTTP request / file write
    counts_interval_s: float = 15.0  # refresh of the outbox-size gauges
    max_error_chars: int = 300  # last_error kept on a message
    # Pending webhooks of one tenant (waiting or being attempted). A decision whose webhook would
    # go beyond is still answered and recorded in the audit log; that webhook is not written, and
    # is counted (crossaudit_outbox_refused_total) and logged; redelivery beyond is refused
    # (RESOURCE_EXHAUSTED). Bounds the outbox a tenant's hanging receiver can grow.
    max_pending_per_tenant: int = 10_000
    # Rules of one policy whose action sends a webhook (``custom``): a deploy beyond is refused
    # (RESOURCE_EXHAUSTED). Bounds the rows one decision writes.
    max_webhook_rules_per_policy: int = 16
