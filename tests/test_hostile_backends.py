"""Broken or hostile backends, over real HTTP: the gateway in its own process, the
backend a small aiohttp server in the test (tests/hostile.py). A 200 carrying an
error is a 502 and a failure of that backend; a huge non-streamed body is cut at
upstream.max_response_bytes; an SSE event that never ends is cut at
upstream.max_sse_event_bytes (the client never gets half an event); redirects are
never followed."""

from __future__ import annotations

import asyncio

import httpx
import orjson
import pytest
from aiohttp import web

from conftest import SIM_MODEL, until
from hostile import HostileBackend

BODY = {"model": SIM_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
MiB = 1024 * 1024


@pytest.fixture
def backends():
    started: list[HostileBackend] = []

    def make(handler, **kw) -> HostileBackend:
        b = HostileBackend(handler, **kw).start()
        started.append(b)
        return b
    yield make
    for b in started:
        b.stop()


def gateway(servers, *backends, **cfg):
    cfg.setdefault("routing", {})
    return servers.gateway({"backends": [{"url": b.base_url, "name": f"b{i}", "models": [SIM_MODEL]}
                                         for i, b in enumerate(backends)], **cfg})


def rss_peak_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def sse_events(text: str) -> list[str]:
    return [e for e in text.replace("\r\n", "\n").split("\n\n") if e.strip()]


# -- a 200 that is an error -------------------------------------------------------------

@pytest.mark.parametrize("payload", [
    {"error": {"message": "CUDA out of memory", "type": "InternalServerError", "code": 500}},
    {"object": "error", "message": "engine dead", "type": "InternalServerError", "code": 500},
    {"error": "plain string error"},
])
def test_a_200_with_an_error_is_a_502_and_a_backend_failure(servers, backends, payload):
    bad = backends(lambda r: asyncio.sleep(0, web.json_response(payload)))
    gw = gateway(servers, bad, routing={"eject_after_failures": 2, "eject_base_s": 30, "eject_max_s": 30})
    for _ in range(2):
        r = httpx.post(gw.base_url + "/chat/completions", json=BODY)
        assert r.status_code == 502, r.text
        e = r.json()["error"]
        assert e["type"] == "server_error" and e["code"] == "upstream_error_body"
        assert "b0" in e["message"]
    # counted as failures, like a 5xx (the log line, not the state: a probe may already have
    # let the next request through, half-open)
    assert until(lambda: "backend b0 ejected" in gw.output())


def test_an_error_event_in_a_200_stream_counts_as_a_failure(servers, backends):
    async def handler(request):
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"error": {"message": "engine died", "code": 500}}\n\ndata: [DONE]\n\n')
        return resp
    bad = backends(handler)
    gw = gateway(servers, bad, routing={"eject_after_failures": 1, "eject_base_s": 30, "eject_max_s": 30})
    r = httpx.post(gw.base_url + "/chat/completions", json={**BODY, "stream": True})
    assert r.status_code == 200 and "engine died" in r.text
    assert until(lambda: "backend b0 ejected" in gw.output())


def test_an_answer_without_choices_is_malformed(servers, backends):
    bad = backends(lambda r: asyncio.sleep(0, web.json_response({"id": "x", "object": "chat.completion"})))
    gw = gateway(servers, bad)
    r = httpx.post(gw.base_url + "/chat/completions", json=BODY)
    assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_malformed"


# -- a huge non-streamed body -----------------------------------------------------------

def test_a_huge_body_is_cut_at_the_cap(servers, backends):
    state_ = {}

    async def handler(request):
        resp = web.StreamResponse(headers={"content-type": "application/json"})
        await resp.prepare(request)
        block = b" " * (256 * 1024)
        try:
            for _ in range(1600):  # 400 MB
                await resp.write(block)
                state_["written"] = state_.get("written", 0) + len(block)
        except (ConnectionError, RuntimeError):
            pass
        return resp
    bad = backends(handler)
    gw = gateway(servers, bad, upstream={"max_response_bytes": 2 * MiB})
    peak = rss_peak_kb(gw.proc.pid)
    r = httpx.post(gw.base_url + "/chat/completions", json=BODY, timeout=60)
    assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_too_large", r.text
    assert "upstream.max_response_bytes" in r.json()["error"]["message"]
    assert until(lambda: state_.get("written", 0) > 0)
    assert state_["written"] < 64 * MiB, state_  # it stopped reading, the backend could not go on
    assert rss_peak_kb(gw.proc.pid) - peak < 64 * 1024


def test_a_declared_length_over_the_cap_is_refused_unread(servers, backends):
    async def handler(request):
        resp = web.StreamResponse(headers={"content-type": "application/json"})
        resp.content_length = 400 * MiB
        await resp.prepare(request)
        try:
            await resp.write(b"{")
            await asyncio.sleep(30)  # behaviour: the rest of the declared 400 MiB never comes
        except (ConnectionError, RuntimeError, asyncio.CancelledError):
            pass
        return resp
    bad = backends(handler)
    gw = gateway(servers, bad, upstream={"max_response_bytes": 2 * MiB})
    r = httpx.post(gw.base_url + "/chat/completions", json=BODY, timeout=20)
    assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_too_large"
    assert r.elapsed.total_seconds() < 10


# -- an SSE event that never ends -------------------------------------------------------

def test_an_endless_sse_event_is_cut_and_never_half_relayed(servers, backends):
    state_ = {}

    async def handler(request):
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        first = {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "ok "}}]}
        await resp.write(b"data: " + orjson.dumps(first) + b"\n\n")
        await resp.write(b'data: {"id": "c", "choices": [{"index": 0, "delta": {"content": "')
        try:
            for _ in range(800):  # 200 MB, no end of event
                await resp.write(b"x" * (256 * 1024))
                state_["written"] = state_.get("written", 0) + 256 * 1024
        except (ConnectionError, RuntimeError):
            pass
        return resp
    bad = backends(handler)
    # cacheable (temperature 0): the stream is also assembled, the quadratic case of old
    gw = gateway(servers, bad, upstream={"max_sse_event_bytes": 256 * 1024})
    r = httpx.post(gw.base_url + "/chat/completions", json={**BODY, "stream": True, "temperature": 0}, timeout=60)
    assert r.status_code == 200
    events = sse_events(r.text)
    assert "xxxx" not in r.text  # no byte of the oversized event reached the client
    assert orjson.loads(events[0][6:])["choices"][0]["delta"]["content"] == "ok "
    err = orjson.loads(events[-2][6:])["error"]
    assert err["code"] == "upstream_event_too_large" and events[-1] == "data: [DONE]"
    assert state_["written"] < 64 * MiB, state_


def test_events_split_across_reads_and_crlf_endings_relay_intact(servers, backends):
    chunks = [{"id": "c", "object": "chat.completion.chunk", "created": 1, "model": SIM_MODEL,
               "choices": [{"index": 0, "delta": {"content": w}, "finish_reason": None}]} for w in ("a ", "b ", "c")]
    raw = b"".join(b"data: " + orjson.dumps(c) + b"\r\n\r\n" for c in chunks) + b"data: [DONE]"  # no final blank line

    async def handler(request):
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(0, len(raw), 7):
            await resp.write(raw[i:i + 7])
            await asyncio.sleep(0.001)
        return resp
    gw = gateway(servers, backends(handler))
    r = httpx.post(gw.base_url + "/chat/completions", json={**BODY, "stream": True})
    events = sse_events(r.text)
    assert [orjson.loads(e[6:])["choices"][0]["delta"]["content"] for e in events[:-1]] == ["a ", "b ", "c"]
    assert events[-1] == "data: [DONE]"


# -- redirects --------------------------------------------------------------------------

def test_redirects_are_not_followed_and_are_retried_elsewhere(servers, backends):
    trap = backends(lambda r: asyncio.sleep(0, web.json_response({"choices": []})))

    async def redirect(request):
        raise web.HTTPTemporaryRedirect(trap.base_url + "/chat/completions")
    bad = backends(redirect)
    gw = gateway(servers, bad, routing={"max_retries": 0})
    for stream in (False, True):
        r = httpx.post(gw.base_url + "/chat/completions", json={**BODY, "stream": stream})
        assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_redirect", r.text
    assert trap.hits == 0  # the prompt was never re-posted to the redirect target
    sim = servers.sim()
    gw2 = servers.gateway({"backends": [{"url": bad.base_url, "name": "bad", "models": [SIM_MODEL]},
                                        {"url": sim.base_url, "name": "sim", "models": [SIM_MODEL]}],
                           "routing": {"policy": "round_robin"}})
    for _ in range(4):
        r = httpx.post(gw2.base_url + "/chat/completions", json=BODY)
        assert r.status_code == 200 and r.headers["x-vlm-gateway-backend"] == "sim"
    assert trap.hits == 0


def test_a_redirecting_health_probe_is_unhealthy(servers, backends):
    healthy = backends(lambda r: asyncio.sleep(0, web.json_response({})))
    bad = backends(lambda r: asyncio.sleep(0, web.json_response({})), health_status=302,
                   health_location=f"http://127.0.0.1:{healthy.port}/health")
    gw = servers.gateway({"backends": [{"url": bad.base_url, "name": "bad", "models": [SIM_MODEL]}]},
                         ready_path="/health")
    assert until(lambda: httpx.get(gw.url + "/ready").status_code == 503)
    assert "HTTP 302" in gw.output()


def test_a_long_event_is_buffered_in_linear_time():
    """One event fed in 4 KiB reads: four times the bytes cost about four times the CPU
    (re-splitting everything held on each read cost sixteen times: 8 MiB took 23 s)."""
    import time

    from vlm_gateway.proxy.sse import StreamWatcher

    def cost(size: int) -> float:
        w = StreamWatcher(assemble=True, max_event_bytes=1 << 30)
        part = b"x" * 4096
        t0 = time.process_time()
        w.feed(b'data: {"choices": [{"delta": {"content": "')
        for _ in range(size // 4096):
            w.feed(part)
        return time.process_time() - t0

    small = min(cost(2 * MiB) for _ in range(3))
    big = min(cost(8 * MiB) for _ in range(3))
    assert big / small < 8, (small, big)


def test_a_flood_on_the_model_list_probe_is_cut(servers, backends):
    """The health probe reads a backend's /v1/models: a hostile answer of any size costs
    at most 1 MiB, and the backend is unhealthy, with the reason in the log."""
    written = {}

    async def models(request):
        resp = web.StreamResponse(headers={"content-type": "application/json"})
        await resp.prepare(request)
        try:
            await resp.write(b'{"data": [{"id": "')
            for _ in range(400):
                await resp.write(b"m" * (256 * 1024))
                written["n"] = written.get("n", 0) + 256 * 1024
        except (ConnectionError, RuntimeError):
            pass
        return resp
    bad = backends(lambda r: asyncio.sleep(0, web.json_response({})), models_handler=models)
    gw = servers.gateway({"backends": [{"url": bad.base_url, "name": "flood"}]}, ready_path="/health")
    assert until(lambda: "backend flood is unhealthy" in gw.output(), 10)
    assert "larger than" in gw.output()
    assert written.get("n", 0) < 64 * MiB


def test_a_null_error_field_is_not_an_error(servers, backends):
    ok = {"id": "x", "object": "chat.completion", "created": 1, "model": SIM_MODEL, "error": None,
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "fine"}, "finish_reason": "stop"}]}
    gw = gateway(servers, backends(lambda r: asyncio.sleep(0, web.json_response(ok))))
    r = httpx.post(gw.base_url + "/chat/completions", json=BODY)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "fine"
