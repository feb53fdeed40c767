"""Two deployments sharing one Redis with different ``redis_prefix`` values: every
key each writes (rate-limit buckets, concurrency slots, L1 images, L3 exact answers,
the semantic stream) starts with its own prefix, their limits are separate, and an
admin cache flush of one never deletes the other's keys."""

from __future__ import annotations

import subprocess
import sys
import uuid

import httpx
import pytest

from conftest import SIM_MODEL, until
from images import image_part
from test_security_support import RedisServer, sha

KEY, ADMIN = f"sk-team-{uuid.uuid4().hex}", f"sk-admin-{uuid.uuid4().hex}"


@pytest.fixture
def redis_server(tmp_path):
    r = RedisServer(str(tmp_path)).start()
    yield r
    r.stop()


def deployment(servers, sim, redis, prefix: str):
    return servers.gateway({
        "redis_url": redis.url, "redis_prefix": prefix, "cache": {"semantic": True},
        "auth": {"admin_key_sha256": sha(ADMIN),
                 # the same tenant name in both deployments: their limits must still be separate
                 "tenants": [{"name": "team", "key_sha256": sha(KEY), "requests_per_minute": 3,
                              "concurrent_streams": 4, "images_per_minute": 100}]}}, backends=[sim])


def ask(gw, text: str, image: dict | None = None) -> httpx.Response:
    content = [{"type": "text", "text": text}] + ([image] if image else [])
    return httpx.post(gw.base_url + "/chat/completions", timeout=30, headers={"authorization": f"Bearer {KEY}"},
                      json={"model": SIM_MODEL, "max_tokens": 2, "temperature": 0,
                            "messages": [{"role": "user", "content": content}]})


def keys(redis, pattern: str = "*") -> set[str]:
    return {k.decode() for k in redis.client().scan_iter(pattern, count=1000)}


def test_every_key_derives_from_the_prefix_and_a_flush_stays_in_its_deployment(servers, redis_server):
    sim = servers.sim()
    a = deployment(servers, sim, redis_server, "deploy-a")
    b = deployment(servers, sim, redis_server, "deploy-b")
    img = image_part(1000, 800, (20, 120, 220))
    for gw in (a, b):
        r = ask(gw, f"what is this {uuid.uuid4().hex}", img)
        assert r.status_code == 200, r.text
    # L3 answers and the semantic stream are written in the background
    for p in ("deploy-a", "deploy-b"):
        assert until(lambda: keys(redis_server, f"{p}:l3:*") - {f"{p}:l3:semantic"}, 10), p
        assert until(lambda: f"{p}:l3:semantic" in keys(redis_server), 10), p
        assert keys(redis_server, f"{p}:img1:*"), p
        assert keys(redis_server, f"{p}:rl:*"), p
    everything = keys(redis_server)
    assert everything and all(k.startswith(("deploy-a:", "deploy-b:")) for k in everything), everything

    # limits are per deployment: a uses up its 3 requests/minute, b still has its own
    assert [ask(a, "x").status_code for _ in range(3)] == [200, 200, 429]
    assert ask(b, "y").status_code == 200

    def lasting(ks: set[str]) -> set[str]:
        # a concurrency-slot set disappears by itself when its last slot is released
        return {k for k in ks if not k.endswith(":conc")}
    before_b = lasting(keys(redis_server, "deploy-b:*"))
    r = httpx.post(a.url + "/admin/cache/flush", headers={"authorization": f"Bearer {ADMIN}"}, timeout=10)
    assert r.status_code == 200
    assert not keys(redis_server, "deploy-a:img1:*") and not keys(redis_server, "deploy-a:l3:*")
    assert keys(redis_server, "deploy-a:rl:*")          # a flush of caches leaves limits alone
    assert before_b <= keys(redis_server, "deploy-b:*")  # nothing of b's was deleted


@pytest.mark.parametrize("prefix", ["a:b", "x*", "", "with space", "p" * 65])
def test_a_prefix_that_could_nest_or_glob_is_a_config_error(tmp_path, prefix):
    p = tmp_path / "c.yaml"
    p.write_text(f"redis_prefix: {prefix!r}\n")
    r = subprocess.run([sys.executable, "-m", "vlm_gateway", "serve", "--config", str(p)], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "redis_prefix" in r.stderr, r.stderr


def test_the_replaced_l3_prefix_key_says_where_it_went(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("cache: {redis_prefix: 'x:'}\n")
    r = subprocess.run([sys.executable, "-m", "vlm_gateway", "serve", "--config", str(p)], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2 and "cache.redis_prefix" in r.stderr and "replaced by redis_prefix" in r.stderr
