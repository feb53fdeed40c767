"""API keys, tenants, per-tenant rate limits, request limits, admin endpoints and
secrets hygiene, over real HTTP against a real gateway and simulator processes,
with the OpenAI SDK as the client."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
import time
import uuid

import httpx
import openai
import pytest

from conftest import SIM_MODEL
from images import image_part
from test_security_support import sha

RUN = uuid.uuid4().hex[:8]
KEYS = {name: f"sk-{name}-{RUN}-{uuid.uuid4().hex}" for name in (
    "alpha", "beta", "narrow", "limited", "conc", "imgs", "capped", "vtok", "admin")}
UPSTREAM_SECRET = f"upstream-secret-{uuid.uuid4().hex}"


def tenant(name: str, **kw) -> dict:
    return {"name": name, "key_sha256": sha(KEYS[name]), **kw}


@pytest.fixture(scope="module")
def env(module_servers):
    sim = module_servers.sim()
    slow = module_servers.sim(token_rate=20, model="slow-sim")
    cfg = {
        "server": {"max_body_bytes": 2 * 1024 * 1024, "log_level": "debug"},
        "routing": {"eject_after_failures": 1000},
        "backends": [
            {"url": sim.base_url, "name": "sim0", "engine": "sim", "api_key": UPSTREAM_SECRET},
            {"url": slow.base_url, "name": "slow", "engine": "sim", "api_key": UPSTREAM_SECRET},
        ],
        "auth": {
            "admin_key_sha256": sha(KEYS["admin"]),
            "tenants": [
                tenant("alpha"), tenant("beta"),
                tenant("narrow", models=["slow-sim"]),
                tenant("limited", requests_per_minute=3),
                tenant("conc", concurrent_streams=2),
                tenant("imgs", images_per_minute=3),
                tenant("capped", max_tokens_cap=8),
                tenant("vtok", visual_tokens_per_minute=200),
            ],
        },
        "limits": {"max_messages": 5, "max_images_per_request": 3, "max_total_image_bytes": 40_000},
    }
    gw = module_servers.gateway(cfg)
    return {"gw": gw, "sim": sim, "slow": slow}


def client(env, key: str | None, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=env["gw"].base_url, api_key=key or "unused", max_retries=0, timeout=20, **kw)


def chat(c: openai.OpenAI, text: str = "hello", model: str = SIM_MODEL, **kw):
    return c.chat.completions.create(model=model, messages=[{"role": "user", "content": text}],
                                     max_tokens=kw.pop("max_tokens", 4), **kw)


def post(env, body: dict, key: str | None = None, headers: dict | None = None) -> httpx.Response:
    h = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.post(env["gw"].base_url + "/chat/completions", json=body, headers={**h, **(headers or {})},
                      timeout=20)


def body(text: str = "hello", model: str = SIM_MODEL, **kw) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 4, **kw}


# -- authentication ---------------------------------------------------------------------

def test_missing_key_is_401_in_openai_shape(env):
    r = post(env, body())
    assert r.status_code == 401
    err = r.json()["error"]
    assert err["type"] == "authentication_error" and err["code"] == "missing_api_key"
    assert set(err) == {"message", "type", "param", "code"}


def test_wrong_key_is_401_and_never_echoed(env):
    wrong = f"sk-wrong-{uuid.uuid4().hex}"
    with pytest.raises(openai.AuthenticationError) as ei:
        chat(client(env, wrong))
    assert ei.value.status_code == 401
    assert wrong not in ei.value.response.text
    # a near miss (a valid key with one character changed) is just as invalid
    near = KEYS["alpha"][:-1] + ("0" if KEYS["alpha"][-1] != "0" else "1")
    assert post(env, body(), near).status_code == 401
    # other schemes than Bearer are not accepted
    r = httpx.post(env["gw"].base_url + "/chat/completions", json=body(),
                   headers={"authorization": "Basic " + base64.b64encode(KEYS["alpha"].encode()).decode()})
    assert r.status_code == 401


def test_valid_key_is_served(env):
    r = chat(client(env, KEYS["alpha"]), "marker-valid-key")
    assert r.choices[0].message.content.startswith("marker-valid-key")


def test_model_not_allowed_is_403(env):
    with pytest.raises(openai.PermissionDeniedError) as ei:
        chat(client(env, KEYS["narrow"]))
    assert ei.value.code == "model_not_allowed"
    assert chat(client(env, KEYS["narrow"]), model="slow-sim", max_tokens=1).choices


def test_models_list_requires_a_key_and_is_filtered(env):
    assert httpx.get(env["gw"].base_url + "/models").status_code == 401
    ids = [m.id for m in client(env, KEYS["narrow"]).models.list()]
    assert ids == ["slow-sim"]
    assert set(m.id for m in client(env, KEYS["alpha"]).models.list()) == {SIM_MODEL, "slow-sim"}


def test_tenant_cannot_be_chosen_by_header(env):
    spoof = {"x-tenant": "alpha", "x-vlm-gateway-tenant": "alpha", "x-cache-scope": "tenant:alpha",
             "openai-organization": "alpha", "x-api-key": KEYS["alpha"]}
    # no key: the headers do not authenticate
    assert post(env, body(), headers=spoof).status_code == 401
    # narrow's key with alpha's headers is still narrow (403 on alpha's model)
    assert post(env, body(), KEYS["narrow"], headers=spoof).status_code == 403


# -- rate limits ------------------------------------------------------------------------

def test_requests_per_minute_429_with_headers(env):
    c = client(env, KEYS["limited"])
    seen = []
    for _ in range(3):
        raw = c.chat.completions.with_raw_response.create(
            model=SIM_MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=1)
        seen.append(raw.headers)
    assert [h["x-ratelimit-remaining-requests"] for h in seen] == ["2", "1", "0"]
    assert all(h["x-ratelimit-limit-requests"] == "3" for h in seen)
    assert seen[-1]["x-ratelimit-reset-requests"].endswith("s")
    with pytest.raises(openai.RateLimitError) as ei:
        chat(c)
    h = ei.value.response.headers
    assert ei.value.code == "rate_limit_exceeded"
    assert 1 <= int(h["retry-after"]) <= 20
    assert h["x-ratelimit-limit-requests"] == "3" and h["x-ratelimit-remaining-requests"] == "0"
    # another tenant is not affected
    assert chat(client(env, KEYS["beta"])).choices


def test_images_per_minute(env):
    c = client(env, KEYS["imgs"])
    msg = lambda n: [{"role": "user", "content": [{"type": "text", "text": "x"},
                                                  *[image_part(64 + 32 * i, 64) for i in range(n)]]}]
    r = c.chat.completions.with_raw_response.create(model=SIM_MODEL, messages=msg(2), max_tokens=1)
    assert r.headers["x-ratelimit-remaining-images"] == "1"
    with pytest.raises(openai.RateLimitError) as ei:
        c.chat.completions.create(model=SIM_MODEL, messages=msg(2), max_tokens=1)
    assert "images" in ei.value.message
    # text-only requests do not spend the image budget
    assert chat(c).choices


def test_visual_tokens_per_minute_charged_after_the_image_stage(env):
    c = client(env, KEYS["vtok"])
    img = [{"role": "user", "content": [{"type": "text", "text": "x"}, image_part(640, 480)]}]
    # the bucket (200) is positive: admitted, then charged the visual tokens actually sent (~300)
    r = c.chat.completions.with_raw_response.create(model=SIM_MODEL, messages=img, max_tokens=1)
    assert r.headers["x-ratelimit-limit-tokens"] == "200"
    sent = r.headers.get("x-vlm-gateway-visual-tokens", "")
    with pytest.raises(openai.RateLimitError) as ei:
        c.chat.completions.create(model=SIM_MODEL, messages=img, max_tokens=1)
    assert "visual tokens" in ei.value.message, sent
    assert ei.value.response.headers["x-ratelimit-remaining-tokens"] == "0"
    assert int(ei.value.response.headers["retry-after"]) >= 20
    # text-only requests are not held back by the visual-token budget
    assert chat(c).choices


def test_concurrent_streams_limit_released_on_abort(env):
    key = KEYS["conc"]
    url = env["gw"].base_url + "/chat/completions"
    long = body("slow stream", model="slow-sim", stream=True, max_tokens=200)
    h = {"authorization": f"Bearer {key}"}
    with httpx.Client(timeout=20) as hc:
        streams = [hc.stream("POST", url, json=long, headers=h) for _ in range(2)]
        responses = [s.__enter__() for s in streams]
        try:
            lines = [r.iter_lines() for r in responses]  # kept: a dropped iterator closes its stream
            for r, it in zip(responses, lines):
                assert r.status_code == 200
                assert next(it).startswith("data: ")  # the stream is flowing
            third = hc.post(url, json=body(model="slow-sim", max_tokens=1), headers=h)
            assert third.status_code == 429
            assert third.json()["error"]["code"] == "concurrency_limit_exceeded"
            assert third.headers["retry-after"] == "1"
        finally:
            # client aborts: both slots must be released by the gateway
            for s in streams:
                s.__exit__(None, None, None)
    deadline = time.time() + 5
    while time.time() < deadline:
        r = httpx.post(url, json=body(model="slow-sim", max_tokens=1), headers=h, timeout=20)
        if r.status_code == 200:
            break
        time.sleep(0.1)
    assert r.status_code == 200
    # and errors release too: an upstream 500 must not leak a slot
    env["slow"].sim_faults(fail_next=3, fail_status=500)
    for _ in range(3):
        httpx.post(url, json=body(model="slow-sim", max_tokens=1), headers=h, timeout=20)
    env["slow"].sim_faults(fail_next=0)
    oks = [httpx.post(url, json=body(model="slow-sim", max_tokens=1), headers=h, timeout=20).status_code
           for _ in range(3)]
    assert oks == [200, 200, 200]


def test_concurrency_slots_ignore_a_client_chosen_request_id(env):
    """Many requests sharing one x-request-id still take one slot each, and one of them
    finishing frees only its own slot."""
    url = env["gw"].base_url + "/chat/completions"
    h = {"authorization": f"Bearer {KEYS['conc']}", "x-request-id": "same-id-for-all"}
    long = body("slow stream", model="slow-sim", stream=True, max_tokens=200)
    with httpx.Client(timeout=20, limits=httpx.Limits(max_connections=20)) as hc:
        opened = []
        try:
            for _ in range(12):
                s = hc.stream("POST", url, json=long, headers=h)
                r = s.__enter__()
                opened.append((s, r, r.iter_lines()))  # kept: a dropped iterator closes its stream
                if r.status_code == 200:
                    next(opened[-1][2])  # flowing: its slot is held
            codes = [r.status_code for _, r, _ in opened]
            assert codes.count(200) == 2 and codes.count(429) == 10, codes
            # one of the two admitted streams ends: exactly one slot comes back
            first = next(i for i, (_, r, _) in enumerate(opened) if r.status_code == 200)
            opened.pop(first)[0].__exit__(None, None, None)
            deadline = time.time() + 5
            again = None
            while time.time() < deadline:
                s = hc.stream("POST", url, json=long, headers=h)
                again = s.__enter__()
                opened.append((s, again, again.iter_lines()))
                if again.status_code == 200:
                    next(opened[-1][2])
                    break
                time.sleep(0.1)
            assert again is not None and again.status_code == 200
            third = hc.post(url, json=body(model="slow-sim", max_tokens=1), headers=h)
            assert third.status_code == 429 and third.json()["error"]["code"] == "concurrency_limit_exceeded"
        finally:
            for s, _, _ in opened:
                s.__exit__(None, None, None)


# -- request limits ---------------------------------------------------------------------

def test_max_tokens_cap(env):
    c = client(env, KEYS["capped"])
    with pytest.raises(openai.BadRequestError) as ei:
        chat(c, max_tokens=100)
    assert ei.value.code == "max_tokens_exceeded" and "max_tokens_cap" in ei.value.message
    assert ei.value.param == "max_tokens"
    marker = f"cap-{uuid.uuid4().hex[:6]}"
    c.chat.completions.create(model=SIM_MODEL, messages=[{"role": "user", "content": marker}])
    sent = [b for b in env["sim"].sim_requests() if marker in str(b.get("messages"))]
    assert sent and sent[-1]["max_tokens"] == 8


def test_too_many_messages(env):
    msgs = [{"role": "user", "content": "x"}] * 6
    r = post(env, {"model": SIM_MODEL, "messages": msgs}, KEYS["alpha"])
    assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_messages"
    assert "max_messages" in r.json()["error"]["message"]


def test_too_many_images(env):
    parts = [image_part(40 + i, 40) for i in range(4)]
    r = post(env, {"model": SIM_MODEL, "messages": [{"role": "user", "content": parts}]}, KEYS["alpha"])
    assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_images"


def test_total_image_bytes(env):
    import os

    from images import data_uri
    big = {"type": "image_url", "image_url": {"url": data_uri(os.urandom(30_000))}}
    r = post(env, {"model": SIM_MODEL, "messages": [{"role": "user", "content": [big, big]}]}, KEYS["alpha"])
    assert r.status_code == 413 and r.json()["error"]["code"] == "image_bytes_too_large"
    assert "max_total_image_bytes" in r.json()["error"]["message"]


def test_body_size_limit(env):
    r = post(env, body("x" * (3 * 1024 * 1024)), KEYS["alpha"])
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"


# -- admin ------------------------------------------------------------------------------

def test_admin_endpoints_need_the_admin_key(env):
    base = env["gw"].url
    assert httpx.get(base + "/admin/status").status_code == 401
    assert httpx.get(base + "/admin/status", headers={"authorization": f"Bearer {KEYS['alpha']}"}).status_code == 403
    ok = httpx.get(base + "/admin/status", headers={"authorization": f"Bearer {KEYS['admin']}"})
    assert ok.status_code == 200 and {b["name"] for b in ok.json()["backends"]} == {"sim0", "slow"}
    # the admin key is not a tenant key
    assert post(env, body(), KEYS["admin"]).status_code == 401


def test_admin_drain_and_undrain(env):
    base, h = env["gw"].url, {"authorization": f"Bearer {KEYS['admin']}"}
    assert httpx.post(base + "/admin/backends/nope/drain", headers=h).status_code == 404
    assert httpx.post(base + "/admin/backends/slow/drain", headers=h).json()["drained"] is True
    try:
        r = post(env, body(model="slow-sim", max_tokens=1), KEYS["alpha"])
        assert r.status_code == 503
    finally:
        httpx.post(base + "/admin/backends/slow/undrain", headers=h)
    assert post(env, body(model="slow-sim", max_tokens=1), KEYS["alpha"]).status_code == 200


def test_admin_cache_flush(env):
    base, h = env["gw"].url, {"authorization": f"Bearer {KEYS['admin']}"}
    c = client(env, KEYS["alpha"])
    q = [{"role": "user", "content": f"flush me {uuid.uuid4().hex}"}]

    def state():
        raw = c.chat.completions.with_raw_response.create(model=SIM_MODEL, messages=q, max_tokens=2, temperature=0)
        return raw.headers["x-vlm-gateway-cache"]
    assert state() == "miss"
    deadline = time.time() + 5
    while state() != "hit-exact" and time.time() < deadline:
        time.sleep(0.05)
    assert state() == "hit-exact"
    # an image rewritten before the flush is in L1 ...
    img = [{"role": "user", "content": [{"type": "text", "text": "x"}, image_part(1000, 800, (9, 99, 199))]}]
    c.chat.completions.create(model=SIM_MODEL, messages=img, max_tokens=1)
    hits = l1_hits(env["gw"])
    c.chat.completions.create(model=SIM_MODEL, messages=img, max_tokens=1)
    assert l1_hits(env["gw"]) == hits + 1
    assert httpx.post(base + "/admin/cache/flush").status_code == 401
    r = httpx.post(base + "/admin/cache/flush", headers=h)
    assert r.status_code == 200 and sum(v or 0 for v in r.json()["flushed"].values()) >= 2
    assert state() == "miss"
    # ... and rewritten again after it (no L1 hit)
    hits = l1_hits(env["gw"])
    c.chat.completions.create(model=SIM_MODEL, messages=img, max_tokens=1)
    assert l1_hits(env["gw"]) == hits


def l1_hits(gw) -> float:
    m = re.search(r'^vlm_gateway_cache_hits_total\{level="l1"\} ([0-9.e+]+)$',
                  httpx.get(gw.url + "/metrics").text, re.M)
    return float(m.group(1)) if m else 0.0


def test_openapi_is_served(env):
    spec = httpx.get(env["gw"].url + "/openapi.json").json()
    assert spec["openapi"].startswith("3.")
    assert "/v1/chat/completions" in spec["paths"]


# -- secrets ----------------------------------------------------------------------------

def test_secrets_never_in_logs_metrics_or_errors(env):
    gw = env["gw"]
    # provoke every error path that sees a key
    for k in (KEYS["alpha"] + "x", KEYS["narrow"], KEYS["limited"], KEYS["admin"]):
        post(env, body(), k)
        post(env, body(stream=True), k)
    httpx.get(gw.url + "/admin/status", headers={"authorization": f"Bearer {KEYS['alpha']}"})
    env["sim"].sim_faults(fail_next=1, fail_status=500)
    last = post(env, body(), KEYS["beta"]).headers["x-request-id"]
    deadline = time.time() + 10
    while f"request_id={last}" not in gw.output():  # the last access log line is written
        assert time.time() < deadline
        time.sleep(0.02)
    texts = {"log": gw.output(), "metrics": httpx.get(gw.url + "/metrics").text,
             "status": httpx.get(gw.url + "/admin/status", headers={"authorization": f"Bearer {KEYS['admin']}"}).text}
    for where, text in texts.items():
        for name, key in KEYS.items():
            assert key not in text, f"{name} key found in {where}"
            assert key[:-8] not in text, f"a prefix of the {name} key found in {where}"
        assert UPSTREAM_SECRET not in text, f"upstream api_key found in {where}"


def test_public_bind_without_keys_warns(servers):
    sim = servers.sim()
    gw = servers.gateway({}, backends=[sim], extra_args=["--host", "0.0.0.0"])
    assert "without API keys" in gw.output()


def test_hash_key_cli():
    out = subprocess.run([sys.executable, "-m", "vlm_gateway", "hash-key", "sk-abc"], capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == sha("sk-abc")


def test_bad_key_digest_is_a_config_error(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("auth:\n  tenants:\n    - name: a\n      key_sha256: not-a-digest-but-the-plain-key-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\n")
    r = subprocess.run([sys.executable, "-m", "vlm_gateway", "serve", "--config", str(p)], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2 and "key_sha256" in r.stderr
