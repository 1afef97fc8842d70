"""``rate_limit`` (requests per minute) of any evaluator kind: one token bucket per built evaluator,
applied by the engine before each call, so custom, builtin and llm evaluators are limited alike."""

from __future__ import annotations

import asyncio
import time

from crossaudit.kernel.errors import ConfigurationError, RateLimitedError


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
        self.capacity = float(burst or max(1, int(per_minute // 10)))
        self.tokens = self.capacity
        self.updated = time.monotonic()
        self.name = name

    def _refill(self) -> None:
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.rate)
        self.updated = now

    def wait_time(self) -> float:
        self._refill()
        return 0.0 if self.tokens >= 1 else (1 - self.tokens) / self.rate

    async def acquire(self, deadline_s: float) -> float:
        """Take one token; return the seconds waited. Raises RateLimitedError past ``deadline_s``."""
        wait = self.wait_time()
        if wait > deadline_s:
            raise RateLimitedError(
                f"evaluator {self.name!r} rate limit ({self.rate * 60:g}/min): next slot in {wait:.2f}s, "
                f"deadline in {max(deadline_s, 0):.2f}s"
            )
        self.tokens -= 1
        if wait > 0:
            await asyncio.sleep(wait)
        return wait
