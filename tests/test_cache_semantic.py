"""Semantic level: the numpy encoder against sentence-transformers' own vectors,
the per-partition index, and the shipped quality set (zero false hits required)."""

from __future__ import annotations

import asyncio
import json
import os
import time

import numpy as np
import orjson
import pytest

from vlm_gateway.config import CacheConfig
from vlm_gateway.stages.cache.embedder import shared_embedder
from vlm_gateway.stages.cache.keys import build_keys
from vlm_gateway.stages.cache.semantic import Entry, SemanticCache, SemanticIndex
from vlm_gateway.stages.cache import guard
from vlm_gateway.core.request import parse_chat

DATA = os.path.join(os.path.dirname(__file__), "data")


class _Memo:
    """The shared encoder with a memo, so the quality set is embedded once per module."""

    def __init__(self, e) -> None:
        self.e, self.dim, self.memo = e, e.dim, {}

    def embed(self, texts):
        return self.e.embed(texts)

    def embed_one(self, text):
        v = self.memo.get(text)
        if v is None:
            v = self.memo[text] = self.e.embed_one(text)
        return v


@pytest.fixture(scope="module")
def embedder():
    return _Memo(shared_embedder())


def load_pairs():
    with open(os.path.join(DATA, "semantic_pairs.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_quality_set_size():
    pairs = load_pairs()
    assert sum(p["kind"] == "paraphrase" for p in pairs) >= 60
    assert sum(p["kind"] == "near_miss" for p in pairs) >= 60


def test_embedder_matches_sentence_transformers(embedder):
    ref = json.load(open(os.path.join(DATA, "minilm_reference.json")))
    vecs = embedder.embed(ref["probe"])
    assert np.abs(vecs - np.array(ref["probe_vectors"], np.float32)).max() < 1e-4
    pairs = load_pairs()
    a = embedder.embed([p["a"] for p in pairs])
    b = embedder.embed([p["b"] for p in pairs])
    assert np.abs((a * b).sum(1) - np.array(ref["pair_cosines"])).max() < 1e-4
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)


def _req(text: str, image: str):
    body = {"model": "m", "temperature": 0, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://img/" + image}}, {"type": "text", "text": text}]}]}
    req = parse_chat(orjson.dumps(body), {})
    req.images[0].content_hash = image
    return req


def evaluate(embedder, threshold: float, use_guard: bool = True) -> dict:
    """Store each pair's first question, ask its second; a hit at the normalised or
    semantic level counts. Every pair has its own image (partition)."""
    pairs = load_pairs()
    cache = SemanticCache(embedder, threshold, 10_000, 100_000, 20_000, 64, use_guard)
    stored = {}
    try:
        for i, p in enumerate(pairs):
            k = build_keys(_req(p["a"], f"img-{i}"))
            stored[i] = k
            cache._add_sync(None, k.partition, k.exact, k.question, time.time() + 60)
        result = {"paraphrase": [0, 0], "near_miss": [0, 0], "false_hits": []}
        for i, p in enumerate(pairs):
            k = build_keys(_req(p["b"], f"img-{i}-other" if "image_b" in p else f"img-{i}"))
            hit = k.normalized == stored[i].normalized
            if not hit and k.partition in cache.index.partitions:
                _, m, _ = cache._lookup_sync(k.partition, k.question)
                hit = m is not None and m.entry.exact_key == stored[i].exact
            result[p["kind"]][0] += hit
            result[p["kind"]][1] += 1
            if hit and p["kind"] == "near_miss":
                result["false_hits"].append((p["a"], p["b"]))
        return result
    finally:
        cache.pool.shutdown()


def test_quality_set_zero_false_hits_at_default_settings(embedder):
    cfg = CacheConfig()
    r = evaluate(embedder, cfg.semantic_threshold, cfg.semantic_guard)
    assert r["false_hits"] == []
    hits, total = r["paraphrase"]
    print(f"paraphrase recall at threshold {cfg.semantic_threshold}: {hits}/{total} = {hits / total:.2f}")
    # Regression floor, not a goal: precision first (docs/benchmarks/cache.md has the table).
    assert hits / total >= 0.35


def test_guard_is_what_keeps_near_misses_out(embedder):
    # Without the guard the same threshold lets look-alike questions through
    # (left vs right, swapped relations): the embedding alone cannot separate them.
    r = evaluate(embedder, 0.97, use_guard=False)
    assert len(r["false_hits"]) >= 1


def _entry(idx: SemanticIndex, part: str, q: str, ttl: float = 60) -> Entry:
    return Entry(idx.new_id(), part, "k-" + q, q, guard.content_words(q, q), time.time() + ttl)


def test_index_partitions_caps_and_expiry(embedder):
    idx = SemanticIndex(embedder.dim, max_per_partition=3, max_total=5, hnsw_above=1000)
    qs = ["What is the total?", "What is the tax?", "Who is the seller?", "What is the date?"]
    vecs = embedder.embed(qs)
    for q, v in zip(qs, vecs):
        idx.add(v, _entry(idx, "p1", q))
    assert len(idx.partitions["p1"]) == 3  # oldest dropped
    content = guard.content_words(qs[0], qs[0])
    m, why = idx.search("p1", vecs[0], content, 0.97)
    assert m is None  # "What is the total?" was evicted
    m, why = idx.search("p1", vecs[3], guard.content_words(qs[3], qs[3]), 0.97)
    assert m is not None and m.entry.question == qs[3] and m.similarity > 0.999
    assert idx.search("p2", vecs[3], content, 0.97) == (None, "empty")
    for q, v in zip(qs, vecs):
        idx.add(v, _entry(idx, "p2", q))
    assert len(idx) == 5  # total cap across partitions
    e = _entry(idx, "p3", "What is the width?", ttl=-1)
    idx.add(embedder.embed_one(e.question), e)
    m, why = idx.search("p3", embedder.embed_one(e.question), e.content, 0.97)
    assert m is None and "p3" not in idx.partitions  # expired entries are removed on sight


def test_large_partition_switches_to_hnsw_and_rebuilds_on_eviction():
    rng = np.random.default_rng(0)
    dim = 32
    idx = SemanticIndex(dim, max_per_partition=400, max_total=10_000, hnsw_above=200)
    vecs = rng.standard_normal((600, dim)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    c = guard.Content(("x",), frozenset())
    for i in range(600):
        idx.add(vecs[i], Entry(idx.new_id(), "p", f"k{i}", "x", c, time.time() + 60))
    p = idx.partitions["p"]
    assert p.hnsw and len(p) == 400
    m, _ = idx.search("p", vecs[599], c, 0.99)
    assert m is not None and m.entry.exact_key == "k599"
    m, _ = idx.search("p", vecs[0], c, 0.99)
    assert m is None  # evicted, never returned from the tombstoned HNSW graph


def test_lookup_queue_is_bounded(embedder):
    cache = SemanticCache(embedder, 0.97, 100, 100, 1000, max_queue=2)

    async def run():
        qs = [f"question number {i} about the picture" for i in range(8)]
        return await asyncio.gather(*(cache.lookup("p", q) for q in qs))
    try:
        res = asyncio.run(run())
    finally:
        cache.pool.shutdown()
    reasons = [r[2] for r in res]
    assert reasons.count("queue_full") == 6 and cache.skipped == 6


def test_small_partitions_are_matrices_then_flat_indexes():
    rng = np.random.default_rng(1)
    dim = 16
    idx = SemanticIndex(dim, max_per_partition=80, max_total=10_000, hnsw_above=1000)
    vecs = rng.standard_normal((100, dim)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    c = guard.Content(("x",), frozenset())
    for i in range(50):
        idx.add(vecs[i], Entry(idx.new_id(), "p", f"k{i}", "x", c, time.time() + 60))
    p = idx.partitions["p"]
    assert p.index is None and len(p) == 50
    assert idx.search("p", vecs[7], c, 0.99)[0].entry.exact_key == "k7"
    idx._remove("p", [next(iter(p.entries))])  # k0 out of the matrix
    assert idx.search("p", vecs[0], c, 0.99)[0] is None
    assert idx.search("p", vecs[49], c, 0.99)[0].entry.exact_key == "k49"
    for i in range(50, 100):
        idx.add(vecs[i], Entry(idx.new_id(), "p", f"k{i}", "x", c, time.time() + 60))
    assert p.index is not None and not p.hnsw and len(p) == 80  # capped: oldest evicted
    assert idx.search("p", vecs[99], c, 0.99)[0].entry.exact_key == "k99"
    assert idx.search("p", vecs[10], c, 0.99)[0] is None
    assert idx.search("p", vecs[30], c, 0.99)[0].entry.exact_key == "k30"


def test_semantic_on_without_model_files_serves_without_the_level(tmp_path, caplog):
    from vlm_gateway.stages.cache.stage import ResponseCache
    cache = ResponseCache(CacheConfig(semantic=True, semantic_model_dir=str(tmp_path)), "", "vlmgw")

    async def run():
        await cache.start()
        req = _req("What is the total?", "img")
        reply = await cache(req)
        await cache.close()
        return reply, req
    reply, req = asyncio.run(run())
    assert cache.semantic is None and reply is None
    assert req.response_headers["x-vlm-gateway-cache"] == "miss"
    assert "cannot start" in caplog.text
