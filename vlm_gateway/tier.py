"""The one cache tier: the in-process map (``lru.py``) bounded by bytes, plus an optional
Redis tier shared by replicas, with the one back-off (``backoff.py``). L1 (images,
videos) and L3 (answers) are each one ``Tier`` and a codec.

    read     get(k):   local -> Redis GET prefix+k -> unpack -> fill local -> value | None
             (get_local and get_shared are its two halves, for a caller that needs them apart)
    write    put(k,v): local, then Redis SET prefix+k pack(v) EX ttl_s  (write-through)
    local    bounded by max_bytes (sum of size(v); 0 holds nothing); an entry lives in
             it for lifetime(v) seconds when given, else until evicted
    codec    pack: V -> bytes, unpack: bytes -> V; a blob unpack refuses (another
             version, truncated: any of DECODE_ERRORS) is a miss, as is one whose
             lifetime is over
    trouble  a Redis call that fails or outlasts timeout_s (all of it: connection,
             command, reply; the client's one-time making up to MAKE_S) is a miss or an
             unwritten entry and starts the back-off, during which Redis is not asked
             (no wait at all): never an error
    flush    clears both: this process's map and every key under the prefix (SCAN)

Metrics are the caller's (it names the level); the tier counts Redis failures in its
back-off. Not thread-safe: the event loop owns it.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

from .backoff import RETRY_S, Backoff
from .core.clock import Clock, monotonic
from .lru import LRU

V = TypeVar("V")

# what unpacking a foreign or damaged blob raises (orjson's JSONDecodeError is a ValueError)
DECODE_ERRORS: tuple[type[Exception], ...] = (ValueError, TypeError, KeyError, IndexError, struct.error)
FALLBACK = "using the in-process tier only"
# The client's one-time making (the server's mode, a cluster's slot map and first
# connections; redis_clients.py) is given this much, not a lookup's budget: it happens
# once per process, usually at startup, and a cluster's takes longer than one lookup.
MAKE_S = 1.0


@dataclass(frozen=True, slots=True)
class Codec(Generic[V]):
    """How a value is stored in Redis."""

    pack: Callable[[V], bytes]
    unpack: Callable[[bytes], V]


class Tier(Generic[V]):
    __slots__ = ("what", "codec", "prefix", "ttl_s", "timeout_s", "lifetime", "holds", "local", "backoff",
                 "redis")

    def __init__(self, what: str, codec: Codec[V], max_bytes: int, size: Callable[[V], int], *,
                 redis_url: str = "", prefix: str = "", ttl_s: int = 3600, timeout_s: float = 0.05,
                 retry_s: float = RETRY_S, lifetime: Callable[[V], float] | None = None,
                 clock: Clock = monotonic, **client_kw: Any) -> None:
        """``what`` names the tier in the back-off's warning; ``clock`` is the local map's
        (the one ``lifetime`` counts on); ``client_kw`` go to ``redis_clients.async_client``."""
        self.what = what
        self.codec = codec
        self.prefix = prefix
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self.lifetime = lifetime
        # the map reads max_bytes 0 as unbounded; the tier as "hold nothing here" (Redis only)
        self.holds = max_bytes > 0
        self.local: LRU[str, V] = LRU(max_bytes=max(1, max_bytes), size=size, clock=clock)
        self.backoff = Backoff(what, retry_s)
        self.redis = None
        if redis_url:
            from .redis_clients import async_client
            self.redis = async_client(redis_url, timeout_s, **client_kw)

    def __len__(self) -> int:
        return len(self.local)

    @property
    def bytes(self) -> int:
        return self.local.bytes

    @property
    def shared(self) -> bool:
        """Whether a Redis tier is configured (up or not)."""
        return self.redis is not None

    # -- this process ------------------------------------------------------------------
    def get_local(self, key: str) -> V | None:
        return self.local.get(key)

    def put_local(self, key: str, value: V) -> None:
        if not self.holds:
            return
        if self.lifetime is None:
            self.local.put(key, value)
            return
        ttl = self.lifetime(value)
        if ttl > 0:
            self.local.put(key, value, ttl_s=ttl)
        else:
            self.local.pop(key)  # already expired: not held, and no older copy either

    # -- both --------------------------------------------------------------------------
    async def get(self, key: str) -> V | None:
        v = self.local.get(key)
        return v if v is not None else await self.get_shared(key)

    async def get_shared(self, key: str) -> V | None:
        """Redis only (a hit fills the local map): for a caller that looked here first."""
        if self.redis is None or not self.backoff.up():
            return None
        blob = await self._call(self.redis.get, self.prefix + key)
        if not blob:
            return None
        try:
            v = self.codec.unpack(blob)
        except DECODE_ERRORS:
            return None
        if self.lifetime is not None and self.lifetime(v) <= 0:
            return None
        self.put_local(key, v)
        return v

    async def put(self, key: str, value: V) -> None:
        self.put_local(key, value)
        await self.put_shared(key, self.codec.pack(value))

    async def put_shared(self, key: str, blob: bytes) -> bool:
        """Write an already packed value to Redis only; whether it was written."""
        if self.redis is None or not self.backoff.up():
            return False
        return bool(await self._call(self.redis.set, self.prefix + key, blob, ex=max(1, self.ttl_s)))

    async def flush(self) -> int:
        """Drop every entry, here and in Redis (SCAN, never KEYS: Redis stays responsive);
        the number dropped. Tried even while backed off: an operator asked for it."""
        n = self.local.clear()
        if self.redis is not None:
            from .redis_clients import delete_matching
            try:
                n += await delete_matching(self.redis, self.prefix + "*")
            except Exception as e:  # noqa: BLE001 - the local tier is flushed regardless
                self.backoff.failed(e, FALLBACK)
        return n

    async def close(self) -> None:
        if self.redis is not None:
            await self.redis.aclose()

    async def _call(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        try:
            if self.redis.cluster is None:   # not made yet
                async with asyncio.timeout(max(self.timeout_s, MAKE_S)):
                    await self.redis.resolve()
            async with asyncio.timeout(self.timeout_s):
                out = await fn(*args, **kw)
        except asyncio.CancelledError:
            raise  # the caller's own cancellation, not a Redis failure
        except Exception as e:  # noqa: BLE001 - timeout, refused, reset, protocol error: a miss
            self.backoff.failed(e, FALLBACK)
            return None
        self.backoff.succeeded()
        return out
