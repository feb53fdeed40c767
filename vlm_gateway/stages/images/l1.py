"""L1 rewritten-image cache: one ``Tier`` (``tier.py``: in-process LRU bounded by
bytes, plus an optional Redis tier shared by replicas, with a TTL). Key = content
hash + policy key; value = the rewritten image and its sizes/token counts, stored
in Redis as ``pack``: a 4-byte length, the metadata as JSON, the image bytes. Redis
trouble never fails a request: it only costs a miss, and starts the back-off."""

from __future__ import annotations

import logging
import struct

import orjson

from ... import metrics, redis_keys
from ...tier import Codec, Tier
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


CODEC: Codec[Rewritten] = Codec(pack, unpack)


class L1Cache:
    """The rewritten-image ``Tier`` (``tier.py``), counted under the ``l1`` level."""

    def __init__(self, max_bytes: int, redis_url: str = "", ttl_s: int = 3600, timeout_s: float = 0.05,
                 redis_prefix: str = redis_keys.DEFAULT_PREFIX) -> None:
        self.max_bytes = max_bytes
        self.tier: Tier[Rewritten] = Tier("L1 image cache", CODEC, max_bytes, _size, redis_url=redis_url,
                                          prefix=redis_keys.namespace(redis_prefix, redis_keys.L1_IMAGES),
                                          ttl_s=ttl_s, timeout_s=timeout_s)
        self.backoff = self.tier.backoff
        self.get_local = self.tier.local.get   # bound once: the hit path is one call
        self.put_local = self.tier.put_local
        self._lookups = metrics.CACHE_LOOKUPS.labels("l1")
        self._hits = metrics.CACHE_HITS.labels("l1")

    def __len__(self) -> int:
        return len(self.tier)

    @property
    def bytes(self) -> int:
        return self.tier.bytes

    async def get(self, key: str) -> Rewritten | None:
        self._lookups.inc()
        r = self.get_local(key)
        if r is None:  # the local half inline: a hit costs no coroutine
            r = await self.tier.get_shared(key)
        if r is not None:
            self._hits.inc()
        return r

    async def put(self, key: str, r: Rewritten) -> None:
        await self.tier.put(key, r)

    async def flush(self) -> int:
        """Drop every rewritten image (this process, and the shared Redis tier)."""
        return await self.tier.flush()

    async def close(self) -> None:
        await self.tier.close()
