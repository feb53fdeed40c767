"""The L3 stage: exact -> normalised-exact -> semantic lookup, and storing on completion.

Every chat response carries ``x-vlm-gateway-cache``: ``hit-exact``,
``hit-normalized``, ``hit-semantic`` (with ``x-vlm-gateway-cache-similarity``),
``miss`` or ``bypass``. A miss subscribes the request for ``on_complete``; the relay calls
it only with a complete successful answer (a stream is assembled as it passes),
and the hook writes in the background so the client never waits for Redis.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ...core import headers as H
from ... import metrics, redis_keys
from ...config import CacheConfig, GatewayConfig
from ...core.request import ChatRequest
from ...core.stage import Reply, Stage
from ...core.state import Slot
from .keys import CacheKeys, build_keys
from .policy import decide, storable
from .store import TieredStore

log = logging.getLogger("vlm_gateway.cache")

HEADER = H.CACHE.name
SIMILARITY_HEADER = H.CACHE_SIMILARITY.name
# the request's L3 keys; its question's embedding (a vector, or a future of one)
KEYS: Slot[CacheKeys] = Slot("l3_keys")
VECTOR: Slot[Any] = Slot("l3_vector")


class ResponseCache(Stage):
    name = "cache"

    def __init__(self, cfg: CacheConfig, redis_url: str, redis_prefix: str) -> None:
        self.cfg = cfg
        self.store = TieredStore(cfg.max_bytes, cfg.ttl_s, cfg.max_entry_bytes, redis_url, cfg.redis_timeout_s,
                                 cfg.redis_retry_s, redis_keys.namespace(redis_prefix, redis_keys.L3_ANSWERS))
        self.semantic = None  # SemanticCache once the model is loaded (start)
        self._tasks: set[asyncio.Task] = set()
        self.redis_url = redis_url
        self.redis_prefix = redis_prefix

    @classmethod
    def from_config(cls, cfg: GatewayConfig, shared) -> "ResponseCache | None":
        return cls(cfg.cache, cfg.redis_url, cfg.redis_prefix) if cfg.cache.enabled else None

    async def start(self) -> None:
        if not self.cfg.semantic:
            return
        try:
            import faiss  # noqa: F401 - the semantic extra; large partitions are indexed with it
            from .embedder import shared_embedder
            from .semantic import SemanticCache
            loop = asyncio.get_running_loop()
            emb = await loop.run_in_executor(None, shared_embedder, self.cfg.semantic_model_dir)
        except Exception as e:
            log.error("L3 semantic cache is configured but cannot start (%s); serving without it", e)
            return
        c = self.cfg
        sem = SemanticCache(emb, c.semantic_threshold, c.semantic_max_entries_per_partition,
                            c.semantic_max_entries, c.semantic_hnsw_above, c.semantic_max_queue, c.semantic_guard)
        if self.redis_url:
            await sem.attach_redis(self.redis_url, redis_keys.key(self.redis_prefix, redis_keys.L3_SEMANTIC))
        self.semantic = sem
        log.info("L3 semantic cache on (threshold %.3f, guard %s)", c.semantic_threshold,
                 "on" if c.semantic_guard else "off")

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        if self.semantic is not None:
            await self.semantic.close()
        await self.store.close()

    async def flush(self) -> dict[str, int | None]:
        return {"ResponseCache.flush": await self.flush_entries()}

    async def flush_entries(self) -> int:
        """Admin flush: this replica's entries and, with Redis, the shared ones (other
        replicas keep their in-process copies until they expire)."""
        n = await self.store.flush()
        if self.semantic is not None:
            sem = self.semantic
            n += await asyncio.get_running_loop().run_in_executor(sem.pool, sem.clear)
        return n

    # -- lookup --------------------------------------------------------------------------
    async def __call__(self, req: ChatRequest) -> Reply | None:
        if req.route != "chat":
            return None
        d = decide(req, self.cfg)
        if not d.lookup and not d.store:
            req.response_headers[HEADER] = "bypass"
            return None
        keys = build_keys(req)
        if not keys.content_known:  # media known only by URL (passthrough): never cached
            req.response_headers[HEADER] = "bypass"
            return None
        req.state[KEYS] = keys
        if d.lookup:
            reply = await self._lookup(req, keys)
            if reply is not None:
                return reply
        req.response_headers[HEADER] = "miss" if d.lookup else "bypass"
        if d.store:
            req.subscribe(self, completion=True)
        return None

    async def _lookup(self, req: ChatRequest, keys: CacheKeys) -> Reply | None:
        metrics.CACHE_LOOKUPS.labels("l3_exact").inc()
        c = await self.store.get(keys.exact)
        if c is not None:
            metrics.CACHE_HITS.labels("l3_exact").inc()
            return Reply(c, {HEADER: "hit-exact"})
        if self.cfg.normalized and keys.normalized:
            metrics.CACHE_LOOKUPS.labels("l3_normalized").inc()
            c = await self.store.get(keys.normalized)
            if c is not None:
                metrics.CACHE_HITS.labels("l3_normalized").inc()
                return Reply(c, {HEADER: "hit-normalized"})
        sem = self.semantic
        if sem is not None and keys.normalized_question and keys.partition not in sem.index.partitions:
            # Nothing to compare with: skip the search, but embed the question while the
            # backend answers, so that storing the answer does not wait for the encoder.
            req.state[VECTOR] = asyncio.ensure_future(sem.embed(keys.question))
        elif sem is not None and keys.normalized_question:
            metrics.CACHE_LOOKUPS.labels("l3_semantic").inc()
            vec, match, _why = await sem.lookup(keys.partition, keys.question)
            if vec is not None:
                req.state[VECTOR] = vec
            if match is not None:
                c = await self.store.get(match.entry.exact_key)
                if c is not None:
                    metrics.CACHE_HITS.labels("l3_semantic").inc()
                    return Reply(c, {HEADER: "hit-semantic", SIMILARITY_HEADER: "%.4f" % match.similarity})
        return None

    # -- store ---------------------------------------------------------------------------
    async def on_complete(self, req: ChatRequest, completion: dict) -> None:
        keys = req.state.get(KEYS)
        if keys is None or not storable(req, completion):
            return
        if req.grounding is not None and not req.grounding.cacheable:
            return  # answered in frames other than those the key was built with
        if any(p.degraded for p in req.images):
            return  # read from images made smaller under load: not an answer for full budgets
        enc = self.store.encode(completion)
        if enc is None:
            return
        value, expires = enc
        self.store.put_local(keys.exact, completion, value, expires)
        normalized = keys.normalized if self.cfg.normalized else ""
        if normalized:
            self.store.put_local(normalized, completion, value, expires)
        metrics.CACHE_ENTRIES.labels("l3_local").set(len(self.store))
        if not self.store.shared and (self.semantic is None or not keys.normalized_question):
            return
        self._spawn(self._store_background(keys, normalized, value, expires, req.state.get(VECTOR)))

    async def _store_background(self, keys: CacheKeys, normalized: str, value: bytes, expires: float,
                                vec) -> None:
        if self.store.shared:
            await self.store.put_remote(keys.exact, value)
            if normalized:
                await self.store.put_remote(normalized, value)
        if self.semantic is not None and keys.normalized_question:
            if isinstance(vec, asyncio.Future):
                vec = await vec
            await self.semantic.add(vec, keys.partition, keys.exact, keys.question, expires)

    def _spawn(self, coro) -> None:
        t = asyncio.create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._done)

    def _done(self, t: asyncio.Task) -> None:
        self._tasks.discard(t)
        if not t.cancelled() and t.exception() is not None:
            log.warning("L3 cache: storing an entry failed: %r", t.exception())

    async def drain(self) -> None:
        """Wait for background writes (tests and benchmarks)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
