"""The simulator's HTTP surface: an OpenAI-compatible server shaped like vLLM's.

It is a test instrument: its text is filler (or an echo of the last user text in
echo mode), never a model's answer. Test-only endpoints live under ``/sim/``:
``GET /sim/requests`` (bodies received, newest last), ``GET /sim/stats``
(counters incl. aborted requests), ``POST /sim/faults`` (arm fault modes).
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections import deque

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from .engine import SimEngine

WORDS = ("lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore "
         "et dolore magna aliqua").split()


def _json(data, status=200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def _last_user_text(body: dict) -> str:
    for msg in reversed(body.get("messages") or []):
        if isinstance(msg, dict) and msg.get("role") == "user":
            c = msg.get("content")
            if isinstance(c, str):
                return c
            if isinstance(c, list):
                return " ".join(p.get("text", "") for p in c if isinstance(p, dict) and p.get("type") == "text")
    p = body.get("prompt")
    return p if isinstance(p, str) else ""


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def create_sim_app(engine: SimEngine, model_name: str = "qwen3vl-sim", echo: bool = False,
                   keep_requests: int = 256) -> Starlette:
    received: deque = deque(maxlen=keep_requests)
    faults: dict = {"fail_next": 0, "fail_status": 500, "stall_s": 0.0, "stall_next": 0,
                    "die_mid_stream": 0, "malformed_next": 0, "html_next": 0}

    def tokens_for(body: dict, n: int) -> list[str]:
        words: list[str] = []
        if echo:
            words = _last_user_text(body).split()
        filler = itertools.cycle(WORDS)
        while len(words) < n:
            words.append(next(filler))
        return [w + " " for w in words[:n]]

    def take(name: str) -> bool:
        if faults[name] > 0:
            faults[name] -= 1
            return True
        return False

    async def completions(request: Request) -> Response:
        raw = await request.body()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return _json({"error": {"message": "invalid JSON", "type": "BadRequestError", "code": 400}}, 400)
        received.append(body)
        chat = request.url.path.endswith("/chat/completions")
        if body.get("model") != model_name:
            return _json({"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                    "type": "NotFoundError", "param": "model", "code": 404}}, 404)
        if take("fail_next"):
            return _json({"error": {"message": "injected failure", "type": "InternalServerError",
                                    "code": faults["fail_status"]}}, faults["fail_status"])
        if take("html_next"):
            return Response(b"<html><body><h1>502 Bad Gateway</h1></body></html>", status_code=200,
                            media_type="text/html")
        stall = faults["stall_s"] if take("stall_next") else 0.0
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 16
        stream = bool(body.get("stream"))
        so = body.get("stream_options") or {}
        include_usage = bool(stream and so.get("include_usage"))
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        job = engine.submit(body)
        toks = tokens_for(body, int(max_tokens))
        die_mid = take("die_mid_stream")
        malformed = take("malformed_next")

        def usage() -> dict:
            return {"prompt_tokens": job.prompt_tokens, "completion_tokens": job.generated,
                    "total_tokens": job.prompt_tokens + job.generated,
                    "prompt_tokens_details": {"cached_tokens": job.cached_tokens}}

        if not stream:
            async def work() -> None:
                if stall:
                    await asyncio.sleep(stall)
                async for _ in job.run(len(toks)):
                    pass

            # like vLLM's with_cancellation: a client that hangs up aborts the request
            task = asyncio.ensure_future(work())
            gone = asyncio.ensure_future(_disconnected(request))
            try:
                await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
            finally:
                gone.cancel()
            if not task.done():
                task.cancel()
                engine.abort(job)
                return Response(b"", status_code=499)
            task.result()
            if malformed:
                return Response(b'{"id": "broken", "choices": [', media_type="application/json")
            text = "".join(toks)
            if chat:
                choice = {"index": 0, "message": {"role": "assistant", "content": text},
                          "logprobs": None, "finish_reason": "length"}
                obj = "chat.completion"
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
                obj = "text_completion"
            return _json({"id": rid, "object": obj, "created": created, "model": model_name,
                          "choices": [choice], "usage": usage()})

        def chunk(delta_or_text, finish=None) -> bytes:
            if chat:
                c = {"index": 0, "delta": delta_or_text, "logprobs": None, "finish_reason": finish}
                o = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model_name,
                     "choices": [c]}
            else:
                c = {"index": 0, "text": delta_or_text, "logprobs": None, "finish_reason": finish}
                o = {"id": rid, "object": "text_completion", "created": created, "model": model_name,
                     "choices": [c]}
            return b"data: " + orjson.dumps(o) + b"\n\n"

        async def gen():
            try:
                if stall:
                    await asyncio.sleep(stall)
                first = True
                i = 0
                async for _ in job.run(len(toks)):
                    if first and chat:
                        yield chunk({"role": "assistant", "content": ""})
                    first = False
                    if die_mid and i >= len(toks) // 2:
                        raise ConnectionAbortedError("injected: die mid-stream")
                    if malformed and i == 1:
                        yield b"data: {not json\n\n"
                    yield chunk({"content": toks[i]} if chat else toks[i])
                    i += 1
                yield chunk({} if chat else "", finish="length")
                if include_usage:
                    o = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                         "created": created, "model": model_name, "choices": [], "usage": usage()}
                    yield b"data: " + orjson.dumps(o) + b"\n\n"
                yield b"data: [DONE]\n\n"
            except (asyncio.CancelledError, GeneratorExit):
                engine.abort(job)
                raise

        return StreamingResponse(gen(), media_type="text/event-stream")

    async def models(request: Request) -> Response:
        return _json({"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                                  "owned_by": "vlm-gateway-simulator", "max_model_len":
                                                  engine.profile.max_model_len}]})

    async def health(request: Request) -> Response:
        return Response(b"", status_code=200)

    async def metrics(request: Request) -> Response:
        return Response(engine.render_metrics(model_name), media_type="text/plain; version=0.0.4")

    async def sim_requests(request: Request) -> Response:
        return _json(list(received))

    async def sim_stats(request: Request) -> Response:
        return _json(engine.stats())

    async def sim_faults(request: Request) -> Response:
        upd = orjson.loads(await request.body() or b"{}")
        for k, v in upd.items():
            if k in faults:
                faults[k] = v
        if upd.get("reset"):
            received.clear()
            engine.reset_stats()
        return _json(faults)

    return Starlette(routes=[
        Route("/v1/chat/completions", completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/sim/requests", sim_requests, methods=["GET"]),
        Route("/sim/stats", sim_stats, methods=["GET"]),
        Route("/sim/faults", sim_faults, methods=["POST"]),
    ])
