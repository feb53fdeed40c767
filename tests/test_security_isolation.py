"""Tenant isolation of the response cache (L3), over HTTP: tenant B never receives
tenant A's cached answer, exact or semantic, for the same prompt and image; no
header lets a request pick another tenant's cache scope; tenants that share a
configured ``cache_scope`` do share answers."""

from __future__ import annotations

import uuid

import httpx
import openai
import pytest

from conftest import SIM_MODEL, until as _until
from images import image_part
from test_security_support import sha

KEYS = {n: f"sk-{n}-{uuid.uuid4().hex}" for n in ("a", "b", "team1", "team2")}
HEADER = "x-vlm-gateway-cache"


@pytest.fixture(scope="module")
def gw(module_servers):
    sim = module_servers.sim()
    return module_servers.gateway({
        "cache": {"semantic": True},
        "auth": {"tenants": [
            {"name": "a", "key_sha256": sha(KEYS["a"])},
            {"name": "b", "key_sha256": sha(KEYS["b"])},
            {"name": "team1", "key_sha256": sha(KEYS["team1"]), "cache_scope": "team"},
            {"name": "team2", "key_sha256": sha(KEYS["team2"]), "cache_scope": "team"},
        ]}}, backends=[sim])


def ask(gw, key: str, text: str, img: dict, headers: dict | None = None) -> tuple[str, str]:
    c = openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0, timeout=30, default_headers=headers)
    raw = c.chat.completions.with_raw_response.create(
        model=SIM_MODEL, temperature=0, max_tokens=8,
        messages=[{"role": "user", "content": [{"type": "text", "text": text}, img]}])
    return raw.headers[HEADER], raw.parse().choices[0].message.content


def semantic_entries(gw) -> float:
    for line in httpx.get(gw.url + "/metrics").text.splitlines():
        if line.startswith('vlm_gateway_cache_entries{level="l3_semantic"}'):
            return float(line.split()[-1])
    return 0.0


def until(fn, timeout: float = 10.0):
    return _until(fn, timeout)


def test_exact_and_semantic_hits_stay_within_the_tenant(gw):
    img = image_part(320, 240, color=(uuid.uuid4().int % 256, 10, 200))
    # the image is unique to this run, so the partition is fresh
    question = "What is the total on this receipt?"
    para = "On this receipt, what is the total?"
    assert ask(gw, KEYS["a"], question, img)[0] == "miss"
    assert until(lambda: ask(gw, KEYS["a"], question, img)[0] == "hit-exact")
    assert until(lambda: semantic_entries(gw) >= 1)
    # the same tenant gets semantic hits on a paraphrase (so the semantic level is live)...
    state, _ = ask(gw, KEYS["a"], para, img)
    assert state in ("hit-semantic", "hit-normalized"), state
    # ...tenant B, same image, same and paraphrased question: never A's entry
    # (paraphrase first: B's own miss is stored and would serve B's later paraphrase)
    state, text = ask(gw, KEYS["b"], para, img)
    assert state == "miss", (state, text)
    # B's exact question: a miss, or a hit on B's own paraphrase entry (echo answers start with
    # the question asked), never A's answer
    state, text = ask(gw, KEYS["b"], question, img)
    assert state == "miss" or text.startswith(para), (state, text)


def test_no_header_chooses_the_cache_scope(gw):
    img = image_part(256, 256, color=(20, uuid.uuid4().int % 256, 20))
    q = f"Describe image {uuid.uuid4().hex[:6]}"
    assert ask(gw, KEYS["a"], q, img)[0] == "miss"
    assert until(lambda: ask(gw, KEYS["a"], q, img)[0] == "hit-exact")
    spoof = {"x-tenant": "a", "x-vlm-gateway-tenant": "a", "x-cache-scope": "tenant:a",
             "x-vlm-gateway-cache-scope": "tenant:a", "openai-organization": "a", "openai-project": "a"}
    assert ask(gw, KEYS["b"], q, img, headers=spoof)[0] == "miss"


def test_tenants_sharing_a_cache_scope_share_answers(gw):
    img = image_part(288, 288, color=(90, 90, uuid.uuid4().int % 256))
    q = f"Count the objects in {uuid.uuid4().hex[:6]}"
    assert ask(gw, KEYS["team1"], q, img)[0] == "miss"
    assert until(lambda: ask(gw, KEYS["team1"], q, img)[0] == "hit-exact")
    assert ask(gw, KEYS["team2"], q, img)[0] == "hit-exact"
    # a tenant named like the scope gets nothing from it
    assert ask(gw, KEYS["b"], q, img)[0] == "miss"
