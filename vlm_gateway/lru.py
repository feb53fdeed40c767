"""The one bounded in-process map, least recently used evicted first.

    bounds    len <= max_entries  and  sum(size(value)) <= max_bytes   (0 = unbounded)
    ttl       an entry put with ttl_s > 0 reads as absent once clock() passes its expiry
    order     get() and put() make an entry the most recent; eviction takes the oldest

Not thread-safe (the event loop owns it); a caller that shares one across threads
holds its own lock.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Generic, Iterator, TypeVar

from .core.clock import Clock, monotonic

K = TypeVar("K")
V = TypeVar("V")


class LRU(Generic[K, V]):
    __slots__ = ("max_entries", "max_bytes", "ttl_s", "size", "clock", "bytes", "_d")

    def __init__(self, max_entries: int = 0, max_bytes: int = 0, ttl_s: float = 0.0,
                 size: Callable[[V], int] | None = None, clock: Clock = monotonic) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.size = size
        self.clock = clock
        self.bytes = 0
        self._d: OrderedDict[K, tuple[float, int, V]] = OrderedDict()  # key -> (expiry or 0, size, value)

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, key: K) -> bool:
        return self.get(key, touch=False) is not None

    def keys(self) -> Iterator[K]:
        return iter(list(self._d))

    def get(self, key: K, touch: bool = True) -> V | None:
        e = self._d.get(key)
        if e is None:
            return None
        if e[0] and e[0] < self.clock():
            self.pop(key)
            return None
        if touch:
            self._d.move_to_end(key)
        return e[2]

    def put(self, key: K, value: V, ttl_s: float | None = None) -> None:
        ttl = self.ttl_s if ttl_s is None else ttl_s
        n = self.size(value) if self.size is not None else 0
        if self.max_bytes and n > self.max_bytes:
            self.pop(key)  # larger than the whole map: never held
            return
        self.pop(key)
        self._d[key] = (self.clock() + ttl if ttl > 0 else 0.0, n, value)
        self.bytes += n
        while self._d and ((self.max_entries and len(self._d) > self.max_entries) or
                           (self.max_bytes and self.bytes > self.max_bytes)):
            _, (_, m, _) = self._d.popitem(last=False)
            self.bytes -= m

    def pop(self, key: K) -> V | None:
        e = self._d.pop(key, None)
        if e is None:
            return None
        self.bytes -= e[1]
        return e[2]

    def clear(self) -> int:
        n = len(self._d)
        self._d.clear()
        self.bytes = 0
        return n
