"""The one bounded map with an eviction hook: cachetools' LRU, told what it drops for room.

Warm sandbox pools, SDK clients, built evaluators and loaded models hold processes, sockets or
memory that must be released when a cache drops them for capacity. cachetools' documented way
to see that eviction is overriding ``popitem``; it is done here once, so no layer keeps a
hand-written ``OrderedDict`` LRU of its own. Plain caches use ``cachetools.LRUCache`` directly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from cachetools import Cache, LRUCache

K = TypeVar("K")
V = TypeVar("V")


class EvictingLRU(LRUCache[K, V]):
    """An LRU of at most ``maxsize`` (at least one) items that hands each one it evicts for room to ``on_evict``.

    ``on_evict(key, value)`` runs after the item has left the map, before the new one is stored,
    inside ``__setitem__``: it must not block (the users schedule an ``aclose`` on the loop).
    Explicit removals (``del``, ``pop``) are the caller's own business and are not reported;
    ``clear()`` evicts through ``popitem`` (cachetools' ``MutableMapping`` path) and is reported,
    which is why :meth:`drain` exists for shutdown.
    """

    def __init__(self, maxsize: int, on_evict: Callable[[K, V], object]) -> None:
        super().__init__(max(1, maxsize))
        self._on_evict = on_evict

    def popitem(self) -> tuple[K, V]:
        key, value = super().popitem()
        self._on_evict(key, value)
        return key, value

    def peek(self) -> list[tuple[K, V]]:
        """Every item, without marking any as used: reading through ``items()`` or ``values()``
        goes through ``__getitem__``, which would refresh each one's recency."""
        return [(key, Cache.__getitem__(self, key)) for key in list(self)]

    def drain(self) -> list[V]:
        """Empty the map without the eviction hook and return what it held (shutdown closes them
        itself, differently from an eviction)."""
        values = [value for _, value in self.peek()]
        for key in list(self):
            del self[key]
        return values
