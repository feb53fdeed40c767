"""The request path in process: the real gateway (stage chain, pool, breaker, admission
queue, relay, completion endpoint) over a scripted upstream (tests/transport.py) and
a clock moved by hand. No processes, sockets or sleeps: each outcome is decided by
what the upstream answers and by the clock, so these run the same way every time.
The real-process layer (tests/test_routing.py, test_faults.py, test_security.py)
checks the same behaviour end to end against the simulator."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest
from prometheus_client import REGISTRY

from vlm_gateway import load_config
from vlm_gateway.config import TenantConfig
from vlm_gateway.core.request import parse_chat
from vlm_gateway.proxy.endpoints import CompletionEndpoint
from vlm_gateway.proxy.gateway import Gateway
from vlm_gateway.stages.auth import TENANT
from vlm_gateway.stages.ratelimit import Limiter, RateLimit

from transport import Answer, ManualClock, ScriptedTransport, completion


def metric(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def config(n: int = 2, cache: bool = False, **routing):
    backends = [{"url": f"http://127.0.0.1:{9 + i}/v1", "name": f"b{i}", "models": ["m"]} for i in range(n)]
    profiles = {}
    if "slots" in routing:
        profiles = {"one": {"base": "h200", "max_num_seqs": routing.pop("slots")}}
        for b in backends:
            b["profile"] = "one"
    return load_config(None, environ={}, overrides={
        "backends": backends, "profiles": profiles, "cache": {"enabled": cache, "mode": "always"},
        "routing": {"policy": "round_robin", "health_interval_s": 3600, **routing}})


class Upstream:
    """What each backend answers for a chat completion, by name: a list taken in order
    (the last one repeats); /health and /v1/models always answer."""

    def __init__(self, **script) -> None:
        self.script = {k: list(v) for k, v in script.items()}
        self.sent: list[str] = []

    def __call__(self, name, method, path, body):
        if path.endswith("/health"):
            return Answer(200, b"")
        if path.endswith("/models"):
            return Answer(200, orjson.dumps({"data": [{"id": "m"}]}))
        self.sent.append(name)
        answers = self.script.get(name) or [completion()]
        return answers.pop(0) if len(answers) > 1 else answers[0]


async def call(gw: Gateway, stream: bool = False) -> tuple[int, dict[str, str], bytes]:
    raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream,
                        **({"stream_options": {"include_usage": True}} if stream else {})})
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "state": {},
             "headers": [(b"content-type", b"application/json")]}
    got = asyncio.Event()
    sent: list[dict] = []

    async def receive():
        if not got.is_set():
            got.set()
            return {"type": "http.request", "body": raw, "more_body": False}
        await asyncio.Event().wait()  # the client stays connected

    async def send(msg):
        sent.append(msg)

    await CompletionEndpoint("chat", parse_chat, lambda scope: gw)(scope, receive, send)
    start = sent[0]
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, b"".join(m.get("body", b"") for m in sent[1:])


def run(coro_fn, cfg, upstream, clock=None):
    async def main():
        gw = Gateway(cfg, clock=clock or ManualClock(), transport=ScriptedTransport.factory(upstream))
        await gw.start()
        try:
            return await coro_fn(gw)
        finally:
            await gw.close()
    return asyncio.run(main())


# -- retry ----------------------------------------------------------------------------------------
def test_a_5xx_before_the_first_byte_is_retried_on_the_next_backend():
    up = Upstream(b0=[Answer(503, b"busy")], b1=[completion("from b1")])
    before = metric("vlm_gateway_retries_total", reason="upstream_5xx")

    async def go(gw):
        return await call(gw)
    status, headers, body = run(go, config(), up)
    assert status == 200 and headers["x-vlm-gateway-backend"] == "b1"
    assert orjson.loads(body)["choices"][0]["message"]["content"] == "from b1"
    assert up.sent == ["b0", "b1"]
    assert metric("vlm_gateway_retries_total", reason="upstream_5xx") == before + 1


def test_connect_errors_everywhere_end_in_one_502_naming_the_last():
    refused = aiohttp.ClientConnectionError("refused")
    up = Upstream(b0=[refused], b1=[refused])

    async def go(gw):
        return await call(gw)
    status, headers, body = run(go, config(), up)
    err = orjson.loads(body)["error"]
    assert status == 502 and err["code"] == "connect_error" and err["type"] == "server_error"
    assert sorted(up.sent) == ["b0", "b1"]  # each tried once (routing.max_retries default: 2)


def test_a_4xx_from_the_engine_is_not_retried():
    up = Upstream(b0=[Answer(400, orjson.dumps({"error": {"message": "bad"}}))])

    async def go(gw):
        return await call(gw)
    status, _, _ = run(go, config(1), up)
    assert status == 400 and up.sent == ["b0"]


def _sse(*texts: str) -> list[bytes]:
    chunks = [b"data: " + orjson.dumps({"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m",
                                        "choices": [{"index": 0, "delta": {"content": t}, "finish_reason": None}]})
              + b"\n\n" for t in texts]
    end = orjson.dumps({"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m",
                        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 3, "completion_tokens": len(texts), "total_tokens": 3 + len(texts)}})
    return chunks + [b"data: " + end + b"\n\n", b"data: [DONE]\n\n"]


def test_a_stream_is_relayed_and_its_assembled_answer_fills_the_response_cache():
    up = Upstream(b0=[Answer(content_type="text/event-stream", chunks=_sse("Hel", "lo"))])

    async def go(gw):
        status, headers, body = await call(gw, stream=True)
        assert status == 200 and headers["x-vlm-gateway-cache"] == "miss"
        text = "".join(orjson.loads(line[6:])["choices"][0]["delta"].get("content", "")
                       for line in body.decode().split("\n") if line.startswith("data: {") and
                       orjson.loads(line[6:])["choices"])
        assert text == "Hello" and body.endswith(b"data: [DONE]\n\n")
        await gw.chain.stages[-1].drain()       # the L3 write runs in the background
        status, headers, body = await call(gw)  # the same question, not streamed: from L3
        assert status == 200 and headers["x-vlm-gateway-cache"] == "hit-exact"
        assert headers["x-vlm-gateway-backend"] == "none"
        assert orjson.loads(body)["choices"][0]["message"]["content"] == "Hello"
        assert up.sent == ["b0"]
    run(go, config(1, cache=True), up)


# -- circuit breaker ------------------------------------------------------------------------------
def test_breaker_opens_after_failures_reopens_for_twice_as_long_and_closes_on_success():
    clock = ManualClock()
    up = Upstream(b0=[Answer(500, b"")] * 3 + [completion()])

    async def go(gw):
        b0 = gw.pool.backends[0]
        assert (await call(gw))[0] == 502                     # failure 1: still closed
        assert b0.breaker.state() == "closed" and b0.available
        assert (await call(gw))[0] == 502                     # failure 2: open for eject_base_s
        assert b0.breaker.state() == "open" and not b0.available
        assert metric("vlm_gateway_backend_circuit_state", backend="b0", state="open") == 1
        status, _, body = await call(gw)                      # nothing else serves the model
        assert status == 503 and orjson.loads(body)["error"]["code"] == "no_healthy_backend"
        clock.advance(9.99)
        assert b0.breaker.state() == "open"
        clock.advance(0.01)
        assert b0.breaker.state() == "half_open" and b0.available
        assert (await call(gw))[0] == 502                     # half-open failure: open for 2 * 10 s
        clock.advance(19.99)
        assert not b0.available
        clock.advance(0.01)
        assert (await call(gw))[0] == 200                     # half-open success: closed
        assert b0.breaker.state() == "closed" and b0.breaker.opened == 0
        assert metric("vlm_gateway_backend_circuit_state", backend="b0", state="closed") == 1
    run(go, config(1, max_retries=0, eject_after_failures=2, eject_base_s=10, eject_max_s=100), up, clock)


def test_a_successful_health_probe_half_opens_the_breaker():
    clock = ManualClock()
    up = Upstream(b0=[Answer(500, b""), completion()])

    async def go(gw):
        b0 = gw.pool.backends[0]
        assert (await call(gw))[0] == 502 and b0.breaker.state() == "open"
        await gw.pool.probe(b0)                               # /health answers: let one through
        assert b0.breaker.state() == "half_open"
        assert (await call(gw))[0] == 200 and b0.breaker.state() == "closed"
    run(go, config(1, max_retries=0, eject_after_failures=1, eject_base_s=60, eject_max_s=120), up, clock)


# -- admission queue ------------------------------------------------------------------------------
def test_a_full_backend_queues_the_next_request_until_a_slot_frees():
    hold = asyncio.Event()
    up = Upstream(b0=[Answer(body=completion("first").body, hold=hold), completion("second")])

    async def go(gw):
        first = asyncio.ensure_future(call(gw))
        while gw.pool.backends[0].inflight < 1:
            await asyncio.sleep(0)
        second = asyncio.ensure_future(call(gw))
        while len(gw.pool.slots) < 1:
            await asyncio.sleep(0)
        assert metric("vlm_gateway_queue_depth") == 1 and not second.done()
        hold.set()                                            # the first answers: its slot frees
        (s1, _, body1), (s2, _, body2) = await first, await second
        assert (s1, s2) == (200, 200)
        assert orjson.loads(body1)["choices"][0]["message"]["content"] == "first"
        assert orjson.loads(body2)["choices"][0]["message"]["content"] == "second"
        assert gw.pool.backends[0].inflight == 0 and len(gw.pool.slots) == 0
    run(go, config(1, slots=1, queue_timeout_s=5), up)


def test_a_queued_request_gets_429_with_retry_after_at_its_deadline():
    clock = ManualClock()
    hold = asyncio.Event()
    up = Upstream(b0=[Answer(body=completion().body, hold=hold)])

    async def go(gw):
        first = asyncio.ensure_future(call(gw))
        while gw.pool.backends[0].inflight < 1:
            await asyncio.sleep(0)
        second = asyncio.ensure_future(call(gw))
        while len(gw.pool.slots) < 1:
            await asyncio.sleep(0)
        clock.advance(5.0)                                    # queue_timeout_s passes
        gw.pool.slots.wake()                                  # the waiter looks again: too late
        status, headers, body = await second
        assert status == 429 and headers["retry-after"] == "5"
        assert orjson.loads(body)["error"]["code"] == "backends_busy"
        hold.set()
        assert (await first)[0] == 200
    run(go, config(1, slots=1, queue_timeout_s=5), up, clock)


def test_a_full_queue_refuses_at_once():
    hold = asyncio.Event()
    up = Upstream(b0=[Answer(body=completion().body, hold=hold)])

    async def go(gw):
        first = asyncio.ensure_future(call(gw))
        while gw.pool.backends[0].inflight < 1:
            await asyncio.sleep(0)
        queued = asyncio.ensure_future(call(gw))
        while len(gw.pool.slots) < 1:
            await asyncio.sleep(0)
        status, _, body = await call(gw)                      # max_queue 1: no room to wait
        assert status == 429 and "queue full" in orjson.loads(body)["error"]["message"]
        hold.set()
        assert [(await first)[0], (await queued)[0]] == [200, 200]
    run(go, config(1, slots=1, queue_timeout_s=5, max_queue=1), up)


# -- rate limit ------------------------------------------------------------------------------------
def _limited_request(t: TenantConfig):
    req = parse_chat(orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}), {})
    req.state[TENANT] = t
    return req


def test_requests_per_minute_refill_with_the_clock():
    clock = ManualClock()
    stage = RateLimit(Limiter("", 60.0, clock), "test:rl:")
    t = TenantConfig(name="t", key_sha256="0" * 64, requests_per_minute=2)

    async def go():
        for _ in range(2):
            req = _limited_request(t)
            assert await stage(req) is None
        assert req.response_headers["x-ratelimit-remaining-requests"] == "0"
        with pytest.raises(Exception) as e:
            await stage(_limited_request(t))
        assert e.value.status == 429 and e.value.headers["retry-after"] == "30"  # one token per 30 s
        clock.advance(29.9)
        with pytest.raises(Exception):
            await stage(_limited_request(t))
        clock.advance(0.1)
        assert await stage(_limited_request(t)) is None
    asyncio.run(go())


def test_concurrency_slots_are_given_back_when_the_request_ends():
    stage = RateLimit(Limiter("", 60.0, ManualClock()), "test:rl:")
    t = TenantConfig(name="t", key_sha256="0" * 64, concurrent_streams=1)

    async def go():
        first = _limited_request(t)
        await stage(first)
        with pytest.raises(Exception) as e:
            await stage(_limited_request(t))
        assert e.value.status == 429 and e.value.code == "concurrency_limit_exceeded"
        await stage.on_finish(first)
        await stage(_limited_request(t))
    asyncio.run(go())
