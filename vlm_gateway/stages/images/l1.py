"""L1 rewritten-image cache: in-process LRU bounded by bytes, plus an optional
Redis tier shared by replicas (with a TTL). Key = content hash + policy key;
value = the rewritten image and its sizes/token counts. Redis trouble never
fails a request: it only costs a miss, and starts the back-off (``backoff.py``)."""

from __future__ import annotations

import logging
import struct
from collections import OrderedDict

import orjson

from ... import metrics, redis_keys
from ...backoff import Backoff
from ...redis_clients import delete_matching
from .budget import Budget
from .encode import data_uri
from .rewrite import Rewritten

log = logging.getLogger("vlm_gateway.images")


def _size(r: Rewritten) -> int:
    return len(r.data) + (len(r.url) if r.url else 0) + 256


def pack(r: Rewritten) -> bytes:
    meta = orjson.dumps([r.mime, r.width, r.height, r.source_width, r.source_height, r.source_bytes,
                         r.tokens_before, r.tokens_after, r.trimmed, list(r.view), list(r.conversions),
                         r.budget.pack() if r.budget is not None else None])
    return struct.pack(">I", len(meta)) + meta + r.data


def unpack(blob: bytes) -> Rewritten:
    (n,) = struct.unpack_from(">I", blob)
    mime, w, h, sw, sh, sb, tb, ta, trimmed, *rest = orjson.loads(blob[4:4 + n])
    view = tuple(rest[0]) if rest else ()
    if not view and (trimmed or (w, h) != (sw, sh)):
        raise ValueError("an entry without its view (written before views were kept): a miss")
    conversions = tuple(str(c) for c in rest[1]) if len(rest) > 1 and isinstance(rest[1], list) else ()
    budget = Budget.unpack(rest[2]) if len(rest) > 2 else None
    data = blob[4 + n:]
    return Rewritten(data_uri(data, mime), data, mime, w, h, sw, sh, sb, tb, ta, trimmed, view=view,
                     conversions=conversions, budget=budget)


class L1Cache:
    def __init__(self, max_bytes: int, redis_url: str = "", ttl_s: int = 3600, timeout_s: float = 0.05,
                 redis_prefix: str = redis_keys.DEFAULT_PREFIX) -> None:
        self.max_bytes = max_bytes
        self.prefix = redis_keys.namespace(redis_prefix, redis_keys.L1_IMAGES)
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self.bytes = 0
        self._lru: OrderedDict[str, Rewritten] = OrderedDict()
        self._redis = None
        self.backoff = Backoff("L1 image cache")
        if redis_url:
            from ...redis_clients import async_client
            self._redis = async_client(redis_url, timeout_s)

    def __len__(self) -> int:
        return len(self._lru)

    def get_local(self, key: str) -> Rewritten | None:
        r = self._lru.get(key)
        if r is not None:
            self._lru.move_to_end(key)
        return r

    def put_local(self, key: str, r: Rewritten) -> None:
        size = _size(r)
        if size > self.max_bytes:
            return
        old = self._lru.pop(key, None)
        if old is not None:
            self.bytes -= _size(old)
        self._lru[key] = r
        self.bytes += size
        while self.bytes > self.max_bytes and self._lru:
            _, ev = self._lru.popitem(last=False)
            self.bytes -= _size(ev)

    async def get(self, key: str) -> Rewritten | None:
        metrics.CACHE_LOOKUPS.labels("l1").inc()
        r = self.get_local(key)
        if r is None and self._redis is not None and self.backoff.up():
            try:
                blob = await self._redis.get(self.prefix + key)
            except Exception as e:  # noqa: BLE001 - a miss, never an error
                self._warn(e)
                blob = None
            if blob:
                try:
                    r = unpack(blob)
                except (ValueError, struct.error):
                    r = None
                if r is not None:
                    self.put_local(key, r)
        if r is not None:
            metrics.CACHE_HITS.labels("l1").inc()
        return r

    async def put(self, key: str, r: Rewritten) -> None:
        self.put_local(key, r)
        if self._redis is not None and self.backoff.up():
            try:
                await self._redis.set(self.prefix + key, pack(r), ex=self.ttl_s)
            except Exception as e:  # noqa: BLE001
                self._warn(e)

    async def flush(self) -> int:
        """Drop every rewritten image (this process, and the shared Redis tier)."""
        n = len(self._lru)
        self._lru.clear()
        self.bytes = 0
        if self._redis is not None:
            try:
                n += await delete_matching(self._redis, self.prefix + "*")
            except Exception as e:  # noqa: BLE001 - the local tier is flushed regardless
                self._warn(e)
        return n

    def _warn(self, e: Exception) -> None:
        self.backoff.failed(e, "using the in-process tier only")

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()
