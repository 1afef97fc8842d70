"""What one delivery attempt came to, and when to try again.

Which statuses are retried and how ``Retry-After`` is read are the kernel's
(:mod:`crossaudit.kernel.httpretry`), shared with the LLM evaluators. The wait itself is not a
retry library's: each wait is persisted on the outbox row as ``next_attempt_at`` and the worker
(:mod:`.worker`) claims the row again when it is due, across restarts and replicas.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from crossaudit.kernel.httpretry import RETRY_AFTER_MAX_S, is_retryable_status, parse_retry_after
from crossaudit.outbox.limits import DeliveryLimits


@dataclass(frozen=True)
class Attempt:
    delivered: bool
    status: int = 0  # the receiver's HTTP status, 0 when none came
    error: str = ""
    permanent: bool = False  # no retry: the message goes dead at once
    retry_after_s: float | None = None  # the receiver asked for this wait

    @classmethod
    def from_status(
        cls, status: int, retry_after: str | None, detail: str = "", *, retry_after_max_s: float = RETRY_AFTER_MAX_S
    ) -> Attempt:
        """The attempt an HTTP answer makes; ``retry_after_max_s`` caps the receiver's wait."""
        if 200 <= status < 300:
            return cls(True, status)
        text = f"HTTP {status}" + (f": {detail}" if detail else "")
        if 300 <= status < 400:
            return cls(False, status, f"{text} (redirects are not followed)", permanent=True)
        wait = parse_retry_after(retry_after, cap=retry_after_max_s)
        return cls(False, status, text, permanent=not is_retryable_status(status), retry_after_s=wait)


def next_delay(attempts_made: int, limits: DeliveryLimits, retry_after_s: float | None = None) -> float:
    """Wait before attempt ``attempts_made + 1``: exponential with jitter in [d/2, d], or the
    receiver's Retry-After when it asked for one (capped)."""
    if retry_after_s is not None:
        return min(max(retry_after_s, 0.0), limits.retry_after_max_s)
    d = min(limits.backoff_max_s, limits.backoff_base_s * 2 ** max(0, attempts_made - 1))
    return random.uniform(d / 2, d)
