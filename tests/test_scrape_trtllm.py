"""The scraper against TensorRT-LLM's real load formats.

Fixtures (tests/fixtures/README.md says what each mirrors, file and version):
- trtllm-1.2-iteration-stats.json: trtllm-serve's ``/metrics`` body (IterationStats JSON);
- trtllm-1.2-prometheus.txt: ``/prometheus/metrics`` on the 1.2 line (request series only);
- trtllm-1.3-prometheus.txt: the same in 1.3 pre-releases (iteration gauges), describing the
  same engine state as the JSON fixture's last iteration.
Then the scraper end to end against simulator processes serving those formats.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import orjson
import pytest

from vlm_gateway.backends.backend import Backend
from vlm_gateway.backends.scrape import (
    ScrapeState, decode, detect, extract, iteration_figures, parse, scrape, sources_for,
)
from vlm_gateway.config import BackendConfig, UpstreamConfig

FIX = Path(__file__).parent / "fixtures"
ITER_JSON = (FIX / "trtllm-1.2-iteration-stats.json").read_bytes()
PROM_12 = (FIX / "trtllm-1.2-prometheus.txt").read_text()
PROM_13 = (FIX / "trtllm-1.3-prometheus.txt").read_text()

# the last iteration of the JSON fixture (iter 155)
LAST = {"running": 3.0, "waiting": 2.0, "kv_usage": 912 / 101256,
        "prefix_hits": 280 * 32.0, "prefix_queries": (280 + 3279) * 32.0}


# -- formats -----------------------------------------------------------------------------------
def test_iteration_stats_give_the_latest_iterations_figures():
    assert decode(ITER_JSON, "trtllm_json") == LAST
    stats = json.loads(ITER_JSON)
    # one entry per iteration, oldest first; ordered by "iter" should they come shuffled
    assert iteration_figures(list(reversed(stats))) == LAST
    # the first iteration alone: the documented example of trtllm-serve.rst
    assert iteration_figures(stats[0]) == {"running": 1.0, "waiting": 0.0, "kv_usage": 3 / 101256,
                                           "prefix_hits": 4 * 32.0, "prefix_queries": (4 + 3121) * 32.0}


def test_empty_and_foreign_json_bodies():
    # no iteration since the previous read: a valid source with no new figures
    assert decode(b"[]", "trtllm_json") == {}
    # not iteration statistics: FastAPI's 404 body, an OpenAI error, garbage
    assert decode(b'{"detail":"Not Found"}', "trtllm_json") is None
    assert decode(b'{"error": {"message": "x"}}', "trtllm_json") is None
    assert decode(b"[1, 2]", "trtllm_json") is None
    assert decode(b"{not json", "trtllm_json") is None
    # an iteration without KV-cache statistics still gives the request counts; requests that
    # completed in the iteration were counted active at its start and are not running after it
    assert iteration_figures([{"iter": 1, "numActiveRequests": 2, "numQueuedRequests": 0,
                               "kvCacheStats": None}]) == {"running": 2.0, "waiting": 0.0}
    assert iteration_figures([{"iter": 9, "numActiveRequests": 3, "numQueuedRequests": 1,
                               "numCompletedRequests": 2}]) == {"running": 1.0, "waiting": 1.0}
    # a zero-block pool is not a division
    e = json.loads(ITER_JSON)[0]
    e["kvCacheStats"]["maxNumBlocks"] = 0
    assert "kv_usage" not in iteration_figures([e])


def test_prometheus_of_the_1_2_line_has_no_load_figures():
    # five request series, no prefix: nothing to route by, so the scraper moves on to /metrics
    assert extract(parse(PROM_12)) == {}
    assert decode(PROM_12.encode(), "prometheus") is None


def test_prometheus_iteration_gauges_match_the_json_of_the_same_state():
    got = decode(PROM_13.encode(), "prometheus")
    assert got == {"running": 3.0, "waiting": 2.0, "kv_usage": pytest.approx(912 / 101256),
                   "prefix_hits": 8960.0, "prefix_queries": 13860.0}
    # running / waiting / KV use are the same figures whichever endpoint they were read from
    assert {k: got[k] for k in ("running", "waiting")} == {k: LAST[k] for k in ("running", "waiting")}
    assert got["kv_usage"] == pytest.approx(LAST["kv_usage"])
    # the gauges' multiprocess pid label does not hide them
    assert 'trtllm_num_requests_running{engine_type="trtllm",model_name="Qwen/Qwen3-VL-2B-Instruct",pid="4127"}' \
        in PROM_13


def test_format_detection():
    assert detect("application/json", b"[]") == "trtllm_json"
    assert detect("text/plain; version=0.0.4; charset=utf-8", PROM_13.encode()) == "prometheus"
    assert detect("", b"  [ {} ]") == "trtllm_json"
    assert detect("", b"# HELP x\nx 1\n") == "prometheus"
    assert detect("", b"") is None


def test_candidate_endpoints_per_engine_and_format():
    o = "http://h:8000"
    assert [(s.url, s.fmt, s.slow) for s in sources_for("trtllm", o)] == [
        (f"{o}/prometheus/metrics", "prometheus", False), (f"{o}/metrics", "trtllm_json", True)]
    assert [s.url for s in sources_for("trtllm", o, metrics_format="trtllm_json")] == [f"{o}/metrics"]
    assert [s.url for s in sources_for("trtllm", o, metrics_format="prometheus")] == [f"{o}/prometheus/metrics"]
    assert [(s.url, s.fmt) for s in sources_for("vllm", o)] == [(f"{o}/metrics", "auto")]
    assert sources_for("openai", o) == []
    # an explicit URL on a trtllm backend may be the slow /metrics: read with the long timeout
    (s,) = sources_for("trtllm", o, metrics_url="http://m:9/metrics")
    assert (s.url, s.fmt, s.slow) == ("http://m:9/metrics", "auto", True)
    b = Backend.from_config(BackendConfig(url=o + "/v1", engine="trtllm"), 0)
    assert b.metrics_url == f"{o}/prometheus/metrics" and len(b.scrape_state.sources) == 2


# -- end to end against simulator processes -------------------------------------------------------
def _chat(sim, text: str = "hello there", max_tokens: int = 4) -> None:
    r = httpx.post(sim.base_url + "/chat/completions", timeout=10, json={
        "model": "qwen3vl-sim", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens})
    assert r.status_code == 200, r.text


async def _scrape(b: Backend, within: float = 0.0) -> dict | None:
    """Scrape as the pool's loop does (every 0.1 s, 0.5 s timeout) until figures come or
    ``within`` seconds pass; the figures, or None."""
    await b.start(UpstreamConfig())
    try:
        deadline = time.monotonic() + within
        while True:
            got = await scrape(b, timeout_s=0.5)
            if got is not None or time.monotonic() >= deadline:
                return got
            await asyncio.sleep(0.1)
    finally:
        await b.close()


def _backend(sim, **kw) -> Backend:
    return Backend.from_config(BackendConfig(url=sim.base_url, engine="trtllm", name="t", **kw), 0)


def test_1_2_engine_is_read_from_its_iteration_statistics(module_servers):
    sim = module_servers.sim(engine="trtllm", token_rate=200)
    b = _backend(sim)
    # before any request trtllm-serve answers [] at once: nothing yet, and nothing is settled
    t0 = time.monotonic()
    assert asyncio.run(_scrape(b)) is None and time.monotonic() - t0 < 1.5
    _chat(sim)
    t0 = time.monotonic()
    got = asyncio.run(_scrape(b, within=6))
    took = time.monotonic() - t0
    # /prometheus/metrics had no load figures, so /metrics (JSON) was read: it answers only
    # after 2 s without an iteration, then holds the last one (the request's final step)
    assert b.scrape_state.current == 1 and b.scrape_state.seen_format == "trtllm_json"
    assert 1.9 <= took < 4
    # that step still counts the request it completed (numActiveRequests 1, numCompletedRequests 1):
    # nothing runs after it
    assert got["running"] == 0.0 and got["waiting"] == 0.0 and 0.0 <= got["kv_usage"] < 1.0
    assert got["prefix_queries"] > 0
    # drained: the next read has no new iteration and says so at once
    t0 = time.monotonic()
    assert asyncio.run(_scrape(b)) is None and time.monotonic() - t0 < 1.5


def test_1_3_engine_is_read_from_its_prometheus_gauges(module_servers):
    sim = module_servers.sim(engine="trtllm", token_rate=200, extra_args=["--trtllm-release", "1.3"])
    _chat(sim)
    b = _backend(sim)
    t0 = time.monotonic()
    got = asyncio.run(_scrape(b))
    assert time.monotonic() - t0 < 1.0          # the gauges are read at once, no 2 s wait
    assert b.scrape_state.current == 0 and b.scrape_state.seen_format == "prometheus"
    # frozen at the last step before the idle spell, as trtllm-serve's collector leaves them
    assert got["running"] == 1.0 and got["waiting"] == 0.0
    assert got["prefix_queries"] > 0 and "kv_usage" in got


def test_configured_format_is_used_as_is(module_servers):
    sim = module_servers.sim(engine="trtllm", token_rate=200)
    _chat(sim)
    # prometheus only, on a 1.2 engine: no load figures there, and no fallback
    b = _backend(sim, metrics_format="prometheus")
    assert asyncio.run(_scrape(b)) is None
    # the JSON endpoint named explicitly, format by detection
    b = _backend(sim, metrics_url=sim.url + "/metrics")
    got = asyncio.run(_scrape(b, within=6))
    assert got is not None and got["running"] == 0.0 and b.scrape_state.seen_format == "trtllm_json"


def test_iteration_statistics_body_has_the_serializers_keys(module_servers):
    sim = module_servers.sim(engine="trtllm", token_rate=200)
    _chat(sim)
    body = httpx.get(sim.url + "/metrics", timeout=10)
    assert body.headers["content-type"] == "application/json"
    stats = orjson.loads(body.content)
    ref = json.loads(ITER_JSON)[0]
    assert stats and all(set(s) == set(ref) for s in stats)
    for key in ("kvCacheStats", "staticBatchingStats", "inflightBatchingStats"):
        assert all(set(s[key]) == set(ref[key]) for s in stats), key
    iters = [s["iter"] for s in stats]
    assert iters == sorted(iters) and stats[-1]["numCompletedRequests"] == 1
