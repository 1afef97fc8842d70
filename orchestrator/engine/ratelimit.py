"""``rate_limit`` (requests per minute) of any evaluator kind: one token bucket per built evaluator,
applied by the engine before each call, so custom, builtin and llm evaluators are limited alike.

The bucket's arithmetic is :func:`take` (one function, whoever keeps the bucket). A single process
keeps it in memory (:class:`TokenBucket`); replicas sharing a store keep it there
(``crossaudit.service.ratelimits``), so the limit holds for the tenant's evaluator across all of
them. The engine asks a :data:`LimiterFactory` for one limiter per built evaluator.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

from crossaudit.kernel.errors import ConfigurationError, RateLimitedError


def capacity(per_minute: float, burst: int | None) -> float:
    """Burst size: ``rate_limit_burst``, else a tenth of the per-minute rate, at least 1."""
    return float(burst or max(1, int(per_minute // 10)))


def take(tokens: float, elapsed_s: float, rate: float, cap: float, max_wait_s: float) -> tuple[float, float] | None:
    """Reserve one token of a bucket that held ``tokens`` ``elapsed_s`` ago: (tokens left, seconds
    to wait for the reserved one), or None when that wait would exceed ``max_wait_s`` (nothing
    reserved). Reservations may drive the count negative: they queue in order."""
    now_tokens = min(cap, tokens + max(0.0, elapsed_s) * rate)
    wait = 0.0 if now_tokens >= 1 else (1 - now_tokens) / rate
    if wait > max_wait_s:
        return None
    return now_tokens - 1, wait


def limited(name: str, rate: float, wait: float | None, deadline_s: float) -> RateLimitedError:
    slot = f"next slot in {wait:.2f}s" if wait is not None else "no slot within it"
    return RateLimitedError(
        f"evaluator {name!r} rate limit ({rate * 60:g}/min): {slot}, deadline in {max(deadline_s, 0):.2f}s"
    )


class RateLimiter(Protocol):
    async def acquire(self, deadline_s: float) -> float:
        """Take one token; return the seconds waited. Raises RateLimitedError past ``deadline_s``."""
        ...


# (key, requests per minute, burst, evaluator name) -> the limiter of one built evaluator; the key
# names the tenant, the policy and the evaluator.
LimiterFactory = Callable[[str, float, "int | None", str], RateLimiter]


def local_limiter(key: str, per_minute: float, burst: int | None, name: str) -> RateLimiter:
    return TokenBucket(per_minute, burst=burst, name=name)


class TokenBucket:
    """Requests-per-minute limiter for one evaluator (one event loop).

    Capacity (burst) defaults to a tenth of the per-minute rate, at least 1, so a burst cannot
    spend a whole minute's budget at once. A caller reserves a token (the count may go
    negative: reservations queue in order) and sleeps until it is due; if that wait would
    exceed its deadline it gets RateLimitedError immediately and reserves nothing.
    """

    def __init__(self, per_minute: float, *, burst: int | None = None, name: str = "") -> None:
        if per_minute <= 0:
            raise ConfigurationError("rate_limit must be positive")
        self.rate = per_minute / 60.0  # tokens per second
        self.capacity = capacity(per_minute, burst)
        self.tokens = self.capacity
        self.updated = time.monotonic()
        self.name = name

    def wait_time(self) -> float:
        got = take(self.tokens, time.monotonic() - self.updated, self.rate, self.capacity, float("inf"))
        assert got is not None
        return got[1]

    async def acquire(self, deadline_s: float) -> float:
        """Take one token; return the seconds waited. Raises RateLimitedError past ``deadline_s``."""
        now = time.monotonic()
        got = take(self.tokens, now - self.updated, self.rate, self.capacity, deadline_s)
        if got is None:
            raise limited(self.name, self.rate, self.wait_time(), deadline_s)
        self.tokens, wait = got
        self.updated = now
        if wait > 0:
            await asyncio.sleep(wait)
        return wait
