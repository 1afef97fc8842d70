"""rate_limit buckets kept in the store: one bucket per key across every process that shares it."""

from __future__ import annotations

import asyncio
import time

import pytest

from crossaudit.kernel.errors import RateLimitedError
from crossaudit.service.ratelimits import StoreBucket
from orchestrator.engine.ratelimit import TokenBucket, take


def test_the_bucket_arithmetic() -> None:
    assert take(2.0, 0.0, 1.0, 2.0, 0.0) == (1.0, 0.0)
    assert take(0.0, 0.0, 1.0, 2.0, 0.5) is None  # the next token is 1 s away
    assert take(0.0, 0.0, 1.0, 2.0, 2.0) == (-1.0, 1.0)  # reserved: due in 1 s
    assert take(-1.0, 10.0, 1.0, 2.0, 0.0) == (1.0, 0.0)  # refilled, capped at the burst


async def test_a_shared_bucket_spends_its_burst_once_then_refuses_within_the_deadline(any_store) -> None:
    now = time.time()
    got = [
        await any_store.take_rate_token("t/p/e", rate_per_s=0.1, capacity=3, now=now, max_wait_s=0.0) for _ in range(5)
    ]
    assert got == [0.0, 0.0, 0.0, None, None]
    assert await any_store.take_rate_token("t/p/other", rate_per_s=0.1, capacity=3, now=now, max_wait_s=0.0) == 0.0
    # ten seconds later one token has come back
    assert await any_store.take_rate_token("t/p/e", rate_per_s=0.1, capacity=3, now=now + 10, max_wait_s=0.0) == 0.0


async def test_store_buckets_and_memory_buckets_raise_the_same_error(any_store) -> None:
    for bucket in (StoreBucket(any_store, "t/p/x", 6, 1, "x"), TokenBucket(6, burst=1, name="x")):
        assert await bucket.acquire(1.0) == 0.0
        with pytest.raises(RateLimitedError, match="rate limit"):
            await bucket.acquire(0.1)


async def test_replicas_share_one_bucket(postgres_url: str) -> None:
    from crossaudit.store.postgres import PostgresStore

    stores = [PostgresStore(postgres_url) for _ in range(3)]
    try:
        now = time.time()
        got = await asyncio.gather(
            *(s.take_rate_token("t/p/e", rate_per_s=0.01, capacity=5, now=now, max_wait_s=0.0) for s in stores * 6)
        )
        assert sorted(got, key=lambda w: w is None) == [0.0] * 5 + [None] * 13  # the burst, once across replicas
    finally:
        for s in stores:
            await s.aclose()
