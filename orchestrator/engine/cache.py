"""A bounded TTL + LRU cache of evaluator verdicts (``cache_results`` / ``cache_duration``).

The bounds are cachetools' ``TLRUCache`` (each entry its own time to live, least recently used
evicted for room, expired entries purged first); this class adds only the hit and miss counts
the service's metrics read, and keeps each verdict's provenance (the facts of the call that
produced it) beside it, so a cache hit reports what decided it, not the call that found it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from cachetools import TLRUCache

from crossaudit.kernel.results import Verdict

_Entry = tuple[float, Verdict, dict[str, str]]  # (ttl, verdict, provenance of the call that produced it)


def _expires(_key: str, value: _Entry, now: float) -> float:
    return now + value[0]


class ResultCache:
    def __init__(self, max_entries: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
        # value: (ttl, verdict, provenance); cachetools reads the ttl when the entry is stored
        self._data: TLRUCache[str, _Entry] = TLRUCache(max(1, max_entries), _expires, timer=clock)
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> Verdict | None:
        found = self.entry(key)
        return None if found is None else found[0]

    def entry(self, key: str) -> tuple[Verdict, dict[str, str]] | None:
        """The cached verdict and its provenance (a copy), or None."""
        item = self._data.get(key)  # an expired entry reads as missing
        if item is None:
            self.misses += 1
            return None
        self.hits += 1
        return item[1], dict(item[2])

    def put(self, key: str, verdict: Verdict, ttl: float, provenance: Mapping[str, str] | None = None) -> None:
        if ttl <= 0:
            return
        self._data[key] = (ttl, verdict, dict(provenance or {}))

    def clear(self) -> None:
        """Forget every verdict (a repeated run asks a non-deterministic judge anew)."""
        self._data.clear()

    def __len__(self) -> int:
        return len(self._data)  # live entries: cachetools purges the expired ones first
