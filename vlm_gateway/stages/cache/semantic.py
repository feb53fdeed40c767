"""Semantic level: nearest stored question within one partition.

A partition (see ``keys.py``) already fixes tenant, model, parameters, system
prompt, earlier turns and every image, so only the last question's wording is
compared. Each partition has its own FAISS index over L2-normalised
all-MiniLM-L6-v2 vectors (inner product = cosine): exact flat search (supports
deletion) up to ``semantic_hnsw_above`` entries, HNSW (M=32, efSearch 64) for
larger ones, where deletions are tombstones and the index is rebuilt once a
fifth of it is dead. A candidate is a hit only at or above the threshold and
when the near-miss guard agrees.

All FAISS and numpy work runs on one worker thread (which also serialises index
mutation); at most ``semantic_max_queue`` jobs wait for it, beyond that the
semantic level is skipped (a miss), never queued without bound.

Persistence: with Redis each new entry is appended to one Redis stream (capped
at ``semantic_max_entries``); every replica loads the stream at start and then
follows it, so all replicas converge on the same index. The completion itself
lives in the exact store under the entry's exact key.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import os
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ... import metrics
from ...backoff import Backoff
from ...lru import LRU
from . import guard

if TYPE_CHECKING:
    from .embedder import Embedder

log = logging.getLogger("vlm_gateway.cache")

HNSW_M = 32
HNSW_EF_SEARCH = 64


@dataclass(slots=True)
class Entry:
    id: int
    partition: str
    exact_key: str
    question: str  # as sent (the guard derives its content words from it)
    content: guard.Content
    expires: float


@dataclass(slots=True)
class Match:
    entry: Entry
    similarity: float


class Partition:
    """One partition's vectors. Most partitions are tiny (one image, a few questions),
    so up to ``SMALL`` entries they are a plain numpy matrix (a FAISS index object
    per partition measured ~3.6 KB per single-entry partition, twice the vector);
    above that an exact FAISS flat index, and HNSW when asked for."""

    SMALL = 64

    def __init__(self, dim: int, hnsw: bool = False) -> None:
        self.dim = dim
        self.hnsw = hnsw
        self.index = self._faiss(dim, hnsw) if hnsw else None
        self.vecs = np.zeros((0, dim), np.float32)  # small mode: rows aligned with self.ids
        self.ids: list[int] = []
        self.entries: OrderedDict[int, Entry] = OrderedDict()  # oldest first
        self.dead = 0

    @staticmethod
    def _faiss(dim: int, hnsw: bool):
        import faiss
        if hnsw:
            base = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
            base.hnsw.efSearch = HNSW_EF_SEARCH
        else:
            base = faiss.IndexFlatIP(dim)
        return faiss.IndexIDMap2(base)

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, vecs: np.ndarray, entries: list[Entry]) -> None:
        for e in entries:
            self.entries[e.id] = e
        ids = [e.id for e in entries]
        if self.index is None:
            self.vecs = np.vstack([self.vecs, vecs]) if len(self.ids) else np.array(vecs, np.float32)
            self.ids += ids
            if len(self.ids) > self.SMALL:
                self.index = self._faiss(self.dim, False)
                self.index.add_with_ids(self.vecs, np.asarray(self.ids, np.int64))
                self.vecs, self.ids = np.zeros((0, self.dim), np.float32), []
            return
        self.index.add_with_ids(vecs, np.asarray(ids, np.int64))

    def remove(self, ids: list[int]) -> None:
        for i in ids:
            self.entries.pop(i, None)
        if self.index is None:
            keep = [r for r, i in enumerate(self.ids) if i in self.entries]
            self.vecs, self.ids = self.vecs[keep], [self.ids[r] for r in keep]
        elif not self.hnsw:
            self.index.remove_ids(np.asarray(ids, np.int64))
        else:
            self.dead += len(ids)
            if self.dead > max(64, self.index.ntotal // 5):
                self.rebuild(hnsw=True)

    def _vectors(self) -> np.ndarray:
        if self.index is None:
            return self.vecs
        if not self.entries:
            return np.zeros((0, self.dim), np.float32)
        return np.vstack([self.index.reconstruct(int(i)) for i in self.entries])

    def rebuild(self, hnsw: bool) -> None:
        """Re-create the index from the live entries (HNSW eviction, or flat -> HNSW)."""
        vecs = self._vectors()
        entries = list(self.entries.values())
        self.index, self.hnsw, self.dead = self._faiss(self.dim, hnsw), hnsw, 0
        self.vecs, self.ids = np.zeros((0, self.dim), np.float32), []
        if entries:
            self.index.add_with_ids(np.ascontiguousarray(vecs, np.float32),
                                    np.asarray([e.id for e in entries], np.int64))

    def search(self, vec: np.ndarray, k: int) -> list[Match]:
        if not self.entries:
            return []
        if self.index is None:
            sims = self.vecs @ vec
            top = np.argsort(-sims)[:k]
            return [Match(self.entries[self.ids[r]], float(sims[r])) for r in top]
        # HNSW keeps tombstones until a rebuild: ask for more and drop the dead ones
        want = min(max(4 * k, k + 16) if self.hnsw else k, self.index.ntotal)
        sims, ids = self.index.search(vec.reshape(1, -1), want)
        out = []
        for s_, i in zip(sims[0], ids[0]):
            e = self.entries.get(int(i))
            if e is not None:
                out.append(Match(e, float(s_)))
                if len(out) == k:
                    break
        return out


class SemanticIndex:
    """Every partition of one replica; bounded per partition and in total (oldest go first)."""

    def __init__(self, dim: int, max_per_partition: int, max_total: int, hnsw_above: int) -> None:
        self.dim = dim
        self.max_per_partition = max_per_partition
        self.max_total = max_total
        self.hnsw_above = hnsw_above
        self.partitions: dict[str, Partition] = {}
        self.order: OrderedDict[int, str] = OrderedDict()  # id -> partition, oldest first
        self._ids = itertools.count(int.from_bytes(os.urandom(6), "little") << 12)

    def __len__(self) -> int:
        return len(self.order)

    def new_id(self) -> int:
        return next(self._ids) & 0x7FFF_FFFF_FFFF_FFFF

    def add(self, vec: np.ndarray, entry: Entry) -> None:
        self.add_many(vec.reshape(1, -1), [entry])

    def add_many(self, vecs: np.ndarray, entries: list[Entry]) -> None:
        by_part: dict[str, list[int]] = {}
        for i, e in enumerate(entries):
            if e.id in self.order:
                continue
            by_part.setdefault(e.partition, []).append(i)
        for part, rows in by_part.items():
            p = self.partitions.get(part)
            if p is None:
                p = self.partitions[part] = Partition(self.dim)
            over = len(p) + len(rows) - self.max_per_partition
            if over > 0:
                self._remove(part, list(itertools.islice(p.entries.keys(), over)))
            rows = rows[-self.max_per_partition:]
            p.add(np.ascontiguousarray(vecs[rows], np.float32), [entries[i] for i in rows])
            for i in rows:
                self.order[entries[i].id] = part
            if not p.hnsw and len(p) > self.hnsw_above:
                p.rebuild(hnsw=True)
        over = len(self.order) - self.max_total
        if over <= 0:
            metrics.CACHE_ENTRIES.labels("l3_semantic").set(len(self.order))
        if over > 0:
            victims: dict[str, list[int]] = {}
            for eid, part in itertools.islice(self.order.items(), over):
                victims.setdefault(part, []).append(eid)
            for part, ids in victims.items():
                self._remove(part, ids)
            metrics.CACHE_ENTRIES.labels("l3_semantic").set(len(self.order))

    def clear(self) -> int:
        n = len(self.order)
        self.partitions.clear()
        self.order.clear()
        return n

    def _remove(self, part: str, ids: list[int]) -> None:
        p = self.partitions.get(part)
        for i in ids:
            self.order.pop(i, None)
        if p is None:
            return
        p.remove(ids)
        if not p.entries:
            del self.partitions[part]

    def search(self, part: str, vec: np.ndarray, query: guard.Content, threshold: float,
               k: int = 4) -> tuple[Match | None, str]:
        """Best guarded match at/above ``threshold``; the reason string says why not."""
        p = self.partitions.get(part)
        if p is None:
            return None, "empty"
        now = time.time()
        reason = "below_threshold"
        expired = []
        for m in p.search(vec, k):
            if m.entry.expires <= now:
                expired.append(m.entry.id)
                continue
            if m.similarity < threshold:
                break
            v = guard.check(query, m.entry.content)
            if v.ok:
                if expired:
                    self._remove(part, expired)
                return m, "hit"
            reason = "guard_" + v.reason
        if expired:
            self._remove(part, expired)
        return None, reason


class SemanticCache:
    """Async front of the index: embedding/search on a worker thread, Redis sync."""

    def __init__(self, embedder: "Embedder", threshold: float, max_per_partition: int, max_total: int,
                 hnsw_above: int, max_queue: int, guard_on: bool = True) -> None:
        self.embedder = embedder
        self.threshold = threshold
        self.guard_on = guard_on
        self.index = SemanticIndex(embedder.dim, max_per_partition, max_total, hnsw_above)
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="l3-semantic")
        self.max_queue = max_queue
        self.pending = 0
        self.skipped = 0
        self.origin = os.urandom(8).hex()
        # worker-thread only (so the LRU needs no lock)
        self._memo: LRU[str, np.ndarray] = LRU(max_entries=4096)
        self.redis = None
        self.stream_key = ""
        self.stream_max = max_total
        self._follow_task: asyncio.Task | None = None
        self._last_id = "0-0"
        self.persist = Backoff("L3 semantic index")

    def clear(self) -> int:
        return self.index.clear()

    async def _run(self, fn, *args):
        """Run on the worker thread, or return None when its queue is full."""
        if self.pending >= self.max_queue:
            self.skipped += 1
            return None
        self.pending += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)
        finally:
            self.pending -= 1

    def _vector(self, question: str) -> np.ndarray:
        """The question's embedding, memoised: the same question about many images
        ("Describe this image.") is common, and the encoder is the costly part."""
        v = self._memo.get(question)
        if v is None:
            v = self.embedder.embed_one(question)
            self._memo.put(question, v)
        return v

    async def embed(self, question: str) -> np.ndarray | None:
        return await self._run(self._vector, question)

    def _lookup_sync(self, part: str, question: str) -> tuple[np.ndarray, Match | None, str]:
        # The model was trained on natural sentences: it embeds the question as sent
        # (measured: better recall at equal precision than the normalised text).
        vec = self._vector(question)
        if part not in self.index.partitions:
            return vec, None, "empty"
        content = guard.content_words(question, question)
        if not self.guard_on:
            content = None
        m, reason = self._search(part, vec, content)
        return vec, m, reason

    def _search(self, part, vec, content):
        if content is None:  # guard switched off (benchmarks only): similarity alone
            p = self.index.partitions.get(part)
            best = next((m for m in (p.search(vec, 1) if p else []) if m.entry.expires > time.time()), None)
            return (best, "hit") if best and best.similarity >= self.threshold else (None, "below_threshold")
        return self.index.search(part, vec, content, self.threshold)

    async def lookup(self, part: str, question: str) -> tuple[np.ndarray | None, Match | None, str]:
        res = await self._run(self._lookup_sync, part, question)
        if res is None:
            return None, None, "queue_full"
        return res

    def _add_sync(self, vec: np.ndarray | None, part: str, exact_key: str, question: str,
                  expires: float) -> tuple[Entry, np.ndarray]:
        if vec is None:
            vec = self._vector(question)
        e = Entry(self.index.new_id(), part, exact_key, question, guard.content_words(question, question), expires)
        self.index.add(vec, e)
        return e, vec

    async def add(self, vec: np.ndarray | None, part: str, exact_key: str, question: str,
                  expires: float) -> None:
        res = await self._run(self._add_sync, vec, part, exact_key, question, expires)
        if res is None or self.redis is None or not self.persist.up():
            return
        _entry, v = res
        fields = {"o": self.origin, "p": part, "k": exact_key, "q": question, "e": repr(expires),
                  "v": np.asarray(v, np.float32).tobytes()}
        try:
            await asyncio.wait_for(self.redis.xadd(self.stream_key, fields, maxlen=self.stream_max,
                                                   approximate=True), 1.0)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            # Redis down: keep indexing locally, retry persisting after the back-off (one log line)
            self.persist.failed(e, "indexing locally only")

    # -- Redis persistence -------------------------------------------------------------
    def _entries_from_stream(self, items) -> tuple[np.ndarray, list[Entry]]:
        now = time.time()
        vecs, entries = [], []
        for _sid, f in items:
            try:
                if f[b"o"].decode() == self.origin:
                    continue
                expires = float(f[b"e"])
                if expires <= now:
                    continue
                q = f[b"q"].decode()
                content = guard.content_words(q, q)
                vec = np.frombuffer(f[b"v"], np.float32)
                if vec.shape[0] != self.index.dim:
                    continue
                entries.append(Entry(self.index.new_id(), f[b"p"].decode(), f[b"k"].decode(), q, content, expires))
                vecs.append(vec)
            except (KeyError, ValueError, UnicodeDecodeError):
                continue
        return (np.vstack(vecs) if vecs else np.zeros((0, self.index.dim), np.float32)), entries

    def _ingest_sync(self, items) -> int:
        vecs, entries = self._entries_from_stream(items)
        if entries:
            self.index.add_many(vecs, entries)
        return len(entries)

    async def attach_redis(self, url: str, key: str) -> None:
        """Load the persisted entries, then follow new ones in the background."""
        from ...redis_clients import async_client
        # XREAD blocks for 1 s: the socket timeout must be longer
        self.redis = async_client(url, 5.0, max_connections=4)
        self.stream_key = key
        loaded = 0
        try:
            start = "-"
            while True:
                items = await asyncio.wait_for(self.redis.xrange(key, start, "+", count=2000), 5.0)
                if not items:
                    break
                loaded += await asyncio.get_running_loop().run_in_executor(self.pool, self._ingest_sync, items)
                self._last_id = items[-1][0].decode()
                start = "(" + self._last_id
                if len(items) < 2000:
                    break
            log.info("L3 semantic: loaded %d entries from Redis", loaded)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.warning("L3 semantic: could not load entries from Redis (%s); starting empty", type(e).__name__)
            self._last_id = "$"
        self._follow_task = asyncio.create_task(self._follow())

    async def _follow(self) -> None:
        backoff = 0.5
        while True:
            try:
                if self._last_id == "$":
                    info = await self.redis.xinfo_stream(self.stream_key)
                    self._last_id = info["last-generated-id"].decode() \
                        if isinstance(info["last-generated-id"], bytes) else str(info["last-generated-id"])
                res = await self.redis.xread({self.stream_key: self._last_id}, count=1000, block=1000)
                for _key, items in res or ():
                    if items:
                        self._last_id = items[-1][0].decode()
                        await asyncio.get_running_loop().run_in_executor(self.pool, self._ingest_sync, items)
                backoff = 0.5
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if "no such key" in str(e).lower():
                    self._last_id = "0-0"
                else:
                    log.debug("L3 semantic: follow failed (%s)", type(e).__name__)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def close(self) -> None:
        if self._follow_task is not None:
            self._follow_task.cancel()
            try:
                await self._follow_task
            except (asyncio.CancelledError, Exception):
                pass
        if self.redis is not None:
            try:
                await self.redis.aclose()
            except Exception:
                pass
        self.pool.shutdown(wait=False, cancel_futures=True)
