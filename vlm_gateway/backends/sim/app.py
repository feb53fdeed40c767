"""The simulator's HTTP surface: an OpenAI-compatible server shaped like vLLM's.

Load endpoints: in vLLM mode ``GET /metrics`` is vLLM's Prometheus text and ``GET /load``
its ``{"server_load": N}`` as vLLM answers it with ``--enable-server-load-tracking`` (the
requests the API server that answers holds, those still being preprocessed included); in
TensorRT-LLM mode (``--engine trtllm``) ``GET /metrics`` is trtllm-serve's JSON
iteration statistics and ``GET /prometheus/metrics`` its Prometheus series, per
release line (trtllm.py).

It is a test instrument: its text is filler (or, in echo mode, the last user
text followed by filler), never a model's answer; in grounding mode a request
with images is answered like a perfect locator of the colour markers in the
images it received (see ``grounding``). ``usage`` reports the
simulated prompt tokens (text estimate + real visual tokens of each image) and
``prompt_tokens_details.cached_tokens`` the prefix-cache hit.

Test-only endpoints under ``/sim/``:
- ``GET /sim/requests``: request bodies received, oldest first (the last 256, and
  at most ~128 MB of them);
- ``GET /sim/prompts``: per request what the simulator made of it (prompt and
  cached tokens, each image's size, visual tokens and sha256);
- ``GET /sim/stats``: running / waiting / preprocessing / finished / aborted /
  received counters, prefix-cache counters and KV usage, ``health_checks`` (GET /health
  answered: a gateway's probe rounds);
- ``POST /sim/faults``: arm fault modes, JSON object of:
  ``fail_next`` (count) + ``fail_status`` (500, 503, ...): answer with an error;
  ``stall_next`` (count) + ``stall_s``: wait that long before the first token;
  ``die_mid_stream`` (count): cut the connection halfway through a stream;
  ``malformed_next`` (count): broken JSON (non-streaming) / a broken SSE event;
  ``html_next`` (count): an HTML error page with status 200;
  ``refuse_connections`` (seconds): close the listening socket and cut open
  connections for that long (only when served by serve.py: the CLI, the
  embedded thread);
  ``reset``: clear received bodies and counters; ``reset_cache``: drop cached
  prefix blocks and the multimodal processor cache;
- ``GET|POST /sim/config``: the profile in use; POST ``time_scale`` changes the
  speed at run time, ``reset_cache`` as above.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections import deque

import httpx
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from .engine import SimEngine
from .grounding import answer_for, pieces
from .prompt import PromptError, build_prompt, decode_data_uri, image_urls

WORDS = ("lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore "
         "et dolore magna aliqua").split()
KEEP_BYTES = 128 << 20
FETCH_LIMIT = 64 << 20
OFFLOAD_BYTES = 256 << 10      # bodies larger than this are parsed off the event loop


def _json(data, status=200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def _error(message: str, status: int, etype: str = "BadRequestError", param: str | None = None) -> Response:
    return _json({"error": {"message": message, "type": etype, "param": param, "code": status}}, status)


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
    """Returns once the client has gone away (the body is already read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _fetch_images(urls: list[str]) -> dict[str, bytes]:
    remote = [u for u in urls if not u.startswith("data:")]
    if not remote:
        return {}
    for u in remote:
        if not u.startswith(("http://", "https://")):
            raise PromptError(f"unsupported image URL scheme: {u[:40]}")
    out: dict[str, bytes] = {}
    async with httpx.AsyncClient(timeout=30, follow_redirects=True) as client:
        for u in dict.fromkeys(remote):
            try:
                r = await client.get(u)
            except httpx.HTTPError as e:
                raise PromptError(f"cannot fetch image {u[:80]}: {e}") from None
            if r.status_code != 200:
                raise PromptError(f"cannot fetch image {u[:80]}: HTTP {r.status_code}")
            if len(r.content) > FETCH_LIMIT:
                raise PromptError(f"image too large: {u[:80]}")
            out[u] = r.content
    return out


def create_sim_app(engine: SimEngine, model_name: str = "qwen3vl-sim", echo: bool = False,
                   keep_requests: int = 256, grounding: str = "") -> Starlette:
    """``grounding``: a coordinate convention (grounding.CONVENTIONS) to answer requests with
    images like a perfect locator in it; empty = filler text."""
    received: deque = deque()
    received_bytes = [0]
    health_checks = [0]
    prompts: deque = deque(maxlen=keep_requests)
    faults: dict = {"fail_next": 0, "fail_status": 500, "stall_s": 0.0, "stall_next": 0,
                    "die_mid_stream": 0, "malformed_next": 0, "html_next": 0, "refuse_connections": 0}
    max_len = engine.profile.max_model_len

    def remember(body: dict, size: int) -> None:
        received.append((body, size))
        received_bytes[0] += size
        while len(received) > keep_requests or (received_bytes[0] > KEEP_BYTES and len(received) > 1):
            received_bytes[0] -= received.popleft()[1]

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
            body = orjson.loads(raw) if len(raw) < OFFLOAD_BYTES else await asyncio.to_thread(orjson.loads, raw)
        except orjson.JSONDecodeError:
            return _error("invalid JSON body", 400)
        if not isinstance(body, dict):
            return _error("the body must be a JSON object", 400)
        remember(body, len(raw))
        chat = request.url.path.endswith("/chat/completions")
        if body.get("model") != model_name:
            return _error(f"The model `{body.get('model')}` does not exist.", 404, "NotFoundError", "model")
        if take("fail_next"):
            return _error("injected failure (simulator fault)", faults["fail_status"], "InternalServerError")
        if take("html_next"):
            return Response(b"<html><body><h1>502 Bad Gateway</h1></body></html>", status_code=200,
                            media_type="text/html")
        if chat and not isinstance(body.get("messages"), list):
            return _error("messages: field required", 400, param="messages")
        try:
            fetched = await _fetch_images(image_urls(body)) if chat else {}
            spec = (build_prompt(body, fetched) if len(raw) < OFFLOAD_BYTES
                    else await asyncio.to_thread(build_prompt, body, fetched))
        except PromptError as e:
            engine.rejected += 1
            return _error(str(e), 400)
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        if max_tokens is None:
            max_tokens = 16
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return _error("max_tokens must be a positive integer", 400, param="max_tokens")
        if spec.num_tokens + max_tokens > max_len:
            engine.rejected += 1
            return _error(f"This model's maximum context length is {max_len} tokens. However, you requested "
                          f"{spec.num_tokens + max_tokens} tokens ({spec.num_tokens} in the messages, "
                          f"{max_tokens} in the completion). Please reduce the length of the messages or "
                          f"completion.", 400, param="max_tokens")
        stall = faults["stall_s"] if take("stall_next") else 0.0
        stream = bool(body.get("stream"))
        so = body.get("stream_options") or {}
        include_usage = bool(stream and isinstance(so, dict) and so.get("include_usage"))
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        toks = tokens_for(body, max_tokens)
        finish = "length"
        if grounding and chat and spec.images:
            urls = image_urls(body)
            data = [decode_data_uri(u) if u.startswith("data:") else fetched[u] for u in urls]
            toks = pieces(await asyncio.to_thread(answer_for, data, _last_user_text(body), grounding))
            if len(toks) <= max_tokens:
                max_tokens, finish = len(toks), "stop"
        die_mid = take("die_mid_stream")
        malformed = take("malformed_next")
        job = engine.submit(spec, max_tokens, connection=request.scope.get("client"))
        prompts.append({"id": rid, "prompt_tokens": spec.num_tokens, "api_server": job.api, "images": [
            {"width": im.width, "height": im.height, "tokens": im.tokens, "sha256": im.content.hex(),
             **({"uuid": im.uuid} if im.uuid is not None else {})} for im in spec.images], "job": job})

        def usage() -> dict:
            return {"prompt_tokens": job.prompt_tokens, "completion_tokens": job.generated,
                    "total_tokens": job.prompt_tokens + job.generated,
                    "prompt_tokens_details": {"cached_tokens": job.cached_tokens}}

        if not stream:
            async def watch_disconnect() -> None:
                await _disconnected(request)
                engine.abort(job)

            watcher = asyncio.ensure_future(watch_disconnect())
            try:
                if stall:
                    await asyncio.sleep(stall)
                async for _ in job.run():
                    pass
            except asyncio.CancelledError:
                engine.abort(job)
                raise
            finally:
                watcher.cancel()
            if job.aborted:
                return _error("request aborted", 499)
            if malformed:
                return Response(b'{"id": "broken", "choices": [', media_type="application/json")
            text = "".join(toks[:job.generated])
            if chat:
                choice = {"index": 0, "message": {"role": "assistant", "content": text},
                          "logprobs": None, "finish_reason": finish}
                obj = "chat.completion"
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
                obj = "text_completion"
            return _json({"id": rid, "object": obj, "created": created, "model": model_name,
                          "choices": [choice], "usage": usage()})

        # vLLM answers a stream's headers only once its API server has rendered the template and
        # preprocessed the media, just before the request enters the engine: wait for that, and
        # let a client that goes away meanwhile abort it there
        gone = asyncio.ensure_future(_disconnected(request))
        rendered = asyncio.ensure_future(job.rendered())
        try:
            await asyncio.wait((gone, rendered), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            engine.abort(job)
            raise
        finally:
            gone.cancel()
        if not rendered.done() or not rendered.result():
            rendered.cancel()
            engine.abort(job)
            return _error("request aborted", 499)

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
            done = False
            try:
                if stall:
                    await asyncio.sleep(stall)
                i = 0
                async for _ in job.run():
                    if i == 0 and chat:
                        yield chunk({"role": "assistant", "content": ""})
                    if die_mid and i >= len(toks) // 2:
                        engine.abort(job)
                        raise ConnectionAbortedError("injected: die mid-stream")
                    if malformed and i == 1:
                        yield b"data: {not json\n\n"
                    yield chunk({"content": toks[i]} if chat else toks[i])
                    i += 1
                yield chunk({} if chat else "", finish=finish)
                if include_usage:
                    o = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                         "created": created, "model": model_name, "choices": [], "usage": usage()}
                    yield b"data: " + orjson.dumps(o) + b"\n\n"
                yield b"data: [DONE]\n\n"
                done = True
            finally:
                if not done:
                    engine.abort(job)        # client went away (or injected death): free the slot

        return StreamingResponse(gen(), media_type="text/event-stream")

    async def models(request: Request) -> Response:
        return _json({"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                                  "owned_by": "vlm-gateway-simulator", "root": model_name,
                                                  "max_model_len": max_len}]})

    async def load(request: Request) -> Response:
        # vLLM's /load with --enable-server-load-tracking: the requests the answering API-server
        # process holds, from its handler's start to the end of the response (preprocessing included)
        return _json({"server_load": engine.apis[engine.api_for(request.scope.get("client"))].jobs})

    async def health(request: Request) -> Response:
        health_checks[0] += 1
        return Response(b"", status_code=200)

    async def metrics(request: Request) -> Response:
        if engine.trtllm is not None:   # trtllm-serve: FastAPI JSONResponse of the drained stats queue
            return _json(await engine.trtllm.log.read())
        return Response(engine.render_metrics(model_name), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def version(request: Request) -> Response:
        if engine.trtllm is None:
            return Response(b'{"detail":"Not Found"}', status_code=404, media_type="application/json")
        return _json({"version": f"simulator (trtllm-serve {engine.trtllm.release} formats)"})

    async def prometheus_metrics(request: Request) -> Response:
        if engine.trtllm is None:
            return Response(b'{"detail":"Not Found"}', status_code=404, media_type="application/json")
        return Response(engine.trtllm.render_prometheus(model_name),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    async def sim_requests(request: Request) -> Response:
        return _json([b for b, _ in received])

    async def sim_prompts(request: Request) -> Response:
        out = []
        for p in prompts:
            job = p["job"]
            out.append({k: v for k, v in p.items() if k != "job"} | {
                "cached_tokens": job.cached_tokens, "state": job.state, "generated": job.generated})
        return _json(out)

    async def sim_config(request: Request) -> Response:
        try:
            upd = orjson.loads(await request.body() or b"{}")
        except orjson.JSONDecodeError:
            return _error("invalid JSON body", 400)
        if "time_scale" in upd:
            ts = upd["time_scale"]
            if not isinstance(ts, (int, float)) or ts <= 0:
                return _error("time_scale must be a positive number", 400, param="time_scale")
            engine.profile.time_scale = float(ts)
        if upd.get("reset_cache"):
            engine.reset_caches()
        p = engine.profile
        return _json({"profile": p.name, "time_scale": p.time_scale, "max_num_seqs": p.max_num_seqs,
                      "max_model_len": p.max_model_len, "kv_capacity_tokens": p.kv_capacity_tokens,
                      "api_servers": p.api_servers})

    async def sim_stats(request: Request) -> Response:
        return _json({**engine.stats(), "health_checks": health_checks[0]})

    async def sim_faults(request: Request) -> Response:
        try:
            upd = orjson.loads(await request.body() or b"{}")
        except orjson.JSONDecodeError:
            return _error("invalid JSON body", 400)
        for k, v in upd.items():
            if k in faults and k != "refuse_connections":
                faults[k] = v
        if upd.get("reset"):
            received.clear()
            received_bytes[0] = 0
            health_checks[0] = 0
            prompts.clear()
            engine.reset_stats()
        if upd.get("reset_cache"):
            engine.reset_caches()
        refuse = upd.get("refuse_connections")
        if refuse:
            ctl = getattr(request.app.state, "listen_control", None)
            if ctl is None:
                return _error("refuse_connections needs the simulator served by vlm_gateway.backends.sim.serve",
                              501)
            seconds = 1.0 if refuse is True else float(refuse)
            asyncio.get_running_loop().create_task(ctl.refuse_for(seconds))
        return _json(faults)

    return Starlette(routes=[
        Route("/v1/chat/completions", completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/load", load, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/prometheus/metrics", prometheus_metrics, methods=["GET"]),
        Route("/version", version, methods=["GET"]),
        Route("/prometheus/metrics/", prometheus_metrics, methods=["GET"]),
        Route("/sim/requests", sim_requests, methods=["GET"]),
        Route("/sim/prompts", sim_prompts, methods=["GET"]),
        Route("/sim/stats", sim_stats, methods=["GET"]),
        Route("/sim/faults", sim_faults, methods=["POST"]),
        Route("/sim/config", sim_config, methods=["GET", "POST"]),
    ])
