"""L3 cache with Redis: shared by gateway processes, semantic entries followed by
every replica, tenant isolation at the semantic level, and a Redis that stops or
stalls mid-run (each test starts its own redis-server on a free port)."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import time

import httpx
import openai
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from conftest import free_port, until as _until
from test_cache import HEADER, ask, fresh, png, user

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")


class RedisProc:
    def __init__(self, tmp: str, *extra: str) -> None:
        self.port = free_port()
        # DEBUG SLEEP (the stall below) is refused by Redis >= 7 unless enabled for local clients
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                                      "--save", "", "--appendonly", "no", "--dir", tmp,
                                      "--enable-debug-command", "local", *extra],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        client = redis.Redis(port=self.port)
        deadline = time.time() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.time() > deadline:
                    raise
                time.sleep(0.05)
        self.client = client

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)


@pytest.fixture
def redis_server(tmp_path):
    r = RedisProc(str(tmp_path), "--enable-debug-command", "yes")
    yield r
    r.stop()


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()



def semantic_entries(gw) -> float:
    """The process's semantic index size, from its /metrics."""
    for line in httpx.get(gw.url + "/metrics", timeout=5).text.splitlines():
        if line.startswith('vlm_gateway_cache_entries{level="l3_semantic"}'):
            return float(line.split()[-1])
    return 0.0


SEMANTIC = {"cache": {"semantic": True},
            "auth": {"tenants": [{"name": "team-a", "key_sha256": _sha("key-a")},
                                 {"name": "team-b", "key_sha256": _sha("key-b")}]}}


def test_two_gateways_share_exact_and_semantic_entries(servers, redis_server):
    sim = servers.sim(echo=True)
    cfg = {**SEMANTIC, "redis_url": redis_server.url}
    gw1 = servers.gateway(cfg, backends=[sim])
    gw2 = servers.gateway(cfg, backends=[sim])
    a1 = openai.OpenAI(base_url=gw1.base_url, api_key="key-a", max_retries=0)
    a2 = openai.OpenAI(base_url=gw2.base_url, api_key="key-a", max_retries=0)
    b1 = openai.OpenAI(base_url=gw1.base_url, api_key="key-b", max_retries=0)
    receipt = png((240, 240, 230))
    question = "What is the total on this receipt?"

    assert ask(a1, [user(question, receipt)])[0] == "miss"
    # exact entry written to Redis in the background: the other process hits
    assert _until(lambda: ask(a2, [user(question, receipt)])[0] == "hit-exact")

    # semantic, same process: a reordered question is a hit and reports its similarity
    # (entries are indexed in the background: wait until this one is)
    assert _until(lambda: semantic_entries(gw1) >= 1)
    para = "On this receipt, what is the total?"
    raw = a1.chat.completions.with_raw_response.create(model="qwen3vl-sim", temperature=0, max_tokens=6,
                                                      messages=[user(para, receipt)])
    assert raw.headers[HEADER] == "hit-semantic"
    assert 0.97 <= float(raw.headers["x-vlm-gateway-cache-similarity"]) <= 1.0
    assert raw.parse().choices[0].message.content == ask(a1, [user(question, receipt)])[1]
    # near misses and another image never hit
    assert ask(a1, [user("What is the tax on this receipt?", receipt)])[0] == "miss"
    assert ask(a1, [user(para, png((10, 240, 230)))])[0] == "miss"
    # another tenant, same image: a paraphrase that is a semantic hit for A is a miss for B
    para2 = "In this receipt, what is the total?"
    assert ask(b1, [user(para2, receipt)])[0] == "miss"
    assert ask(a1, [user(para2, receipt)])[0] == "hit-semantic"
    # the second process followed the semantic entries through Redis
    assert _until(lambda: semantic_entries(gw2) >= semantic_entries(gw1) >= 1)
    assert ask(a2, [user(para, receipt)])[0] == "hit-semantic"
    # a replica started later loads the persisted entries before it serves
    gw3 = servers.gateway(cfg, backends=[sim])
    assert semantic_entries(gw3) >= semantic_entries(gw1)
    a3 = openai.OpenAI(base_url=gw3.base_url, api_key="key-a", max_retries=0)
    assert ask(a3, [user(para, receipt)])[0] == "hit-semantic"


def test_redis_stopped_or_stalled_mid_run_counts_as_a_miss(servers, redis_server):
    sim = servers.sim(echo=True)
    gw = servers.gateway({"redis_url": redis_server.url, "cache": {"redis_retry_s": 0.5}}, backends=[sim])
    client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=10)
    q1 = [user(fresh("before"))]
    assert ask(client, q1)[0] == "miss"
    assert _until(lambda: redis_server.client.dbsize() > 0)

    # Redis stalls (a blocking command holds its only thread for 2 s): lookups time out -> miss
    stall = subprocess.Popen(["redis-cli", "-p", str(redis_server.port), "DEBUG", "SLEEP", "2"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    probe = redis.Redis(port=redis_server.port, socket_timeout=0.05, socket_connect_timeout=0.05,
                        retry=Retry(NoBackoff(), 0))  # one try: a timeout is the answer

    def stalled() -> bool:
        try:
            probe.ping()
            return False
        except redis.exceptions.TimeoutError:
            return True
    assert _until(stalled)  # Redis is now blocked (no fixed sleep)
    probe.close()
    t0 = time.time()
    h, text, _ = ask(client, [user(fresh("stalled"))])
    assert h == "miss" and text and time.time() - t0 < 1.5
    stall.wait(10)

    redis_server.stop()
    for i in range(3):
        q = [user(fresh(f"down{i}"))]
        t0 = time.time()
        h, text, _ = ask(client, q)
        assert h == "miss" and text and time.time() - t0 < 1.5
        assert ask(client, q)[0] == "hit-exact"  # the in-process level still serves
    assert ask(client, q1)[0] == "hit-exact"
    r = client.chat.completions.with_raw_response.create(model="qwen3vl-sim", temperature=0.5, max_tokens=3,
                                                        messages=[user("plain request")])
    assert r.status_code == 200 and r.headers[HEADER] == "bypass"
