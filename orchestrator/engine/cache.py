"""A bounded TTL + LRU cache of evaluator verdicts (``cache_results`` / ``cache_duration``).

The bounds are cachetools' ``TLRUCache`` (each entry its own time to live, least recently used
evicted for room, expired entries purged first); this class adds only the hit and miss counts
the service's metrics read.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from cachetools import TLRUCache

from crossaudit.kernel.results import Verdict


def _expires(_key: str, value: tuple[float, Verdict], now: float) -> float:
    return now + value[0]


class ResultCache:
    def __init__(self, max_entries: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
        # value: (ttl, verdict); cachetools reads the ttl when the entry is stored
        self._data: TLRUCache[str, tuple[float, Verdict]] = TLRUCache(max(1, max_entries), _expires, timer=clock)
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> Verdict | None:
        item = self._data.get(key)  # an expired entry reads as missing
        if item is None:
            self.misses += 1
            return None
        self.hits += 1
        return item[1]

    def put(self, key: str, verdict: Verdict, ttl: float) -> None:
        if ttl <= 0:
            return
        self._data[key] = (ttl, verdict)

    def __len__(self) -> int:
        return len(self._data)  # live entries: cachetools purges the expired ones first
