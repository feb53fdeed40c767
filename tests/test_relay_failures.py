"""A failure at any step of the request path gives back everything the request holds, once.

In process, over the scripted upstream (tests/transport.py): the real endpoint, stage chain
(auth with a one-stream tenant, the image stage holding media bytes, grounding mapping a
trimmed screenshot's answer), pool (one backend of one slot, no queue), SLO controller and
relay. A stage added at the end of the chain subscribes every request and fails in the hook
it is told; other steps fail where the code really runs (the mapper, the watcher, header
building, the policy, the SLO controller, the engine's body, the client's socket), or the
client goes away at a step. Afterwards the backend slot, the tenant's stream slot, the SLO
lease and the media bytes are all free, and the next requests, streamed or not, succeed
with their answer mapped; a failed stream ends with an OpenAI error event and ``[DONE]``, a
failed answer is an OpenAI error with its status.

Then the answers the mapper cannot map (class 3 of #32): numbers and shapes it cannot
handle pass as the engine wrote them, streamed or not, and leak nothing."""

from __future__ import annotations

import asyncio
import base64
import hashlib

import aiohttp
import orjson
import pytest

from vlm_gateway import load_config
from vlm_gateway.backends.sim.grounding import desktop
from vlm_gateway.backends.slo import Sent
from vlm_gateway.core.request import ChatRequest, parse_chat
from vlm_gateway.core.stage import Stage
from vlm_gateway.proxy import sse
from vlm_gateway.proxy.endpoints import CompletionEndpoint
from vlm_gateway.proxy.gateway import Gateway
from vlm_gateway.proxy.sse import StreamWatcher
from vlm_gateway.stages.grounding.conventions import BUILTIN
from vlm_gateway.stages.grounding.frames import Frame, image_map, parse_header
from vlm_gateway.stages.grounding.response import StreamTransform
from vlm_gateway.stages.grounding.text import Mapper

from transport import Answer, ScriptedTransport
from waiting import async_wait_until

MODEL = "qwen3vl-sim"
KEY = "sk-relay-failures-test"
WINDOW = (260, 140, 1660, 940)
PNG = desktop(1920, 1080, WINDOW, {"magenta": (400, 220, 520, 280)})
URI = "data:image/png;base64," + base64.b64encode(PNG).decode()
GROUP = '{"bbox_2d": [100, 200, 300, 400], "label": "magenta"}'


def config():
    return load_config(None, environ={}, overrides={
        "backends": [{"url": "http://127.0.0.1:9/v1", "name": "b0", "models": [MODEL], "profile": "one"}],
        "profiles": {"one": {"base": "h200", "max_num_seqs": 1}},
        # no queue: a slot that leaked makes the next request a 429 at once
        "routing": {"policy": "round_robin", "health_interval_s": 3600, "queue_timeout_s": 0, "max_retries": 0,
                    "eject_after_failures": 1000},
        "cache": {"enabled": False},
        "auth": {"tenants": [{"name": "t", "key_sha256": hashlib.sha256(KEY.encode()).hexdigest(),
                              "concurrent_streams": 1}]}})


def completion_body(text: str) -> bytes:
    return orjson.dumps({"id": "c1", "object": "chat.completion", "created": 0, "model": MODEL,
                         "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                      "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})


def chunk(choice: dict, **extra) -> bytes:
    return b"data: " + orjson.dumps({"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
                                     "choices": [choice], **extra}) + b"\n\n"


def stream_chunks(text: str) -> list[bytes]:
    pieces = [text[i:i + 7] for i in range(0, len(text), 7)]
    return ([chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None})]
            + [chunk({"index": 0, "delta": {"content": p}, "finish_reason": None}) for p in pieces]
            + [chunk({"index": 0, "delta": {}, "finish_reason": "stop"}), b"data: [DONE]\n\n"])


class Engine:
    """The scripted upstream: /health and /v1/models answer; a completion gets ``answer``
    (or, for ``stream``, ``answer_stream``); ``got`` is set when a completion arrives."""

    def __init__(self) -> None:
        self.answer: Answer | BaseException | None = None
        self.got = asyncio.Event()
        self.requests: list[dict] = []

    def __call__(self, name, method, path, body):
        if path.endswith("/health"):
            return Answer(200, b"")
        if path.endswith("/models"):
            return Answer(200, orjson.dumps({"data": [{"id": MODEL}]}))
        self.requests.append(orjson.loads(body))
        self.got.set()
        a, self.answer = self.answer, None
        if a is not None:
            return a
        if self.requests[-1].get("stream"):
            return Answer(content_type="text/event-stream", chunks=stream_chunks(GROUP))
        return Answer(body=completion_body(GROUP))


class Inject(Stage):
    """Subscribes every request (its complete answer too) and fails in the hook it is told."""

    name = "inject"

    def __init__(self) -> None:
        self.step = ""
        self.entered = asyncio.Event()

    async def __call__(self, req: ChatRequest):
        req.subscribe(self, completion=True)
        if self.step == "bad_header":  # a header no HTTP response can carry
            req.response_headers["x-injected"] = "one\r\ntwo"
        return None

    async def before_send(self, req, backend) -> None:
        if self.step == "before_send":
            raise RuntimeError("injected in before_send")
        if self.step == "before_send_waits":
            self.entered.set()
            await asyncio.Event().wait()

    async def on_complete(self, req, completion) -> None:
        if self.step == "on_complete":
            raise RuntimeError("injected in on_complete")

    async def on_finish(self, req) -> None:
        if self.step == "on_finish":
            raise RuntimeError("injected in on_finish")


class Client:
    """One request through the endpoint as ASGI; ``gone`` set: the client disconnects;
    ``fail_on``: sending that message type raises as a closed socket does."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.n = 0

    async def call(self, stream: bool, gone: asyncio.Event | None = None, fail_on: str = "",
                   on_body=None) -> tuple[int | None, dict, bytes]:
        self.n += 1
        raw = orjson.dumps({"model": MODEL, "stream": stream, "max_tokens": 100, "messages": [
            {"role": "user", "content": [{"type": "text", "text": f"Box the marker ({self.n})."},
                                         {"type": "image_url", "image_url": {"url": URI}}]}]})
        scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "state": {},
                 "headers": [(b"content-type", b"application/json"), (b"authorization", f"Bearer {KEY}".encode())]}
        sent: list[dict] = []
        first = True

        async def receive():
            nonlocal first
            if first:
                first = False
                return {"type": "http.request", "body": raw, "more_body": False}
            await (gone or asyncio.Event()).wait()
            return {"type": "http.disconnect"}

        async def send(msg):
            if fail_on and msg["type"] == fail_on:
                raise ConnectionResetError("the client went away")
            sent.append(msg)
            if on_body is not None and msg.get("body"):
                on_body(msg["body"])

        await CompletionEndpoint("chat", parse_chat, lambda scope: self.gw)(scope, receive, send)
        if not sent:
            return None, {}, b""
        headers = {k.decode(): v.decode() for k, v in sent[0]["headers"]}
        return sent[0]["status"], headers, b"".join(m.get("body", b"") for m in sent[1:])


def mapped_group(headers: dict) -> str:
    """GROUP as the client must get it: mapped from the sent image (the window, downscaled; the
    transform header says how) back to the screenshot."""
    t = parse_header(headers["x-vlm-gateway-image-transform-1"])
    assert t["client"] == (1920, 1080) and t["crop"] == WINDOW  # trimmed: the map is no identity
    m = image_map(Frame(*t["client"], *t["crop"], *t["sent"]), BUILTIN["qwen3-vl"])
    (x1, y1), (x2, y2) = m.back(100, 200), m.back(300, 400)
    return '{"bbox_2d": [%d, %d, %d, %d], "label": "magenta"}' % tuple(int(v + 0.5) for v in (x1, y1, x2, y2))


def text_of(stream: bool, body: bytes) -> str:
    if not stream:
        return orjson.loads(body)["choices"][0]["message"]["content"]
    out = ""
    for ev in body.split(b"\n\n"):
        if ev.startswith(b"data: {"):
            for c in orjson.loads(ev[6:]).get("choices") or ():
                out += (c.get("delta") or {}).get("content") or ""
    return out


def stream_error(body: bytes) -> dict:
    """The error event a failed stream ends with, before its ``[DONE]``."""
    assert body.endswith(b"data: [DONE]\n\n"), body[-300:]
    events = [e for e in body.split(b"\n\n") if e.startswith(b"data: ")]
    return orjson.loads(events[-2][6:])["error"]


async def free(gw: Gateway) -> None:
    """Everything a request holds is given back (a cancelled send finishes on the loop)."""
    b = gw.pool.backends[0]
    slo = gw.pool.slo.controllers
    await async_wait_until(lambda: b.inflight == 0 and not any(c.pending for c in slo.values())
                           and gw.chain.shared.budget.used == 0, "the slot, the SLO lease and the media bytes are free",
                           timeout=5)
    assert len(gw.pool.slots) == 0


async def next_requests_succeed(gw: Gateway, client: Client, engine: Engine) -> None:
    for stream in (False, True):
        status, headers, body = await client.call(stream)
        assert status == 200, body
        assert headers["x-vlm-gateway-grounding"] == "convention=qwen3-vl; mapping=on"
        assert text_of(stream, body) == mapped_group(headers)
        if stream:
            assert body.endswith(b"data: [DONE]\n\n") and b'"error"' not in body
    await free(gw)


def boom(*a, **k):
    raise RuntimeError("injected")


# (step, streamed?) -> what the client gets: "ok", ("error", status, code) or "gone" (nothing to read)
CASES = [
    ("before_send", False, ("error", 500, "internal_error")),
    ("before_send", True, ("error", 500, "internal_error")),
    ("encode", False, ("error", 500, "internal_error")),
    ("post_raises", False, ("error", 500, "internal_error")),
    ("post_refused", True, ("error", 502, "connect_error")),
    ("served", False, ("error", 500, "internal_error")),
    ("ttft", False, ("error", 500, "internal_error")),
    ("ttft", True, ("error", 500, "internal_error")),
    ("body_broken", False, ("error", 502, "upstream_disconnected")),
    ("body_broken", True, ("error", 502, "upstream_disconnected")),
    ("body_raises", False, ("error", 500, "internal_error")),
    ("body_raises", True, ("error", 500, "internal_error")),
    ("mapper", False, ("error", 500, "internal_error")),
    ("mapper", True, ("error", 500, "internal_error")),
    ("transform_close", True, ("error", 500, "internal_error")),
    ("watcher_frame", True, ("error", 500, "internal_error")),
    ("watcher_scan", True, ("error", 500, "internal_error")),
    ("assemble", True, "ok"),
    ("on_complete", False, "ok"),
    ("on_complete", True, "ok"),
    ("on_finish", False, "ok"),
    ("on_finish", True, "ok"),
    ("headers", False, ("error", 500, "internal_error")),
    ("headers", True, ("error", 500, "internal_error")),
    ("bad_header", False, ("error", 500, "internal_error")),
    ("bad_header", True, ("error", 500, "internal_error")),
    ("send_start", False, "gone"),
    ("send_start", True, "gone"),
    ("send_body", True, "gone"),
    ("gone_in_before_send", False, "gone"),
    ("gone_in_before_send", True, "gone"),
    ("gone_before_first_byte", False, "gone"),
    ("gone_before_first_byte", True, "gone"),
    ("gone_mid_stream", True, "gone"),
]


@pytest.mark.parametrize("step,stream,expect", CASES, ids=[f"{s}-{'stream' if st else 'json'}" for s, st, _ in CASES])
def test_a_failure_at_any_step_frees_everything_and_the_next_requests_succeed(monkeypatch, step, stream, expect):
    async def go():
        engine = Engine()
        gw = Gateway(config(), transport=ScriptedTransport.factory(engine))
        inject = Inject()
        gw.chain.stages.append(inject)
        await gw.start()
        try:
            client = Client(gw)
            await next_requests_succeed(gw, client, engine)  # the path works before anything fails
            gone = asyncio.Event()
            kw: dict = {}
            with monkeypatch.context() as mp:
                if step in ("before_send", "on_complete", "on_finish", "bad_header"):
                    inject.step = step
                elif step == "encode":
                    mp.setattr(ChatRequest, "encode", boom)
                elif step == "post_raises":
                    engine.answer = ValueError("a transport bug")
                elif step == "post_refused":
                    engine.answer = aiohttp.ClientConnectionError("refused")
                elif step == "served":
                    mp.setattr(gw.pool.policy, "served", boom)
                elif step == "ttft":
                    mp.setattr(Sent, "first", boom)
                elif step in ("body_broken", "body_raises"):
                    cut = aiohttp.ClientPayloadError("cut") if step == "body_broken" else RuntimeError("read bug")
                    engine.answer = (Answer(content_type="text/event-stream", chunks=stream_chunks(GROUP)[:2] + [cut])
                                     if stream else Answer(chunks=[completion_body(GROUP)[:20], cut]))
                elif step == "mapper":
                    mp.setattr(Mapper, "feed" if stream else "text", boom)
                elif step == "transform_close":
                    mp.setattr(StreamTransform, "close_sync", boom)
                elif step == "watcher_frame":
                    mp.setattr(StreamWatcher, "frame", boom)
                elif step == "watcher_scan":
                    mp.setattr(StreamWatcher, "scan", boom)
                elif step == "assemble":
                    mp.setattr(sse, "assemble", boom)
                elif step == "headers":
                    mp.setattr(gw.relay, "response_headers", boom)
                elif step == "send_start":
                    kw["fail_on"] = "http.response.start"
                elif step == "send_body":
                    kw["fail_on"] = "http.response.body"
                elif step == "gone_in_before_send":
                    inject.step = "before_send_waits"
                    kw["gone"] = gone
                elif step == "gone_before_first_byte":
                    engine.answer = Answer(body=completion_body(GROUP), hold=asyncio.Event())
                    kw["gone"] = gone
                elif step == "gone_mid_stream":
                    engine.answer = Answer(content_type="text/event-stream",
                                           chunks=stream_chunks(GROUP)[:3] + [asyncio.Event()])
                    kw["gone"] = gone
                    kw["on_body"] = lambda data: gone.set() if b'"content"' in data else None
                engine.got.clear()
                task = asyncio.ensure_future(client.call(stream, **kw))
                if step == "gone_in_before_send":
                    await async_wait_until(inject.entered.is_set, "before_send is running")
                    gone.set()
                elif step == "gone_before_first_byte":
                    await async_wait_until(engine.got.is_set, "the engine has the request")
                    gone.set()
                status, headers, body = await task
            inject.step = ""
            if expect == "ok":
                assert status == 200, body
                assert text_of(stream, body) == mapped_group(headers)
            elif expect == "gone":
                assert status in (None, 200)  # nothing, or a start the client never read
            else:
                _, want_status, code = expect
                if stream and status == 200:  # the stream had started: an error event, then [DONE]
                    err = stream_error(body)
                else:
                    assert status == want_status, body
                    err = orjson.loads(body)["error"]
                    assert headers["content-type"] == "application/json"
                assert err["code"] == code and err["message"] and "type" in err and "param" in err
            await free(gw)
            await next_requests_succeed(gw, client, engine)
        finally:
            await gw.close()
    asyncio.run(go())


# -- what the mapper cannot map passes as written ----------------------------------------------------

HUGE = "9" * 400
UNMAPPABLE = [
    f'{{"bbox_2d": [{HUGE}, 10, 20, 30]}}',                  # 400 digits: inf as a float
    f'{{"bbox_2d": [1.{HUGE}, 10, 20, 30]}}',                # a number no coordinate is
    '{"bbox_2d": [-5, 10, 20, 30]}',                          # outside the frame the model saw
    '{"point_2d": [1001, 10]}',
    '<|box_start|>(10,20),(30,40000)<|box_end|>',
    '<points x1="-1" y1="5" alt="a">a</points>',
]
NOT_GROUPS = ['{"bbox_2d": [NaN, 1, 2, 3]}', '{"bbox_2d": [1e999, 1, 2, 3]}', '{"bbox_2d": [[1, 2], [3, 4]]}',
              '{"bbox_2d": ["10", 20, 30, 40]}', '{"point_2d": [Infinity, -Infinity]}']


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_numbers_the_mapper_cannot_map_stay_as_written_and_leak_nothing(stream):
    text = " then ".join(UNMAPPABLE + NOT_GROUPS + [GROUP])

    async def go():
        engine = Engine()
        gw = Gateway(config(), transport=ScriptedTransport.factory(engine))
        await gw.start()
        try:
            client = Client(gw)
            for _ in range(4):  # one slot: a leak would refuse the second
                engine.answer = (Answer(content_type="text/event-stream", chunks=stream_chunks(text)) if stream
                                 else Answer(body=completion_body(text)))
                status, headers, body = await client.call(stream)
                assert status == 200, body
                assert text_of(stream, body) == " then ".join(UNMAPPABLE + NOT_GROUPS + [mapped_group(headers)])
                if stream:
                    assert body.endswith(b"data: [DONE]\n\n") and b'"error"' not in body
                await free(gw)
            await next_requests_succeed(gw, client, engine)
        finally:
            await gw.close()
    asyncio.run(go())


# chunks of shapes no mapper reads; each must reach the client byte for byte
ODD_CHUNKS = [
    chunk({"index": [1], "delta": {"content": GROUP}, "finish_reason": None}),
    chunk({"index": {"a": 1}, "delta": {"content": GROUP}, "finish_reason": None}),
    chunk({"index": "0", "delta": {"content": GROUP}, "finish_reason": None}),
    chunk({"index": True, "delta": {"content": GROUP}, "finish_reason": None}),
    chunk({"index": 1.5, "delta": {"content": GROUP}, "finish_reason": None}),
    chunk({"index": 0, "delta": GROUP, "finish_reason": None}),
    chunk({"index": 0, "delta": [GROUP], "finish_reason": None}),
    chunk({"index": 0, "delta": {"content": [GROUP]}, "finish_reason": None}),
    chunk({"index": 0, "delta": {"content": {"text": GROUP}}, "finish_reason": [1]}),
    chunk({"index": 0, "delta": {"content": 7, "tool_calls": [{"index": [2]}, 5]}, "logprobs": [1]}),
    b"data: " + orjson.dumps({"id": "c1", "choices": {"0": {"delta": {"content": GROUP}}}}) + b"\n\n",
    b"data: " + orjson.dumps({"id": "c1", "choices": [1, None, GROUP, [GROUP]]}) + b"\n\n",
    b"data: " + orjson.dumps({"id": "c1", "choices": [], "usage": [1, 2]}) + b"\n\n",
    b"data: " + orjson.dumps([GROUP]) + b"\n\n",
]


def test_a_mapped_stream_passes_chunks_of_any_shape_through_and_completes():
    async def go():
        engine = Engine()
        gw = Gateway(config(), transport=ScriptedTransport.factory(engine))
        inject = Inject()  # subscribes for the complete answer: the stream is assembled too
        gw.chain.stages.append(inject)
        await gw.start()
        try:
            client = Client(gw)
            good = stream_chunks(GROUP)
            for odd in ODD_CHUNKS:
                engine.answer = Answer(content_type="text/event-stream", chunks=[good[0], odd, *good[1:]])
                status, headers, body = await client.call(True)
                assert status == 200, body
                assert odd in body  # as the engine sent it
                assert text_of(True, body.replace(odd, b"")) == mapped_group(headers)
                assert body.endswith(b"data: [DONE]\n\n") and b'"error":{' not in body.replace(odd, b"")
                await free(gw)
            await next_requests_succeed(gw, client, engine)
        finally:
            await gw.close()
    asyncio.run(go())


def test_a_complete_answer_of_odd_shapes_passes_as_it_came():
    # a message's text is mapped whatever its choice's index; anything else is left as it came
    odd = [{"index": 0, "message": GROUP}, {"index": 0, "message": {"content": [GROUP]}},
           {"index": 0, "message": {"content": {"text": GROUP}}}, 5, None, [GROUP]]

    async def go():
        engine = Engine()
        gw = Gateway(config(), transport=ScriptedTransport.factory(engine))
        gw.chain.stages.append(Inject())  # the complete answer goes to on_complete too
        await gw.start()
        try:
            client = Client(gw)
            for c in odd:
                body = orjson.dumps({"id": "c1", "object": "chat.completion", "model": MODEL, "choices": [c],
                                     "usage": [1]})
                engine.answer = Answer(body=body)
                status, _, got = await client.call(False)
                assert status == 200 and got == body
                await free(gw)
            engine.answer = Answer(body=orjson.dumps({"id": "c1", "choices": [
                {"index": [1], "message": {"content": GROUP}}, {"index": 0, "message": {"content": GROUP}}]}))
            status, headers, got = await client.call(False)
            assert status == 200
            assert [c["message"]["content"] for c in orjson.loads(got)["choices"]] == [mapped_group(headers)] * 2
            await free(gw)
            await next_requests_succeed(gw, client, engine)
        finally:
            await gw.close()
    asyncio.run(go())


def test_the_text_thread_refuses_new_conversations_past_its_queue_but_never_an_answer():
    import threading

    from vlm_gateway import offload
    from vlm_gateway.core.errors import Unavailable

    async def go():
        gate = threading.Event()
        jobs = [asyncio.ensure_future(offload.run(gate.wait, 10)) for _ in range(offload.MAX_WAITING + 1)]
        await async_wait_until(lambda: offload.jobs() == offload.MAX_WAITING + 1, "the jobs are queued")
        with pytest.raises(Unavailable) as e:  # a conversation to map: 503, retry shortly
            await offload.run(len, "x", refusable=True)
        assert e.value.code == "text_work_busy" and e.value.headers["retry-after"] == "1"
        answer = asyncio.ensure_future(offload.run(len, "an answer"))  # an answer waits its turn
        gate.set()
        assert await answer == len("an answer") and all(await asyncio.gather(*jobs))
        await async_wait_until(lambda: offload.jobs() == 0, "every job is done")
    asyncio.run(go())
