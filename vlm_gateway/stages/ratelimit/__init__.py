"""Per-tenant rate limits: requests/min, images/min, visual tokens/min and
concurrent requests, answered with 429 ``RateLimited``, ``Retry-After`` and
OpenAI-style ``x-ratelimit-*`` headers.

Buckets live in Redis when ``redis_url`` is set (global across replicas) and in
process otherwise, or while Redis fails (each replica then limits on its own).

Visual tokens are only known after the image stage: a request is admitted while
the tenant's visual-token bucket is positive, and the tokens actually sent
upstream are charged when the request finishes (cache hits cost nothing).
``concurrent_streams`` counts every in-flight request of the tenant, streaming or
not; the slot is released in ``on_finish``, however the request ends. Each
slot is held under a random token made here, never under anything the client
sends (a client-chosen ``x-request-id`` shared by many requests would otherwise
hold one slot for all of them, and the first to finish would free it).
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
from dataclasses import dataclass

from ... import metrics, redis_keys
from ...backends.backend import CHOSEN
from ...config import GatewayConfig, TenantConfig
from ...core.clock import Clock, monotonic
from ...core.errors import RateLimited
from ...core.request import ChatRequest
from ...core.stage import Stage
from ...core.state import Slot
from ..auth import TENANT
from .buckets import AFTERWARDS, CHARGE, LEASE_S, Check, LocalStore, Outcome, RedisStore, RedisUnavailable, duration, reset_after

log = logging.getLogger("vlm_gateway.ratelimit")


def _limited(t: TenantConfig) -> bool:
    return bool(t.requests_per_minute or t.images_per_minute or t.visual_tokens_per_minute
                or t.concurrent_streams)


@dataclass(slots=True)
class Holds:
    """What a request holds until it ends: its concurrency slot (store, key, token) and
    the visual-token bucket charged with what it sent (key, capacity)."""

    slot: tuple[str, str, str] | None = None
    charge: tuple[str, int] | None = None


HOLDS: Slot[Holds] = Slot("ratelimit")


class Limiter:
    def __init__(self, redis_url: str, lease_local_s: float, clock: Clock = monotonic) -> None:
        self.local = LocalStore(lease_local_s, clock)
        self.redis = RedisStore(redis_url, LEASE_S) if redis_url else None
        # concurrency slots held in Redis by this replica, renewed by ``renew_loop``
        self.held: dict[tuple[str, str], None] = {}

    async def renew_loop(self) -> None:
        while True:
            await asyncio.sleep(LEASE_S / 3)
            if self.redis is not None and self.held:
                try:
                    await self.redis.renew(list(self.held))
                except RedisUnavailable:
                    pass

    async def take(self, checks: list[Check]) -> Outcome:
        if self.redis is not None:
            try:
                return await self.redis.take(checks)
            except RedisUnavailable:
                pass
        return self.local.take(checks)

    async def acquire(self, key: str, limit: int, member: str) -> tuple[str | None, int]:
        """Returns (store that holds the slot or None when refused, count)."""
        if self.redis is not None:
            try:
                ok, n = await self.redis.acquire(key, limit, member)
                if ok:
                    self.held[(key, member)] = None
                return ("redis" if ok else None), n
            except RedisUnavailable:
                pass
        ok, n = self.local.acquire(key, limit, member)
        return ("local" if ok else None), n

    async def release(self, store: str, key: str, member: str) -> None:
        if store == "redis" and self.redis is not None:
            self.held.pop((key, member), None)
            try:
                await self.redis.release(key, member)
            except RedisUnavailable:
                pass  # no longer renewed: the entry ages out after LEASE_S
        else:
            self.local.release(key, member)


def _refuse(kind: str, limit: float, wait_s: float, headers: dict[str, str], what: str) -> RateLimited:
    metrics.RATE_LIMITED.labels(kind).inc()
    headers = dict(headers)
    headers["retry-after"] = str(max(1, math.ceil(wait_s)))
    return RateLimited(f"Rate limit reached for {what}: {int(limit)} per minute. "
                       f"Retry after {headers['retry-after']}s.",
                       code="rate_limit_exceeded", headers=headers, reason=f"rate_limit_{kind}")


class RateLimit(Stage):
    name = "ratelimit"

    def __init__(self, limiter: Limiter, prefix: str) -> None:
        self.limiter = limiter
        self.prefix = prefix
        self._renew: asyncio.Task | None = None

    @classmethod
    def from_config(cls, cfg: GatewayConfig, shared) -> "RateLimit | None":
        if not any(_limited(t) for t in cfg.auth.tenants):
            return None
        return cls(Limiter(cfg.redis_url, cfg.upstream.total_timeout_s + 60.0),
                   redis_keys.namespace(cfg.redis_prefix, redis_keys.RATE_LIMITS))

    async def start(self) -> None:
        if self.limiter.redis is not None:
            self._renew = asyncio.create_task(self.limiter.renew_loop(), name="ratelimit-renew")

    async def close(self) -> None:
        if self._renew is not None:
            self._renew.cancel()
        if self.limiter.redis is not None:
            await self.limiter.redis.close()

    async def __call__(self, req: ChatRequest):
        limiter, prefix = self.limiter, self.prefix
        t: TenantConfig | None = req.state.get(TENANT)
        if t is None or not _limited(t):
            return None
        base = f"{prefix}{{{t.name}}}:"
        checks: list[Check] = []
        kinds: list[str] = []
        if t.requests_per_minute:
            checks.append(Check(base + "req", t.requests_per_minute, 1, 1))
            kinds.append("requests")
        n_images = req.visual_items()  # images, videos and image embeddings
        if t.images_per_minute and n_images:
            # a request with more images than the bucket holds passes when the bucket is full
            checks.append(Check(base + "img", t.images_per_minute, n_images,
                                min(n_images, t.images_per_minute)))
            kinds.append("images")
        if t.visual_tokens_per_minute and n_images:
            checks.append(Check(base + "vtok", t.visual_tokens_per_minute, 0, AFTERWARDS))
            kinds.append("tokens")
        headers: dict[str, str] = {}
        if checks:
            res = await limiter.take(checks)
            for c, kind, level in zip(checks, kinds, res.levels):
                headers[f"x-ratelimit-limit-{kind}"] = str(int(c.capacity))
                headers[f"x-ratelimit-remaining-{kind}"] = str(max(0, int(level)))
                headers[f"x-ratelimit-reset-{kind}"] = duration(reset_after(c.capacity, level))
            if not res.ok:
                blocked = [(k, c) for k, c, lv in zip(kinds, checks, res.levels) if lv < c.need]
                kind, c = blocked[0] if blocked else (kinds[0], checks[0])
                what = {"requests": "requests", "images": "images",
                        "tokens": "visual tokens"}[kind]
                raise _refuse(kind, c.capacity, res.wait_s, headers, what)
        if t.concurrent_streams:
            key = base + "conc"
            token = secrets.token_hex(16)
            store, n = await limiter.acquire(key, t.concurrent_streams, token)
            if store is None:
                metrics.RATE_LIMITED.labels("concurrency").inc()
                raise RateLimited(f"Too many concurrent requests for this API key (limit {t.concurrent_streams}); "
                                  "retry when one finishes", code="concurrency_limit_exceeded",
                                  headers={**headers, "retry-after": "1"}, reason="rate_limit_concurrency")
            req.state[HOLDS] = Holds(slot=(store, key, token))
            req.subscribe(self)
        if t.visual_tokens_per_minute and n_images:
            if HOLDS not in req.state:
                req.state[HOLDS] = Holds()
            req.state[HOLDS].charge = (base + "vtok", t.visual_tokens_per_minute)
            req.subscribe(self)
        req.response_headers.update(headers)
        return None

    async def on_finish(self, req: ChatRequest) -> None:
        holds = req.state.pop(HOLDS)
        if holds is None:
            return
        if holds.slot is not None:
            await self.limiter.release(*holds.slot)
        # answered without a backend (cache hit) or refused before sending: nothing to charge
        if holds.charge is not None and req.state.get(CHOSEN) is not None:
            used = sum(p.tokens_after or p.tokens_before for p in req.media)   # images and videos
            if used:
                key, cap = holds.charge
                await self.limiter.take([Check(key, cap, used, CHARGE)])
