"""Every limit of webhook and decision-log delivery, named (see docs/limits.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import Field

from crossaudit.kernel.httpretry import RETRY_AFTER_MAX_S
from crossaudit.kernel.limits import SETTINGS_SECTION, PositiveFloat, PositiveInt


@dataclass(frozen=True)
class DeliveryLimits:
    """Webhook and decision-log delivery from the outbox (docs/webhooks.md, docs/decision-log.md)."""

    __pydantic_config__ = SETTINGS_SECTION

    max_attempts: Annotated[
        PositiveInt, Field(description="attempts of one message before it is dead (redeliver from the CLI/API)")
    ] = 12
    backoff_base_s: Annotated[
        PositiveFloat, Field(description="wait after the first failed attempt; doubles each attempt ...")
    ] = 2.0
    backoff_max_s: Annotated[
        PositiveFloat, Field(description="... up to this; each wait is jittered to [wait/2, wait]")
    ] = 3_600.0
    retry_after_max_s: Annotated[
        PositiveFloat,
        Field(
            description="a receiver's Retry-After is honoured up to this "
            "(default: the kernel's `RETRY_AFTER_MAX_S`, below)"
        ),
    ] = RETRY_AFTER_MAX_S
    connect_timeout_s: Annotated[PositiveFloat, Field(description="TCP + TLS handshake with a receiver")] = 5.0
    request_timeout_s: Annotated[
        PositiveFloat, Field(description="one whole attempt (connect, send, read the status)")
    ] = 10.0
    max_response_bytes: Annotated[
        PositiveInt, Field(description="read of a receiver's answer body (kept: its first 200 chars)")
    ] = 64 * 1024
    max_body_bytes: Annotated[
        PositiveInt, Field(description="a rendered webhook payload larger than this is refused at decision time")
    ] = 256 * 1024
    max_inflight: Annotated[PositiveInt, Field(description="attempts in flight across tenants")] = 16
    max_inflight_per_tenant: Annotated[
        PositiveInt,
        Field(
            description=(
                "... of which one tenant's (its slow receiver cannot starve others); a claim leases no row of a "
                "tenant at its share, and serves the others in turns"
            )
        ),
    ] = 4
    claim_batch: Annotated[PositiveInt, Field(description="messages leased per poll")] = 64
    lease_s: Annotated[
        PositiveFloat, Field(description="a leased message is retried by another worker after this (a crashed worker)")
    ] = 120.0
    poll_interval_s: Annotated[
        PositiveFloat, Field(description="how often due messages are looked for (a new decision wakes it at once)")
    ] = 1.0
    decision_log_batch: Annotated[
        PositiveInt, Field(description="decision-log entries per HTTP request / file write")
    ] = 500
    counts_interval_s: Annotated[PositiveFloat, Field(description="refresh of the outbox-size gauges")] = 15.0
    max_error_chars: Annotated[PositiveInt, Field(description="last_error kept on a message")] = 300
    max_pending_per_tenant: Annotated[
        PositiveInt,
        Field(
            description=(
                "pending webhooks of one tenant; a decision's webhook beyond is not written (the decision is answered"
                " and recorded; counted in `crossaudit_outbox_refused_total`, logged), a redelivery beyond is "
                "RESOURCE_EXHAUSTED"
            )
        ),
    ] = 10_000
    max_webhook_rules_per_policy: Annotated[
        PositiveInt,
        Field(
            description=(
                "rules of one policy whose action is `custom` (a webhook); a deploy beyond is RESOURCE_EXHAUSTED"
            )
        ),
    ] = 16
