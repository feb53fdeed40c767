"""L3 response cache: lookup/hit latency, semantic search at 10k/100k entries,
the quality set per threshold, and hit throughput through the gateway.

Sections (each prints a table; --out writes them all as JSON):

  1. stage: the cache stage alone (key + lookup), in one process on one core:
     exact miss/hit in process, exact miss/hit with Redis only (in-process LRU
     off), normalised hit. Requests are parsed beforehand (the gateway parses once
     anyway), so the times are what the cache adds.
  2. semantic: encoder time, FAISS search at 10k and 100k entries in one partition
     (flat vs HNSW M=32 efSearch 64), and a full lookup (embed + search + guard);
     BLAS and OpenMP pinned to one thread. Filler entries are random unit vectors
     (search cost does not depend on content); HNSW top-1 agreement with exact
     search is checked on real question vectors mixed in.
  3. quality: the shipped pair set (tests/data/semantic_pairs.jsonl) per threshold,
     guard on and off.
  4. gateway: a zero-delay upstream (benchmarks/fake_upstream.py) on CPU 0, the
     gateway on CPU 1, wrk on CPU 0. Gateway time from the x-vlm-gateway-overhead-ms
     header (sequential requests) and throughput at 32 connections for: cache off
     (every request proxied), hit in process, hit from Redis.

    python benchmarks/cache.py                 # ~4 minutes
    python benchmarks/cache.py --skip-gateway --sizes 10000
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

from overhead import ensure_wrk, free_port, run_wrk, start, stop, wait_url  # noqa: E402

from vlm_gateway.config import CacheConfig, GatewayConfig  # noqa: E402
from vlm_gateway.stages.cache import guard  # noqa: E402
from vlm_gateway.stages.cache.stage import ResponseCache  # noqa: E402
from vlm_gateway.core.request import parse_chat  # noqa: E402


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def stats(samples_s: list[float]) -> dict:
    ms = sorted(x * 1000 for x in samples_s)
    return {"p50_ms": round(statistics.median(ms), 4), "p99_ms": round(ms[int(len(ms) * 0.99) - 1], 4),
            "n": len(ms)}


def body(question: str, image_hash: str = "img-1") -> bytes:
    return orjson.dumps({"model": "bench-model", "temperature": 0, "max_tokens": 64, "messages": [
        {"role": "system", "content": "You read documents for an accounting team. Answer briefly."},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/" + image_hash}},
                                     {"type": "text", "text": question}]}]})


COMPLETION = {"id": "chatcmpl-x", "object": "chat.completion", "created": 1, "model": "bench-model",
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "The total is 42.17 EUR. " * 8},
                           "logprobs": None, "finish_reason": "stop"}],
              "usage": {"prompt_tokens": 310, "completion_tokens": 64, "total_tokens": 374}}


def make_req(raw: bytes, image_hash: str = "img-1"):
    r = parse_chat(raw, {})
    for p in r.images:
        p.content_hash = image_hash  # as the image stage leaves it
    return r


# -- 1. stage -----------------------------------------------------------------------------
async def _stage_bench(redis_url: str, n: int) -> dict:
    out = {}
    for label, cfg in (("in-process", GatewayConfig()),
                       ("redis only", GatewayConfig(redis_url=redis_url, cache=CacheConfig(max_bytes=0)))):
        if label == "redis only" and not redis_url:
            continue
        cache = ResponseCache(cfg.cache, cfg.redis_url, cfg.redis_prefix)
        if cache.store.shared:
            await cache.store.flush()
        stored = make_req(body("What is the total on this receipt?"))
        await cache(stored)
        await cache.on_complete(stored, COMPLETION)
        await cache.drain()
        cases = {
            "exact hit": body("What is the total on this receipt?"),
            "normalised hit": body("what's the TOTAL on this receipt"),
            "miss (exact + normalised lookups)": None,
        }
        for case, raw in cases.items():
            reqs = [make_req(raw or body(f"What is the total on receipt number {i}?")) for i in range(n)]
            times = []
            for r in reqs:
                t0 = time.perf_counter()
                reply = await cache(r)
                times.append(time.perf_counter() - t0)
                assert (reply is None) == (raw is None), case
            out[f"{label}: {case}"] = stats(times)
        await cache.close()
    return out


# -- 2. semantic --------------------------------------------------------------------------
def _one_thread() -> None:
    import faiss
    from threadpoolctl import threadpool_limits
    faiss.omp_set_num_threads(1)
    threadpool_limits(1)


QUESTIONS = [json.loads(line) for line in open(ROOT / "tests" / "data" / "semantic_pairs.jsonl")]


def semantic_bench(sizes: list[int], n: int) -> dict:
    from vlm_gateway.stages.cache.embedder import shared_embedder
    from vlm_gateway.stages.cache.semantic import Entry, SemanticCache, SemanticIndex
    _one_thread()
    emb = shared_embedder()
    qs = list(dict.fromkeys([p["a"] for p in QUESTIONS] + [p["b"] for p in QUESTIONS]))
    real = emb.embed(qs[:200])
    out = {}
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        emb.embed_one(qs[i % len(qs)])
        times.append(time.perf_counter() - t0)
    out["embed one question"] = stats(times)
    rng = np.random.default_rng(1)
    content = guard.Content(("filler",), frozenset())
    for size in sizes:
        exact_top: dict[int, str | None] = {}
        for kind in ("flat", "hnsw"):
            idx = SemanticIndex(emb.dim, size + 1000, size + 1000, hnsw_above=0 if kind == "hnsw" else size + 1000)
            t0 = time.perf_counter()
            left = size - len(real)
            while left > 0:
                k = min(10_000, left)
                v = rng.standard_normal((k, emb.dim)).astype(np.float32)
                v /= np.linalg.norm(v, axis=1, keepdims=True)
                idx.add_many(v, [Entry(idx.new_id(), "p", "k", "filler", content, time.time() + 3600)
                                 for _ in range(k)])
                left -= k
            ids = []
            for i, q in enumerate(qs[:len(real)]):
                e = Entry(idx.new_id(), "p", f"real-{i}", q, guard.content_words(q, q), time.time() + 3600)
                idx.add(real[i], e)
                ids.append(e.id)
            build_s = time.perf_counter() - t0
            p = idx.partitions["p"]
            assert p.hnsw == (kind == "hnsw") and len(p) == size
            times, agree = [], 0
            for i in range(n):
                q = real[i % len(real)]
                t0 = time.perf_counter()
                m = p.search(q, 4)
                times.append(time.perf_counter() - t0)
                top = m[0].entry.exact_key if m else None
                if kind == "flat":
                    exact_top[i] = top
                agree += top == exact_top.get(i)
            # HNSW is approximate: how often its top-1 is the exact (flat) top-1
            out[f"search {kind} {size // 1000}k"] = {**stats(times), "build_s": round(build_s, 1),
                                                     "top1_as_flat": f"{agree}/{n}"}
            if kind == "hnsw" or size <= 20_000:
                sem = SemanticCache(emb, 0.97, size + 1000, size + 1000, 0, 64)
                sem.memo_size = 0  # measure the encoder every time (a repeated question is memoised)
                sem.index = idx
                times = []
                for i in range(n):
                    t0 = time.perf_counter()
                    sem._lookup_sync("p", qs[(i * 7) % len(qs)])
                    times.append(time.perf_counter() - t0)
                out[f"lookup (embed+search+guard) {kind} {size // 1000}k"] = stats(times)
                sem.pool.shutdown()
            del idx, p
    return out


# -- 3. quality ---------------------------------------------------------------------------
def quality_table() -> list[dict]:
    from test_cache_semantic import _Memo, evaluate
    from vlm_gateway.stages.cache.embedder import shared_embedder
    emb = _Memo(shared_embedder())
    rows = []
    for th in (0.95, 0.96, 0.97, 0.98, 0.99):
        for g in (True, False):
            r = evaluate(emb, th, g)
            hits, total = r["paraphrase"]
            fh, nm = len(r["false_hits"]), r["near_miss"][1]
            rows.append({"threshold": th, "guard": g, "recall": round(hits / total, 3), "hits": f"{hits}/{total}",
                         "false_hits": f"{fh}/{nm}",
                         "precision": round(hits / (hits + fh), 3) if hits + fh else None,
                         "false_hit_pairs": r["false_hits"]})
    return rows


# -- 4. gateway ---------------------------------------------------------------------------
def gateway_bench(redis_url: str, duration: int, n: int) -> dict:
    import httpx
    wrk = ensure_wrk()
    tmp = tempfile.mkdtemp(prefix="vlmgw-cache-bench-")
    procs = []
    up = free_port()
    out = {}
    try:
        procs.append(start([sys.executable, str(ROOT / "benchmarks" / "fake_upstream.py"), "--port", str(up)], 0))
        wait_url(f"http://127.0.0.1:{up}/health")
        variants = {"cache off (proxied)": {"VLM_GATEWAY_CACHE__ENABLED": "false"},
                    "hit in process": {}}
        if redis_url:
            variants["hit from Redis"] = {"VLM_GATEWAY_REDIS_URL": redis_url, "VLM_GATEWAY_CACHE__MAX_BYTES": "0",
                                          "VLM_GATEWAY_CACHE__REDIS_PREFIX": f"bench-{int(time.time())}-"}
        req = json.loads(body("What is the total on this receipt?", "x"))
        req["messages"][1]["content"] = req["messages"][1]["content"][1:]  # text only: no image fetch
        for label, env in variants.items():
            port = free_port()
            gw = start([sys.executable, "-m", "vlm_gateway", "serve", "--port", str(port), "--backend",
                        f"http://127.0.0.1:{up}/v1"], 1, env=env, logfile=f"{tmp}/gw-{port}.log")
            procs.append(gw)
            wait_url(f"http://127.0.0.1:{port}/ready")
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            with httpx.Client(timeout=10) as c:
                first = c.post(url, json=req)
                assert first.status_code == 200, first.text
                time.sleep(0.3)  # background write (Redis)
                over, lat, kinds = [], [], set()
                for _ in range(n):
                    t0 = time.perf_counter()
                    r = c.post(url, json=req)
                    lat.append(time.perf_counter() - t0)
                    over.append(float(r.headers["x-vlm-gateway-overhead-ms"]) / 1000)
                    kinds.add(r.headers.get("x-vlm-gateway-cache", "none"))
            res = {"cache_header": ",".join(sorted(kinds)), "gateway_time": stats(over),
                   "client_latency": stats(lat)}
            run_wrk(wrk, url, req, 32, 1, tmp)  # warm-up
            res["wrk_c32"] = run_wrk(wrk, url, req, 32, duration, tmp)
            out[label] = res
            stop(gw)
    finally:
        for p in procs:
            stop(p)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--n", type=int, default=2000, help="samples per stage cell")
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--duration", type=int, default=8)
    ap.add_argument("--skip-gateway", action="store_true")
    ap.add_argument("--skip-quality", action="store_true")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    report = {"date": dt.date.today().isoformat(), "machine": "2-core shared VM", "cpus": os.cpu_count()}
    log("stage (cache lookups in process)")
    report["stage"] = asyncio.run(_stage_bench(a.redis, a.n))
    for k, v in report["stage"].items():
        print(f"  {k:48s} p50 {v['p50_ms']:.4f} ms  p99 {v['p99_ms']:.4f} ms")
    log("semantic (one core)")
    report["semantic"] = semantic_bench([int(s) for s in a.sizes.split(",")], min(a.n, 500))
    for k, v in report["semantic"].items():
        extra = f"  build {v['build_s']} s  top-1 as flat {v['top1_as_flat']}" if "build_s" in v else ""
        print(f"  {k:48s} p50 {v['p50_ms']:.3f} ms  p99 {v['p99_ms']:.3f} ms{extra}")
    if not a.skip_quality:
        log("quality set")
        report["quality"] = quality_table()
        for r in report["quality"]:
            print(f"  threshold {r['threshold']} guard {'on ' if r['guard'] else 'off'} recall {r['hits']} "
                  f"false hits {r['false_hits']}")
    if not a.skip_gateway:
        log("gateway (wrk, pinned)")
        report["gateway"] = gateway_bench(a.redis, a.duration, min(a.n, 1000))
        for k, v in report["gateway"].items():
            g, w = v["gateway_time"], v["wrk_c32"]
            print(f"  {k:22s} [{v['cache_header']}] gateway p50 {g['p50_ms']:.3f} p99 {g['p99_ms']:.3f} ms | "
                  f"c32 {w['rps']:.0f} req/s p50 {w['p50_ms']:.2f} p99 {w['p99_ms']:.2f} ms errors {w['errors']}")
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1))
        log(f"wrote {a.out}")


if __name__ == "__main__":
    main()
