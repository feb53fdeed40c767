"""Token buckets and concurrency slots, in Redis (shared by every replica) with an
in-process fallback used while Redis is off or failing.

A bucket holds up to ``capacity`` units and refills at ``capacity`` per minute.
``take`` checks several buckets and debits them together, all or nothing, in one
atomic Lua script (the time comes from Redis, so replicas with skewed clocks
agree). Each check names a ``need``: the level required to pass (``cost`` for
requests and images; a tiny positive amount for visual tokens, which are only
known after the image stage and are charged afterwards, so a bucket can run into
debt and then holds later requests back until it has refilled).

Concurrency slots are a sorted set of request ids scored by the time their
holder last renewed them: the replica that holds a slot renews it every
``LEASE_S / 3`` while the request runs, so the slots of a replica that died
without releasing them are dropped ``LEASE_S`` later, on the next acquire.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from ... import metrics
from ...backoff import Backoff
from ...core.clock import Clock, monotonic

log = logging.getLogger("vlm_gateway.ratelimit")

# Level needed to admit a request against a bucket that is charged afterwards.
AFTERWARDS = 1e-6
# Need of an unconditional charge (always passes).
CHARGE = -1e18
# A concurrency slot not renewed for this long belongs to a dead replica.
LEASE_S = 30.0

TAKE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = #KEYS
local levels = {}
local wait = 0
for i = 1, n do
  local cap = tonumber(ARGV[(i-1)*3+1])
  local need = tonumber(ARGV[(i-1)*3+3])
  local rate = cap / 60000.0
  local b = redis.call('HMGET', KEYS[i], 'l', 't')
  local level = tonumber(b[1])
  local ts = tonumber(b[2])
  if level == nil or ts == nil then level = cap; ts = now end
  level = math.min(cap, level + math.max(0, now - ts) * rate)
  levels[i] = level
  if level < need then
    wait = math.max(wait, (need - level) / rate)
  end
end
local out = {}
local ok = 1
if wait > 0 then ok = 0 end
for i = 1, n do
  local cap = tonumber(ARGV[(i-1)*3+1])
  local cost = tonumber(ARGV[(i-1)*3+2])
  local level = levels[i]
  if ok == 1 then
    level = math.max(-cap * 10, level - cost)
    redis.call('HSET', KEYS[i], 'l', tostring(level), 't', tostring(now))
    redis.call('PEXPIRE', KEYS[i], math.ceil(60000 * (1 + math.max(0, -level) / cap)) + 1000)
  end
  out[i] = tostring(level)
end
return {ok, tostring(wait), out}
"""

ACQUIRE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit = tonumber(ARGV[1])
local max_age = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - max_age)
local n = redis.call('ZCARD', KEYS[1])
if n >= limit then return {0, n} end
redis.call('ZADD', KEYS[1], now, ARGV[2])
redis.call('PEXPIRE', KEYS[1], max_age)
return {1, n + 1}
"""


@dataclass(slots=True)
class Check:
    key: str
    capacity: float  # units per minute, also the burst
    cost: float
    need: float


@dataclass(slots=True)
class Outcome:
    ok: bool
    wait_s: float  # until every check could pass (0 when ok)
    levels: list[float]  # after the debit (ok) or as found (not ok)


class LocalStore:
    """The same algorithm in process memory (one replica's view)."""

    def __init__(self, max_age_s: float, clock: Clock = monotonic) -> None:
        self.buckets: dict[str, tuple[float, float]] = {}
        self.slots: dict[str, dict[str, float]] = {}
        self.max_age_s = max_age_s
        self.clock = clock

    def take(self, checks: list[Check]) -> Outcome:
        now = self.clock()
        levels, wait = [], 0.0
        for c in checks:
            rate = c.capacity / 60.0
            level, ts = self.buckets.get(c.key, (c.capacity, now))
            level = min(c.capacity, level + max(0.0, now - ts) * rate)
            levels.append(level)
            if level < c.need:
                wait = max(wait, (c.need - level) / rate)
        if wait > 0:
            return Outcome(False, wait, levels)
        out = []
        for c, level in zip(checks, levels):
            level = max(-c.capacity * 10, level - c.cost)
            self.buckets[c.key] = (level, now)
            out.append(level)
        return Outcome(True, 0.0, out)

    def acquire(self, key: str, limit: int, member: str) -> tuple[bool, int]:
        now = self.clock()
        held = self.slots.setdefault(key, {})
        if len(held) >= limit:
            for m, t in list(held.items()):
                if now - t > self.max_age_s:
                    del held[m]
        if len(held) >= limit:
            return False, len(held)
        held[member] = now
        return True, len(held)

    def release(self, key: str, member: str) -> None:
        held = self.slots.get(key)
        if held is not None:
            held.pop(member, None)
            if not held:
                del self.slots[key]


class RedisUnavailable(Exception):
    pass


class RedisStore:
    """Shared buckets in Redis. Any Redis failure raises ``RedisUnavailable`` and
    starts the back-off (``backoff.py``: Redis skipped for ``retry_s``), so that a
    dead Redis costs one failed call, not one per request."""

    def __init__(self, url: str, max_age_s: float = LEASE_S, timeout_s: float = 0.25, retry_s: float = 1.0) -> None:
        from ...redis_clients import async_client
        self.client = async_client(url, timeout_s, health_check_interval=0)
        self._take = self.client.register_script(TAKE_LUA)
        self._acquire = self.client.register_script(ACQUIRE_LUA)
        self.max_age_ms = int(max_age_s * 1000)
        self.backoff = Backoff("rate limits", retry_s)

    @property
    def up(self) -> bool:
        return self.backoff.up()

    async def _call(self, coro_fn):
        if not self.up:
            raise RedisUnavailable
        try:
            out = await coro_fn()
        # Any failure of the one client call is Redis failing, not only RedisError: a cluster
        # without a node for a slot raises RedisClusterException, and redis-py's asyncio
        # connections can raise AttributeError/TypeError when a node's connection is torn
        # down under a command in flight (seen when a primary was killed mid-load; redis-py
        # #3546, #3835). The caches treat these as misses alike.
        except Exception as e:  # noqa: BLE001
            self.backoff.failed(e, "using in-process limits")
            metrics.RATELIMIT_FALLBACKS.inc()
            raise RedisUnavailable from None
        self.backoff.succeeded()
        return out

    async def take(self, checks: list[Check]) -> Outcome:
        args: list = []
        for c in checks:
            args += [repr(float(c.capacity)), repr(float(c.cost)), repr(float(c.need))]
        ok, wait_ms, levels = await self._call(
            lambda: self._take(keys=[c.key for c in checks], args=args))
        return Outcome(bool(int(ok)), float(wait_ms) / 1000.0, [float(x) for x in levels])

    async def acquire(self, key: str, limit: int, member: str) -> tuple[bool, int]:
        ok, n = await self._call(lambda: self._acquire(keys=[key], args=[limit, member, self.max_age_ms]))
        return bool(int(ok)), int(n)

    async def release(self, key: str, member: str) -> None:
        await self._call(lambda: self.client.zrem(key, member))

    async def renew(self, held: list[tuple[str, str]]) -> None:
        """Refresh the lease of every slot this replica holds (XX: never re-adds a released one)."""
        if not held:
            return

        async def run():
            t = await self.client.time()
            now = t[0] * 1000 + t[1] // 1000
            async with self.client.pipeline(transaction=False) as p:
                for key, member in held:
                    p.zadd(key, {member: now}, xx=True)
                    p.pexpire(key, self.max_age_ms)
                await p.execute()
        await self._call(run)

    async def close(self) -> None:
        await self.client.aclose()


def reset_after(capacity: float, level: float) -> float:
    """Seconds until a bucket is full again."""
    return max(0.0, (capacity - level) / (capacity / 60.0))


def duration(seconds: float) -> str:
    """OpenAI's reset format: ``120ms``, ``1.5s``, ``6m0s``."""
    if seconds < 1:
        return f"{max(0, int(math.ceil(seconds * 1000)))}ms"
    if seconds < 60:
        return f"{seconds:.3g}s"
    m, s = divmod(int(math.ceil(seconds)), 60)
    return f"{m}m{s}s"
