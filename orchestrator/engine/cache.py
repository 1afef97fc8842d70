"""A bounded TTL + LRU cache of evaluator verdicts (``cache_results`` / ``cache_duration``)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from crossaudit.kernel.results import Verdict


class ResultCache:
    def __init__(self, max_entries: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
        self._data: OrderedDict[str, tuple[float, Verdict]] = OrderedDict()
        self._max = max_entries
        self._clock = clock
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> Verdict | None:
        item = self._data.get(key)
        if item is None:
            self.misses += 1
            return None
        expires, verdict = item
        if self._clock() >= expires:
            del self._data[key]
            self.misses += 1
            return None
        self._data.move_to_end(key)
        self.hits += 1
        return verdict

    def put(self, key: str, verdict: Verdict, ttl: float) -> None:
        if ttl <= 0:
            return
        self._data[key] = (self._clock() + ttl, verdict)
        self._data.move_to_end(key)
        while len(self._data) > self._max:
            self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)
