"""Where cached completions live: one ``Tier`` (``tier.py``) of ``Answer``s.

    local   in process, bounded by bytes; each entry until its wall-clock expiry (an
            epoch time, the one stored in Redis: a Redis hit is held here for what is
            left of its lifetime, and an expired one is a miss)
    Redis   shared by every replica, SET with EX ttl_s; each call bounded by the
            timeout, no client-side retries; a failure or timeout is a miss and starts
            the back-off (Redis is skipped for retry_s, so a down Redis costs one
            timeout per interval, not one per request)
    value   ``{"e": expires_at_epoch, "c": completion}`` encoded with orjson, once per
            answer (``encode``), stored under its exact and its normalised key
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import orjson

from ...backoff import RETRY_S, Backoff
from ...tier import Codec, Tier


@dataclass(frozen=True, slots=True)
class Answer:
    completion: dict
    expires: float   # epoch seconds
    size: int        # bytes of its stored value


def pack(a: Answer) -> bytes:
    return orjson.dumps({"e": a.expires, "c": a.completion})


def unpack(blob: bytes) -> Answer:
    obj = orjson.loads(blob)
    return Answer(obj["c"], float(obj["e"]), len(blob))


CODEC: Codec[Answer] = Codec(pack, unpack)


def _lifetime(a: Answer) -> float:
    return a.expires - time.time()


class TieredStore:
    def __init__(self, max_bytes: int, ttl_s: int, max_entry_bytes: int, redis_url: str = "",
                 timeout_s: float = 0.05, retry_s: float = RETRY_S, prefix: str = "vlmgw:l3:") -> None:
        """``prefix``: the L3 namespace (``redis_keys.namespace(redis_prefix, L3_ANSWERS)``)."""
        client_kw: dict[str, Any] = {}
        if redis_url:
            from redis.asyncio.retry import Retry
            from redis.backoff import NoBackoff
            # No client-side retries: the timeout is the whole budget of a lookup.
            client_kw = {"retry": Retry(NoBackoff(), 0), "health_check_interval": 0}
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.max_entry_bytes = max_entry_bytes
        self.tier: Tier[Answer] = Tier("L3 cache", CODEC, max_bytes, lambda a: a.size, redis_url=redis_url,
                                       prefix=prefix, ttl_s=ttl_s, timeout_s=timeout_s, retry_s=retry_s,
                                       lifetime=_lifetime, clock=time.time, **client_kw)

    def __len__(self) -> int:
        return len(self.tier)

    @property
    def bytes(self) -> int:
        return self.tier.bytes

    @property
    def backoff(self) -> Backoff:
        return self.tier.backoff

    @property
    def shared(self) -> bool:
        return self.tier.shared

    def get_local(self, key: str) -> dict | None:
        a = self.tier.get_local(key)
        return a.completion if a is not None else None

    async def get(self, key: str) -> dict | None:
        a = await self.tier.get(key)
        return a.completion if a is not None else None

    def encode(self, completion: dict) -> tuple[bytes, float] | None:
        """The stored value, or None when it is over the entry size cap."""
        expires = time.time() + self.ttl_s
        value = pack(Answer(completion, expires, 0))
        if len(value) > self.max_entry_bytes:
            return None
        return value, expires

    def put_local(self, key: str, completion: dict, value: bytes, expires: float) -> None:
        self.tier.put_local(key, Answer(completion, expires, len(value)))

    async def put_remote(self, key: str, value: bytes) -> None:
        await self.tier.put_shared(key, value)

    async def flush(self) -> int:
        """Every entry, this process's and the shared ones (other replicas keep their
        in-process copies until they expire); the number dropped."""
        return await self.tier.flush()

    async def close(self) -> None:
        await self.tier.close()
