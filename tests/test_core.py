"""The core gateway, end to end: real gateway and simulator processes on loopback,
driven with the official OpenAI SDK exactly as a user would."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import httpx
import openai
import pytest

from conftest import SIM_MODEL, free_port
from images import image_part

@pytest.fixture(scope="module")
def stack(module_servers):
    sim = module_servers.sim(profile="fast", echo=True, token_rate=2000)
    gw = module_servers.gateway({"server": {"keepalive_interval_s": 0.2}}, backends=[sim])
    return sim, gw


def client(gw, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, **kw)


def aclient(gw, **kw) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, **kw)


def vision_messages(text: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": text}, image_part()]}]


# -- happy paths -----------------------------------------------------------------------

def test_sync_non_stream_with_image(stack):
    sim, gw = stack
    raw = client(gw).chat.completions.with_raw_response.create(
        model=SIM_MODEL, messages=vision_messages("marker-sync-1 describe"), max_tokens=8)
    resp = raw.parse()
    assert resp.choices[0].message.content.startswith("marker-sync-1 describe")
    assert resp.usage.completion_tokens == 8
    assert float(raw.headers["x-vlm-gateway-overhead-ms"]) >= 0
    assert raw.headers["x-vlm-gateway-backend"] == "sim0"
    assert raw.headers["x-request-id"]


def test_sync_stream_with_usage(stack):
    sim, gw = stack
    stream = client(gw).chat.completions.create(
        model=SIM_MODEL, messages=vision_messages("marker-stream-2"), max_tokens=6, stream=True,
        stream_options={"include_usage": True})
    text, usage = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage:
            usage = chunk.usage
    assert text.startswith("marker-stream-2")
    assert usage is not None and usage.completion_tokens == 6


async def test_async_stream_and_non_stream(stack):
    sim, gw = stack
    c = aclient(gw)
    r = await c.chat.completions.create(model=SIM_MODEL, messages=vision_messages("marker-async-3"), max_tokens=4)
    assert r.choices[0].message.content.startswith("marker-async-3")
    s = await c.chat.completions.create(model=SIM_MODEL, messages=vision_messages("marker-async-4"),
                                        max_tokens=4, stream=True)
    text = "".join([ch.choices[0].delta.content or "" async for ch in s if ch.choices])
    assert text.startswith("marker-async-4")
    await c.close()


def test_completions_pass_through(stack):
    sim, gw = stack
    r = client(gw).completions.create(model=SIM_MODEL, prompt="hello there", max_tokens=3)
    assert len(r.choices[0].text.split()) == 3
    chunks = list(client(gw).completions.create(model=SIM_MODEL, prompt="x", max_tokens=3, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices).count(" ") == 3


def test_unknown_fields_reach_the_engine(stack):
    sim, gw = stack
    extra = {"ignore_eos": True, "top_k": 7, "mm_processor_kwargs": {"max_pixels": 1234},
             "chat_template_kwargs": {"enable_thinking": False}, "some_future_field": [1, {"a": 2}]}
    client(gw).chat.completions.create(model=SIM_MODEL, messages=[{"role": "user", "content": "unknown-fields-5"}],
                                       max_tokens=2, extra_body=extra)
    body = next(b for b in reversed(sim.sim_requests()) if "unknown-fields-5" in json.dumps(b))
    for k, v in extra.items():
        assert body[k] == v


def test_models_health_ready_metrics(stack):
    sim, gw = stack
    assert [m.id for m in client(gw).models.list()] == [SIM_MODEL]
    assert httpx.get(gw.url + "/health").json()["status"] == "ok"
    assert httpx.get(gw.url + "/ready").status_code == 200
    text = httpx.get(gw.url + "/metrics").text
    assert 'vlm_gateway_requests_total{model="qwen3vl-sim",route="chat",status="200"}' in text
    assert "vlm_gateway_overhead_seconds_bucket" in text


def test_request_id_is_echoed_and_sent_upstream(stack):
    sim, gw = stack
    r = httpx.post(gw.base_url + "/chat/completions", headers={"x-request-id": "trace-abc-123"},
                   json={"model": SIM_MODEL, "messages": [{"role": "user", "content": "rid"}], "max_tokens": 1})
    assert r.status_code == 200 and r.headers["x-request-id"] == "trace-abc-123"


# -- streaming behaviour -----------------------------------------------------------------

def test_keepalives_before_slow_first_token(stack):
    sim, gw = stack
    sim.sim_faults(stall_next=1, stall_s=1.0)
    lines = []
    with httpx.stream("POST", gw.base_url + "/chat/completions", timeout=10, json={
            "model": SIM_MODEL, "messages": [{"role": "user", "content": "slow"}], "max_tokens": 2,
            "stream": True}) as r:
        assert r.headers["x-accel-buffering"] == "no"
        for line in r.iter_lines():
            if line:
                lines.append(line)
    first_data = next(i for i, l in enumerate(lines) if l.startswith("data:"))
    assert first_data >= 2 and all(l == ": keepalive" for l in lines[:first_data])
    assert lines[-1] == "data: [DONE]"


@pytest.mark.parametrize("stream", [True, False])
def test_client_disconnect_cancels_upstream(servers, stream):
    sim = servers.sim(profile="fast", token_rate=20)  # 200 tokens take 10 s
    gw = servers.gateway({}, backends=[sim])
    before = sim.sim_stats()["aborted"]
    body = {"model": SIM_MODEL, "messages": [{"role": "user", "content": "long"}], "max_tokens": 200,
            "stream": stream}
    if stream:
        # read the first chunk, then hang up
        with httpx.stream("POST", gw.base_url + "/chat/completions", json=body, timeout=5) as r:
            assert next(r.iter_bytes()).startswith(b"data:")
    else:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(gw.base_url + "/chat/completions", json=body, timeout=0.5)
    deadline = time.time() + 5
    while time.time() < deadline and sim.sim_stats()["aborted"] == before:
        time.sleep(0.05)
    stats = sim.sim_stats()
    assert stats["aborted"] == before + 1
    assert stats["running"] == 0


async def test_200_concurrent_streams_each_get_their_own(stack):
    sim, gw = stack
    c = openai.AsyncOpenAI(base_url=gw.base_url, api_key="unused", max_retries=0,
                           http_client=httpx.AsyncClient(limits=httpx.Limits(max_connections=300), timeout=60))

    async def one(i: int) -> tuple[int, str, str | None]:
        s = await c.chat.completions.create(
            model=SIM_MODEL, messages=[{"role": "user", "content": f"marker-{i:04d}-x"}], max_tokens=12,
            stream=True)
        text, finish = "", None
        async for ch in s:
            if ch.choices:
                text += ch.choices[0].delta.content or ""
                finish = ch.choices[0].finish_reason or finish
        return i, text, finish

    results = await asyncio.gather(*(one(i) for i in range(200)))
    await c.close()
    for i, text, finish in results:
        words = text.split()
        assert words[0] == f"marker-{i:04d}-x", (i, text)
        assert len(words) == 12 and finish == "length"
        assert sum(w.startswith("marker-") for w in words) == 1


# -- failures and errors -------------------------------------------------------------------

def _err(r: httpx.Response) -> dict:
    body = r.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert "Traceback" not in r.text
    return body["error"]


@pytest.mark.parametrize("payload,param,code", [
    (b"{not json", None, "invalid_json"),
    (b"[1, 2]", None, "invalid_json"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode(), "model", "missing_required_parameter"),
    (json.dumps({"model": SIM_MODEL, "messages": "hi"}).encode(), "messages", "invalid_type"),
    (json.dumps({"model": SIM_MODEL, "messages": [{"role": "user", "content": 5}]}).encode(),
     "messages[0].content", "invalid_type"),
    (json.dumps({"model": SIM_MODEL, "messages": [{"role": "user", "content": "x"},
                                                  {"role": "user", "content": [{"type": "audio_blob"}]}]}).encode(),
     "messages[1].content[0].type", "invalid_value"),
    (json.dumps({"model": SIM_MODEL, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": 7}}]}]}).encode(), "messages[0].content[0].image_url",
     "invalid_type"),
    (json.dumps({"model": SIM_MODEL, "stream": "yes", "messages": [{"role": "user", "content": "x"}]}).encode(),
     "stream", "invalid_type"),
    (json.dumps({"model": SIM_MODEL, "max_tokens": "5", "messages": [{"role": "user", "content": "x"}]}).encode(),
     "max_tokens", "invalid_type"),
])
def test_bad_input_is_a_clear_400(stack, payload, param, code):
    sim, gw = stack
    r = httpx.post(gw.base_url + "/chat/completions", content=payload, headers={"content-type": "application/json"})
    assert r.status_code == 400
    err = _err(r)
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["code"] == code


def test_unknown_model_is_404(stack):
    sim, gw = stack
    with pytest.raises(openai.NotFoundError) as e:
        client(gw).chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"


def test_body_over_limit_is_413(servers):
    sim = servers.sim()
    gw = servers.gateway({"server": {"max_body_bytes": 10_000}}, backends=[sim])
    big = {"model": SIM_MODEL, "messages": [{"role": "user", "content": "x" * 20_000}]}
    r = httpx.post(gw.base_url + "/chat/completions", json=big)
    assert r.status_code == 413 and _err(r)["code"] == "body_too_large"
    # also when the client streams the body without a content-length
    r = httpx.post(gw.base_url + "/chat/completions", content=iter([json.dumps(big).encode()]),
                   headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert httpx.post(gw.base_url + "/chat/completions", json={
        "model": SIM_MODEL, "messages": [{"role": "user", "content": "ok"}], "max_tokens": 1}).status_code == 200


def test_no_healthy_upstream_is_503_with_retry_after(servers):
    dead = f"http://127.0.0.1:{free_port()}/v1"
    gw = servers.gateway({"backends": [{"url": dead, "models": [SIM_MODEL]}]}, ready_path="/health")
    assert httpx.get(gw.url + "/ready").status_code == 503
    r = httpx.post(gw.base_url + "/chat/completions", json={"model": SIM_MODEL,
                                                           "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 503 and r.headers["retry-after"]
    assert _err(r)["code"] == "no_healthy_backend"


def test_upstream_timeout_is_504_and_others_unaffected(servers):
    sim = servers.sim(echo=True)
    gw = servers.gateway({"upstream": {"read_timeout_s": 0.5}}, backends=[sim])
    sim.sim_faults(stall_next=1, stall_s=3.0)
    r = httpx.post(gw.base_url + "/chat/completions", timeout=10, json={
        "model": SIM_MODEL, "messages": [{"role": "user", "content": "stalled"}], "max_tokens": 1})
    assert r.status_code == 504 and _err(r)["code"] == "upstream_timeout"
    ok = client(gw).chat.completions.create(model=SIM_MODEL, messages=[{"role": "user", "content": "fine-1"}],
                                            max_tokens=2)
    assert ok.choices[0].message.content.startswith("fine-1")


def test_connect_failure_is_retried_on_another_upstream(servers):
    sim = servers.sim(echo=True)
    dead = f"http://127.0.0.1:{free_port()}/v1"
    gw = servers.gateway({"backends": [{"url": dead, "name": "dead", "models": [SIM_MODEL]},
                                       {"url": sim.base_url, "name": "live", "engine": "sim"}],
                          "routing": {"policy": "round_robin", "health_interval_s": 30}})
    c = client(gw)
    for i in range(6):
        raw = c.chat.completions.with_raw_response.create(
            model=SIM_MODEL, messages=[{"role": "user", "content": f"retry-{i}"}], max_tokens=1)
        assert raw.headers["x-vlm-gateway-backend"] == "live"
        assert raw.parse().choices[0].message.content.startswith(f"retry-{i}")


def test_upstream_5xx_before_first_byte_is_retried(servers):
    a = servers.sim(echo=True)
    b = servers.sim(echo=True)
    gw = servers.gateway({"routing": {"policy": "round_robin"}}, backends=[a, b])
    a.sim_faults(fail_next=5, fail_status=503)
    b.sim_faults(fail_next=5, fail_status=503)
    # each request hits one failing backend at most once per attempt; 3 attempts over 2 backends
    r = httpx.post(gw.base_url + "/chat/completions", json={
        "model": SIM_MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1})
    assert r.status_code == 503 and _err(r)["type"] == "server_error"


# -- CLI and configuration -------------------------------------------------------------------

def _cli(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vlm_gateway", *args], capture_output=True, text=True,
                          timeout=30, env={**os.environ, **(env or {})})


def test_bad_config_names_the_key_and_exits_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("images:\n  max_long_side: big\n")
    r = _cli("serve", "--config", str(bad))
    assert r.returncode == 2
    assert "images.max_long_side" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    bad.write_text("server:\n  prot: 80\n")
    r = _cli("serve", "--config", str(bad))
    assert r.returncode == 2 and "server.prot: unknown key" in r.stderr
    r = _cli("serve", env={"VLM_GATEWAY_SERVER__PORT": "notaport"})
    assert r.returncode == 2 and "server.port" in r.stderr


def test_env_overrides_config_and_example_config_loads(tmp_path):
    from vlm_gateway import load_config
    cfg = load_config("examples/gateway.yaml", environ={"VLM_GATEWAY_SERVER__PORT": "9123",
                                                        "VLM_GATEWAY_REDIS_URL": "redis://127.0.0.1:6379/3"})
    assert cfg.server.port == 9123 and cfg.redis_url == "redis://127.0.0.1:6379/3"
    assert len(cfg.backends) == 2 and cfg.backends[0].engine == "vllm"


def test_serve_with_no_backend_starts_the_simulator_loudly(servers):
    port = free_port()
    p = servers._spawn(["serve", "--port", str(port)], port, "gateway", ready_path="/ready")
    r = httpx.post(p.base_url + "/chat/completions", json={
        "model": SIM_MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2})
    assert r.status_code == 200 and r.headers["x-vlm-gateway-backend"] == "simulator"
    assert "SIMULATOR" in p.output() and "NOT a model" in p.output()


def test_backend_flag_adds_upstreams(servers):
    sim = servers.sim()
    port = free_port()
    p = servers._spawn(["serve", "--port", str(port), "--backend", sim.base_url], port, "gateway",
                       ready_path="/ready")
    assert [m["id"] for m in httpx.get(p.base_url + "/models").json()["data"]] == [SIM_MODEL]
    assert "SIMULATOR" not in p.output()
