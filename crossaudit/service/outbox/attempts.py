"""What one delivery attempt came to, and when to try again."""

from __future__ import annotations

import email.utils
import random
import time
from dataclasses import dataclass

from crossaudit.service.outbox.limits import DeliveryLimits

# Answers worth retrying: timeouts, conflicts, "too early", rate limits and every server error.
# Any other 4xx (and a redirect, which is never followed) will not change by itself: dead.
RETRYABLE_STATUSES = frozenset({408, 409, 425, 429})


@dataclass(frozen=True)
class Attempt:
    delivered: bool
    status: int = 0  # the receiver's HTTP status, 0 when none came
    error: str = ""
    permanent: bool = False  # no retry: the message goes dead at once
    retry_after_s: float | None = None  # the receiver asked for this wait

    @classmethod
    def from_status(cls, status: int, retry_after: str | None, detail: str = "") -> Attempt:
        if 200 <= status < 300:
            return cls(True, status)
        text = f"HTTP {status}" + (f": {detail}" if detail else "")
        if 300 <= status < 400:
            return cls(False, status, f"{text} (redirects are not followed)", permanent=True)
        retryable = status >= 500 or status in RETRYABLE_STATUSES
        return cls(False, status, text, permanent=not retryable, retry_after_s=parse_retry_after(retry_after))


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a Retry-After header: delta-seconds or an HTTP date (RFC 9110 §10.2.3)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def next_delay(attempts_made: int, limits: DeliveryLimits, retry_after_s: float | None = None) -> float:
    """Wait before attempt ``attempts_made + 1``: exponential with jitter in [d/2, d], or the
    receiver's Retry-After when it asked for one (capped)."""
    if retry_after_s is not None:
        return min(max(retry_after_s, 0.0), limits.retry_after_max_s)
    d = min(limits.backoff_max_s, limits.backoff_base_s * 2 ** max(0, attempts_made - 1))
    return random.uniform(d / 2, d)
