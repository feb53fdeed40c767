"""Two gateway processes sharing one Redis: rate limits are global, an L1 (image)
or L3 (response) cache fill on one replica is a hit on the other, and killing one
replica mid-load loses nothing the other was serving."""

from __future__ import annotations

import asyncio
import re
import uuid

import httpx
import openai
import pytest

from conftest import SIM_MODEL, until
from images import image_part
from test_security_support import RedisServer, sha

KEYS = {n: f"sk-{n}-{uuid.uuid4().hex}" for n in ("rpm", "conc", "free")}


@pytest.fixture(scope="module")
def env(module_servers, tmp_path_factory):
    redis = RedisServer(str(tmp_path_factory.mktemp("redis"))).start()
    sims = [module_servers.sim(token_rate=20) for _ in range(2)]
    cfg = {"redis_url": redis.url,
           "auth": {"tenants": [{"name": "rpm", "key_sha256": sha(KEYS["rpm"]), "requests_per_minute": 6},
                                {"name": "conc", "key_sha256": sha(KEYS["conc"]), "concurrent_streams": 2},
                                {"name": "free", "key_sha256": sha(KEYS["free"])}]}}
    a = module_servers.gateway(cfg, backends=sims)
    b = module_servers.gateway(cfg, backends=sims)
    yield {"a": a, "b": b, "redis": redis, "sims": sims}
    redis.stop()


def client(gw, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0, timeout=30)


def l1_hits(gw) -> float:
    m = re.search(r'^vlm_gateway_cache_hits_total\{level="l1"\} ([0-9.e+]+)$',
                  httpx.get(gw.url + "/metrics").text, re.M)
    return float(m.group(1)) if m else 0.0


def test_requests_per_minute_is_global(env):
    ca, cb = client(env["a"], KEYS["rpm"]), client(env["b"], KEYS["rpm"])
    for i in range(6):
        c = ca if i % 2 else cb
        c.chat.completions.create(model=SIM_MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=1)
    for c in (ca, cb):
        with pytest.raises(openai.RateLimitError) as ei:
            c.chat.completions.create(model=SIM_MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=1)
        assert ei.value.response.headers["x-ratelimit-remaining-requests"] == "0"


def test_concurrent_streams_are_global(env):
    h = {"authorization": f"Bearer {KEYS['conc']}"}
    long = {"model": SIM_MODEL, "messages": [{"role": "user", "content": "long"}], "max_tokens": 200, "stream": True}
    short = {"model": SIM_MODEL, "messages": [{"role": "user", "content": "short"}], "max_tokens": 1}
    with httpx.Client(timeout=30) as hc:
        ctx = [hc.stream("POST", gw.base_url + "/chat/completions", json=long, headers=h)
               for gw in (env["a"], env["b"])]
        resps = [x.__enter__() for x in ctx]
        its = [r.iter_lines() for r in resps]
        try:
            for r, it in zip(resps, its):
                assert r.status_code == 200 and next(it).startswith("data: ")
            for gw in (env["a"], env["b"]):
                r = hc.post(gw.base_url + "/chat/completions", json=short, headers=h)
                assert r.status_code == 429 and r.json()["error"]["code"] == "concurrency_limit_exceeded"
        finally:
            for x in ctx:
                x.__exit__(None, None, None)
    assert until(lambda: httpx.post(env["b"].base_url + "/chat/completions", json=short, headers=h,
                                    timeout=30).status_code == 200)


def test_l3_fill_on_one_replica_is_a_hit_on_the_other(env):
    q = [{"role": "user", "content": f"what is {uuid.uuid4().hex}?"}]
    ca, cb = client(env["a"], KEYS["free"]), client(env["b"], KEYS["free"])
    ra = ca.chat.completions.with_raw_response.create(model=SIM_MODEL, messages=q, max_tokens=5, temperature=0)
    assert ra.headers["x-vlm-gateway-cache"] == "miss"
    # the fill is written in the background: wait until it is in Redis, then ask B once
    r = env["redis"].client()
    assert until(lambda: any(True for _ in r.scan_iter("vlmgw:l3:*", count=1000)))
    rb = cb.chat.completions.with_raw_response.create(model=SIM_MODEL, messages=q, max_tokens=5, temperature=0)
    assert rb.headers["x-vlm-gateway-cache"].startswith("hit")
    assert rb.headers["x-vlm-gateway-backend"] == "none"
    assert rb.parse().choices[0].message.content == ra.parse().choices[0].message.content


def test_l1_fill_on_one_replica_is_a_hit_on_the_other(env):
    img = image_part(900, 700, color=(uuid.uuid4().int % 256, 40, 90))
    ca, cb = client(env["a"], KEYS["free"]), client(env["b"], KEYS["free"])
    ca.chat.completions.create(model=SIM_MODEL, max_tokens=1,
                               messages=[{"role": "user", "content": [{"type": "text", "text": "first"}, img]}])
    r = env["redis"].client()
    before = l1_hits(env["b"])
    assert until(lambda: any(True for _ in r.scan_iter("vlmgw:img1:*", count=1000)))
    cb.chat.completions.create(model=SIM_MODEL, max_tokens=1,
                               messages=[{"role": "user", "content": [{"type": "text", "text": "second"}, img]}])
    assert l1_hits(env["b"]) == before + 1
    # and B sent the same rewritten bytes as A (deterministic rewrite, shared through Redis)
    sent = [m for s in env["sims"] for m in s.sim_requests()
            if any(isinstance(p, dict) and p.get("type") == "text" and p.get("text") in ("first", "second")
                   for p in (m.get("messages") or [{}])[-1].get("content") or [])]
    urls = {p["image_url"]["url"] for m in sent for p in m["messages"][-1]["content"] if p.get("type") == "image_url"}
    assert len(sent) == 2 and len(urls) == 1


@pytest.mark.slow
async def test_killing_one_replica_loses_nothing_the_other_serves(env, module_servers):
    a = module_servers.gateway({"redis_url": env["redis"].url}, backends=env["sims"])  # the one to kill
    b = env["b"]
    pools = {}
    for name, gw in (("a", a), ("b", b)):
        pools[name] = openai.AsyncOpenAI(base_url=gw.base_url, api_key=KEYS["free"], max_retries=0, timeout=60,
                                         http_client=httpx.AsyncClient(limits=httpx.Limits(max_connections=300)))
    n, tokens = 120, 30  # 1.5 s a stream at 20 tok/s
    results: dict[str, list] = {"a": [], "b": []}
    started: list = []

    async def one(name: str, i: int):
        m = f"m{uuid.uuid4().hex}"
        try:
            s = await pools[name].chat.completions.create(
                model=SIM_MODEL, messages=[{"role": "user", "content": m}], max_tokens=tokens, stream=True)
            text = []
            async for ch in s:
                if not text:
                    started.append(name)
                    if name == "a" and started.count("a") == n // 2:
                        # killed right here, not by a task the busy loop may wake late: half of
                        # A's streams have just begun and have 29 tokens to go
                        a.kill()
                if ch.choices and ch.choices[0].delta.content:
                    text.append(ch.choices[0].delta.content)
            results[name].append((m, "".join(text)))
        except (openai.APIError, httpx.HTTPError) as e:
            results[name].append((m, e))

    await asyncio.gather(*(one(name, i) for i in range(n) for name in ("a", "b")))
    # every request replica B was serving completed, in full, with its own answer
    assert len(results["b"]) == n
    for m, text in results["b"]:
        assert isinstance(text, str), text
        words = text.split()
        assert words[0] == m and len(words) == tokens
    # replica A's clients saw errors, not wrong or silently truncated answers
    lost = [r for r in results["a"] if not isinstance(r[1], str)]
    assert lost, "replica A was killed while serving: some of its clients must have seen an error"
    for m, text in results["a"]:
        if isinstance(text, str):
            words = text.split()
            assert words[0] == m and len(words) == tokens, "a truncated answer was delivered as complete"
    # B keeps serving
    r = await pools["b"].chat.completions.create(model=SIM_MODEL, messages=[{"role": "user", "content": "after"}],
                                                 max_tokens=2)
    assert r.choices[0].message.content.startswith("after")
    for p in pools.values():
        await p.close()
