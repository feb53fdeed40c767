"""Where cached completions live.

``LocalStore``: in-process, in the one bounded map (``lru.py``), by bytes, with a TTL per entry.
``RedisStore``: shared by every replica; each call is bounded by a timeout and a
failure or timeout counts as a miss and starts the back-off (``backoff.py``:
Redis is skipped for ``retry_s``, so a down Redis costs one timeout per interval,
not one per request).
``TieredStore``: local first, then Redis (a Redis hit is copied into the local
LRU with its remaining lifetime); writes go to both.

Values are ``{"e": expires_at_epoch, "c": completion}`` encoded with orjson.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import orjson

from ...backoff import Backoff
from ...lru import LRU

log = logging.getLogger("vlm_gateway.cache")


class LocalStore:
    """Completions by key in the one bounded map (``lru.py``), by bytes; each entry until
    its wall-clock expiry (shared with Redis, so an epoch time)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._d: LRU[str, tuple[int, dict]] = LRU(max_bytes=max(1, max_bytes), size=lambda v: v[0], clock=time.time)

    def __len__(self) -> int:
        return len(self._d)

    @property
    def bytes(self) -> int:
        return self._d.bytes

    def get(self, key: str) -> dict | None:
        item = self._d.get(key)
        return item[1] if item is not None else None

    def put(self, key: str, completion: dict, size: int, expires: float) -> None:
        ttl = expires - time.time()
        if ttl <= 0:
            self._d.pop(key)
            return
        self._d.put(key, (size, completion), ttl_s=ttl)


class RedisStore:
    def __init__(self, url: str, timeout_s: float, retry_s: float = 1.0, prefix: str = "vlmgw:l3:") -> None:
        """``prefix``: the L3 namespace (``redis_keys.namespace(redis_prefix, L3_ANSWERS)``)."""
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        from ...redis_clients import async_client
        self.timeout = timeout_s
        self.retry_s = retry_s
        self.prefix = prefix
        # No client-side retries: the timeout is the whole budget of a lookup.
        self.client = async_client(url, timeout_s, retry=Retry(NoBackoff(), 0), health_check_interval=0)
        self.backoff = Backoff("L3 cache", retry_s)

    @property
    def available(self) -> bool:
        return self.backoff.up()

    @property
    def failures(self) -> int:
        return self.backoff.failures

    def _failed(self, what: str, e: BaseException) -> None:
        self.backoff.failed(e, f"treating {what}s as misses")

    async def _call(self, what: str, coro) -> Any:
        try:
            return await asyncio.wait_for(coro, self.timeout)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # timeout, connection refused/reset, protocol error
            self._failed(what, e)
            return None

    async def get(self, key: str) -> tuple[dict, float] | None:
        if not self.available:
            return None
        raw = await self._call("get", self.client.get(self.prefix + key))
        if not raw:
            return None
        try:
            obj = orjson.loads(raw)
            return obj["c"], float(obj["e"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return None

    async def put(self, key: str, value: bytes, ttl_s: int) -> bool:
        if not self.available:
            return False
        return bool(await self._call("set", self.client.set(self.prefix + key, value, ex=max(1, ttl_s))))

    async def flush(self) -> int:
        """Delete every key under the prefix (SCAN, never KEYS: Redis stays responsive)."""
        from ...redis_clients import delete_matching
        try:
            return await delete_matching(self.client, self.prefix + "*")
        except Exception as e:
            self._failed("flush", e)
            return 0

    async def close(self) -> None:
        try:
            await self.client.aclose()
        except Exception:  # pragma: no cover - best effort
            pass


class TieredStore:
    def __init__(self, local: LocalStore, remote: RedisStore | None, ttl_s: int, max_entry_bytes: int) -> None:
        self.local = local
        self.remote = remote
        self.ttl_s = ttl_s
        self.max_entry_bytes = max_entry_bytes

    async def get(self, key: str) -> dict | None:
        c = self.local.get(key)
        if c is not None or self.remote is None:
            return c
        got = await self.remote.get(key)
        if got is None:
            return None
        completion, expires = got
        if expires <= time.time():
            return None
        self.local.put(key, completion, len(orjson.dumps(completion)), expires)
        return completion

    def encode(self, completion: dict) -> tuple[bytes, float] | None:
        """The stored value, or None when it is over the entry size cap."""
        expires = time.time() + self.ttl_s
        value = orjson.dumps({"e": expires, "c": completion})
        if len(value) > self.max_entry_bytes:
            return None
        return value, expires

    def put_local(self, key: str, completion: dict, value: bytes, expires: float) -> None:
        self.local.put(key, completion, len(value), expires)

    async def put_remote(self, key: str, value: bytes) -> None:
        if self.remote is not None:
            await self.remote.put(key, value, self.ttl_s)
