"""Every Redis use against a real Redis Cluster (three primaries, one replica each,
on loopback): two gateway processes, each pointed at a different node (one of them
a replica), share L1 images, L3 exact and semantic entries and the rate limits;
an admin flush empties the caches on every primary; killing a primary mid-load
gives no 5xx, and once its replica is promoted everything is shared again."""

from __future__ import annotations

import asyncio
import re
import shutil
import uuid

import httpx
import openai
import pytest
import redis
from redis.crc import key_slot

from conftest import SIM_MODEL, until
from images import image_part
from redis_cluster import LocalCluster
from test_security_support import sha
from waiting import async_wait_until, wait_until

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None or shutil.which("redis-cli") is None,
                                reason="redis-server and redis-cli are required")

PREFIX = "cl" + uuid.uuid4().hex[:8]
ADMIN = f"sk-admin-{uuid.uuid4().hex}"
KEYS = {n: f"sk-{n}-{uuid.uuid4().hex}" for n in ("rpm", "conc", "free")}


def _slot_owner(cluster: LocalCluster, slot: int) -> int:
    c = cluster.client()
    try:
        return int(c.nodes_manager.slots_cache[slot][0].port)
    finally:
        c.close()


@pytest.fixture(scope="module")
def env(module_servers, tmp_path_factory):
    cluster = LocalCluster(tmp_path_factory.mktemp("cluster")).start()
    tenants = [{"name": "rpm", "key_sha256": sha(KEYS["rpm"]), "requests_per_minute": 6},
               {"name": "conc", "key_sha256": sha(KEYS["conc"]), "concurrent_streams": 2},
               {"name": "free", "key_sha256": sha(KEYS["free"])}]
    # per primary, a "load" and an "after" tenant whose rate-limit slot it owns: the
    # failover tests take that primary away under load, and the "after" tenant's
    # limits can only hold across gateways again once its replica has been promoted
    primaries = cluster.primaries()
    for p in primaries:
        for kind in ("load", "after"):
            name = next(f"{kind}{i}" for i in range(10000)
                        if _slot_owner(cluster, key_slot(f"{kind}{i}".encode())) == p)
            KEYS[f"{kind}@{p}"] = f"sk-{name}-{uuid.uuid4().hex}"
            limits = {"requests_per_minute": 4} if kind == "after" else {
                "requests_per_minute": 100000, "images_per_minute": 100000,
                "visual_tokens_per_minute": 10**8, "concurrent_streams": 1000}
            tenants.append({"name": name, "key_sha256": sha(KEYS[f"{kind}@{p}"]), **limits})
    victim = primaries[0]
    sims = [module_servers.sim(token_rate=200) for _ in range(2)]
    replica = next(p for p in cluster.ports if p not in cluster.primaries())

    def cfg(url: str) -> dict:
        # cache lookups get 0.5 s rather than 50 ms: on a machine shared with other work a
        # late reply skips Redis for a second, and these tests check what is shared
        return {"redis_url": url, "redis_prefix": PREFIX, "cache": {"semantic": True, "redis_timeout_s": 0.5},
                "auth": {"admin_key_sha256": sha(ADMIN), "tenants": tenants}}
    a = module_servers.gateway(cfg(cluster.url_of(victim)), backends=sims)   # the node that will die
    b = module_servers.gateway(cfg(cluster.url_of(replica)), backends=sims)  # a replica
    yield {"a": a, "b": b, "cluster": cluster, "sims": sims, "victim": victim}
    cluster.stop()


def client(gw, key: str = KEYS["free"]) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0, timeout=30)


def metric(gw, name: str, labels: str = "") -> float:
    m = re.search(rf"^{name}{re.escape(labels)} ([0-9.e+]+)$", httpx.get(gw.url + "/metrics").text, re.M)
    return float(m.group(1)) if m else 0.0


def errors_logged(env) -> str:
    """The gateways' warnings, errors and tracebacks (for a failure's message)."""
    out = []
    for name in ("a", "b"):
        lines = env[name].output().splitlines()
        out += [f"{name}: {ln}" for ln in lines if "access" not in ln and ("WARNING" in ln or "ERROR" in ln
                                                                          or not ln[:4].isdigit())]
    return "\n".join(out[-150:])


def keys(env, pattern: str) -> set[str]:
    c = env["cluster"].client()
    try:
        return {k.decode() for k in c.scan_iter(match=pattern, count=1000)}
    finally:
        c.close()


def keys_per_primary(env, pattern: str) -> dict[int, int]:
    out = {}
    for p in env["cluster"].primaries():
        out[p] = sum(1 for _ in redis.Redis(port=p).scan_iter(match=pattern, count=1000))
    return out


def ask(c: openai.OpenAI, text: str, image: dict | None = None):
    content = [{"type": "text", "text": text}] + ([image] if image else [])
    return c.chat.completions.with_raw_response.create(model=SIM_MODEL, max_tokens=3, temperature=0,
                                                       messages=[{"role": "user", "content": content}])


async def test_the_mode_comes_from_the_server_and_a_burst_stays_bounded(env):
    from redis import Redis

    from vlm_gateway.redis_clients import MAX_CONNECTIONS, async_client
    cluster = env["cluster"]
    single = async_client("redis://127.0.0.1:6379/0", 1.0)
    c = async_client(cluster.url_of(cluster.ports[-1]), 2.0, client_name="vlmgw-burst")
    try:
        assert single.cluster is None and await single.ping() and single.cluster is False
        # a burst of lookups on keys of every slot range: none fails, and no node
        # holds more than the bound (redis-py fails calls beyond it instead of waiting)
        results = await asyncio.gather(*(c.eval("local t = redis.call('TIME') return 1", 1, f"{PREFIX}:burst:{i}")
                                         for i in range(5 * MAX_CONNECTIONS)))
        assert c.cluster is True and results == [1] * (5 * MAX_CONNECTIONS)
        for p in cluster.primaries():
            held = sum(1 for x in Redis(port=p).client_list() if x.get("name") == "vlmgw-burst")
            assert 0 < held <= MAX_CONNECTIONS, (p, held)
    finally:
        await c.aclose()
        await single.aclose()


async def test_rewritten_videos_are_shared_under_the_prefix_and_flushed(env):
    from dataclasses import fields

    from vlm_gateway.stages.video.l1 import VideoEntry, VideoL1
    meta = {f.name: (1 if f.type in ("int", int) else 1.0 if f.type in ("float", float) else "x")
            for f in fields(VideoEntry) if f.name != "data"}
    entry = VideoEntry(data=b"\0" * 5000, **meta)
    one = VideoL1(1 << 20, env["cluster"].url, redis_prefix=PREFIX)
    other = VideoL1(1 << 20, env["cluster"].url_of(env["cluster"].ports[-1]), redis_prefix=PREFIX)
    try:
        await one.put("clip", entry)
        assert keys(env, f"{PREFIX}:vid1:*") == {f"{PREFIX}:vid1:clip"}
        assert await other.get("clip") == entry   # another process: from the cluster
        assert await one.flush() >= 2 and not keys(env, f"{PREFIX}:vid1:*")
    finally:
        await one.close()
        await other.close()


def test_caches_are_shared_across_gateways_and_spread_over_every_primary(env):
    ca, cb = client(env["a"]), client(env["b"])
    questions = [f"what is {uuid.uuid4().hex}?" for _ in range(12)]
    for q in questions:
        assert ask(ca, q).headers["x-vlm-gateway-cache"] == "miss"
    # fills are written in the background
    assert until(lambda: len(keys(env, f"{PREFIX}:l3:*") - {f"{PREFIX}:l3:semantic"}) >= 12, 10), \
        errors_logged(env)
    for q in questions:
        r = ask(cb, q)
        assert r.headers["x-vlm-gateway-cache"] == "hit-exact" and r.headers["x-vlm-gateway-backend"] == "none"
    spread = keys_per_primary(env, f"{PREFIX}:l3:*")
    assert sum(1 for n in spread.values() if n) >= 2, spread

    # L1: an image rewritten by A is not rewritten again by B
    img = image_part(900, 700, color=(uuid.uuid4().int % 256, 40, 90))
    ask(ca, "first", img)
    assert until(lambda: keys(env, f"{PREFIX}:img1:*"))
    before = metric(env["b"], "vlm_gateway_cache_hits_total", '{level="l1"}')
    ask(cb, "second", img)
    assert metric(env["b"], "vlm_gateway_cache_hits_total", '{level="l1"}') == before + 1

    # semantic: the stream lives on one slot; B follows A's entries and hits a paraphrase
    receipt = image_part(320, 240, color=(240, 240, 230))
    assert ask(ca, "What is the total on this receipt?", receipt).headers["x-vlm-gateway-cache"] == "miss"
    assert until(lambda: metric(env["b"], "vlm_gateway_cache_entries", '{level="l3_semantic"}') >= 1, 10)
    assert until(lambda: ask(cb, "On this receipt, what is the total?", receipt)
                 .headers["x-vlm-gateway-cache"] == "hit-semantic", 10)


def test_rate_limits_and_concurrency_slots_are_global(env):
    ca, cb = client(env["a"], KEYS["rpm"]), client(env["b"], KEYS["rpm"])
    for i in range(6):
        assert ask(ca if i % 2 else cb, "x").http_response.status_code == 200
    for c in (ca, cb):
        with pytest.raises(openai.RateLimitError) as ei:
            ask(c, "x")
        assert ei.value.response.headers["x-ratelimit-remaining-requests"] == "0"
    # every key of a tenant shares its hash tag, so the Lua script's keys share a slot
    rl = keys(env, f"{PREFIX}:rl:*")
    assert f"{PREFIX}:rl:{{rpm}}:req" in rl

    h = {"authorization": f"Bearer {KEYS['conc']}"}
    long = {"model": SIM_MODEL, "messages": [{"role": "user", "content": "long"}], "max_tokens": 2000, "stream": True}
    short = {"model": SIM_MODEL, "messages": [{"role": "user", "content": "short"}], "max_tokens": 1}
    with httpx.Client(timeout=30) as hc:
        ctx = [hc.stream("POST", gw.base_url + "/chat/completions", json=long, headers=h) for gw in (env["a"], env["b"])]
        resps = [x.__enter__() for x in ctx]
        its = [r.iter_lines() for r in resps]  # kept: a dropped iterator closes its stream
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
    assert metric(env["a"], "vlm_gateway_ratelimit_redis_failures_total") == 0


def test_admin_flush_empties_the_caches_on_every_primary(env):
    ca = client(env["a"])
    for i in range(6):
        ask(ca, f"flush me {uuid.uuid4().hex}", image_part(900, 700, color=(i * 40, 7, 7)))
    assert until(lambda: sum(1 for n in keys_per_primary(env, f"{PREFIX}:img1:*").values() if n) >= 2, 10)
    q = f"asked before the flush {uuid.uuid4().hex}"
    ask(ca, q)
    assert until(lambda: ask(ca, q).headers["x-vlm-gateway-cache"] == "hit-exact")
    r = httpx.post(env["a"].url + "/admin/cache/flush", headers={"authorization": f"Bearer {ADMIN}"}, timeout=10)
    assert r.status_code == 200
    assert not keys(env, f"{PREFIX}:img1:*") and not keys(env, f"{PREFIX}:l3:*")
    assert keys(env, f"{PREFIX}:rl:*")  # limits are not a cache
    assert ask(ca, q).headers["x-vlm-gateway-cache"] == "miss"


async def _load(env, stop: asyncio.Event, key: str, out: list) -> list:
    """Requests through both gateways until ``stop``; every outcome (status or error),
    appended to ``out`` as it comes."""
    images = [image_part(300, 200, color=(i * 20, 90, 9)) for i in range(8)]
    pools = [openai.AsyncOpenAI(base_url=gw.base_url, api_key=key, max_retries=0, timeout=30)
             for gw in (env["a"], env["b"])]

    async def worker(i: int):
        n = 0
        while not stop.is_set():
            n += 1
            # repeated questions and images: L1 and L3 lookups as well as fills
            content = [{"type": "text", "text": f"q{(i * 7 + n) % 40}"}, images[(i + n) % len(images)]]
            try:
                r = await pools[i % 2].chat.completions.with_raw_response.create(
                    model=SIM_MODEL, max_tokens=3, temperature=0, messages=[{"role": "user", "content": content}])
                out.append(r.http_response.status_code)
            except openai.APIStatusError as e:
                out.append(e.status_code)
            except (openai.APIError, httpx.HTTPError) as e:
                out.append(repr(e))
    await asyncio.gather(*(worker(i) for i in range(8)))
    for p in pools:
        await p.close()
    return out


def _limits_on_redis(gw) -> bool:
    """The gateway's rate limiter has not failed, or last said that Redis answers again."""
    out = gw.output()
    return out.rfind("rate limits: Redis answers again") >= out.rfind("rate limits: Redis failed")


async def _take_away_and_recover(env, primary: int, how: str) -> None:
    """Take ``primary`` away under load (``kill``: the process dies and its port refuses;
    ``pause``: SIGSTOP, a host that stops answering without refusing), then check
    that nothing failed and that limits and caches are shared again once its replica
    has been promoted."""
    cluster = env["cluster"]
    replica = cluster.replica_of(primary)
    fallbacks = metric(env["a"], "vlm_gateway_ratelimit_redis_failures_total")
    stop = asyncio.Event()
    outcomes: list = []
    task = asyncio.create_task(_load(env, stop, KEYS[f"load@{primary}"], outcomes))
    await async_wait_until(lambda: len(outcomes) >= 40, "the load is under way (40 answers)", 30)
    (cluster.kill if how == "kill" else cluster.pause)(primary)
    promoted_after = await asyncio.get_running_loop().run_in_executor(None, cluster.wait_promoted, replica)
    # the load goes on until both gateways' rate limiters have found the promoted replica
    n = len(outcomes)
    await async_wait_until(lambda: len(outcomes) >= n + 40 and _limits_on_redis(env["a"]) and
                           _limits_on_redis(env["b"]), "40 more answers, and rate limits back on Redis", 30, 0.2)
    stop.set()
    statuses = await asyncio.wait_for(task, 60)
    if not statuses or any(s != 200 for s in statuses):
        pytest.fail(f"{[s for s in statuses if s != 200][:5]}\n{errors_logged(env)}", pytrace=False)
    # the primary owned the "load" tenant's buckets: rate limits fell back to in-process
    assert metric(env["a"], "vlm_gateway_ratelimit_redis_failures_total") > fallbacks
    assert promoted_after < 10

    # recovered: limits are global again on the promoted replica's slots ...
    def back_on_redis() -> bool:
        # a request through each gateway calls Redis once its back-off is over
        for gw in (env["a"], env["b"]):
            ask(client(gw, KEYS[f"load@{primary}"]), "probe")
        return _limits_on_redis(env["a"]) and _limits_on_redis(env["b"])
    await asyncio.to_thread(wait_until, back_on_redis, "both rate limiters are back on Redis", 15, 0.2)
    ca, cb = client(env["a"], KEYS[f"after@{primary}"]), client(env["b"], KEYS[f"after@{primary}"])
    for i in range(4):
        assert ask(ca if i % 2 else cb, "x").http_response.status_code == 200
    for c in (ca, cb):
        with pytest.raises(openai.RateLimitError):
            ask(c, "x")
    # ... and caches are shared again
    fa, fb = client(env["a"]), client(env["b"])
    questions = [f"after the failover {uuid.uuid4().hex}" for _ in range(12)]
    for q in questions:
        ask(fa, q)
    assert until(lambda: keys_per_primary(env, f"{PREFIX}:l3:*").get(replica, 0) > 0, 10)
    assert until(lambda: all(ask(fb, q).headers["x-vlm-gateway-cache"] == "hit-exact" for q in questions), 10)


async def test_killing_a_primary_mid_load_gives_no_5xx_and_recovers(env):
    # the primary gateway A's URL names: A finds the rest of the cluster without it
    await _take_away_and_recover(env, env["victim"], "kill")


async def test_a_primary_that_stops_answering_mid_load_gives_no_5xx_and_recovers(env):
    # no connection is refused: the clients learn of the promotion by re-reading the
    # slot map after commands time out
    cluster = env["cluster"]
    primary = next(p for p in cluster.primaries() if p != env["victim"] and
                   int(redis.Redis(port=p).info("replication").get("connected_slaves", 0)))
    await _take_away_and_recover(env, primary, "pause")
