"""``rate_limit`` buckets kept in the store, so replicas sharing it enforce one limit per tenant,
policy and evaluator (``crossaudit serve --store postgresql://…``).

One store round trip per rate-limited call (a row locked ``FOR UPDATE`` at READ COMMITTED, so
concurrent callers queue rather than fail); the bucket arithmetic is the engine's own
(:func:`orchestrator.engine.ratelimit.take`). Bucket times are wall-clock seconds, so
replicas' clocks are assumed synchronised (NTP); a clock running behind only delays its own refill.
"""

from __future__ import annotations

import asyncio
import time

from crossaudit.kernel.errors import ConfigurationError
from crossaudit.store.base import Store
from orchestrator.engine.ratelimit import LimiterFactory, RateLimiter, capacity, limited


class StoreBucket:
    def __init__(self, store: Store, key: str, per_minute: float, burst: int | None, name: str) -> None:
        if per_minute <= 0:
            raise ConfigurationError("rate_limit must be positive")
        self.store = store
        self.key = key
        self.rate = per_minute / 60.0
        self.capacity = capacity(per_minute, burst)
        self.name = name

    async def acquire(self, deadline_s: float) -> float:
        wait = await self.store.take_rate_token(
            self.key, rate_per_s=self.rate, capacity=self.capacity, now=time.time(), max_wait_s=max(deadline_s, 0.0)
        )
        if wait is None:
            raise limited(self.name, self.rate, None, deadline_s)
        if wait > 0:
            await asyncio.sleep(wait)
        return wait


def store_limiters(store: Store) -> LimiterFactory:
    def make(key: str, per_minute: float, burst: int | None, name: str) -> RateLimiter:
        return StoreBucket(store, key, per_minute, burst, name)

    return make
