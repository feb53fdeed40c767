"""HTTP endpoints. The two completion routes are raw ASGI apps so the relay
controls exactly when headers and chunks go out and can watch for a client
disconnect (which cancels the upstream request, stream or not)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Callable

import orjson

from .. import metrics
from ..core import headers as H, timing
from ..core.errors import GatewayError
from ..core.stage import Reply
from ..core.timing import Timing
from ..stages.chain import Chain
from .asgi.exchange import exchange
from .connection_guard import FIRST_BYTE
from . import recent
from .body import read_json_body
from .relay import ClientGone, Responder
from .sse import DONE, event, fresh_ids, replay
from .summary import backend_name, overhead_s

if TYPE_CHECKING:
    from .gateway import Gateway
    from ..core.request import ChatRequest

log = logging.getLogger("vlm_gateway.proxy")


async def _until_disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _finish(chain: Chain, req: "ChatRequest") -> None:
    """Run the chain's ``finish`` to completion even when this task is being cancelled
    (a client abort must still release what the request holds)."""
    task = asyncio.ensure_future(chain.finish(req))
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        pass


def error_headers(err: GatewayError, request_id: str | None,
                  req: "ChatRequest | None" = None) -> list[tuple[bytes, bytes]]:
    """An error of a completion route carries what a success would: the request id, the
    gateway's overhead, the backend (``none`` when none was used) and the headers the
    stages set before it failed (cache result, visual tokens, rate limits)."""
    h = [(b"content-type", b"application/json")]
    if request_id:
        h.append((H.REQUEST_ID.raw, request_id.encode()))
    b = backend_name(req) if req is not None else None
    h.append((H.BACKEND.raw, b.encode() if b is not None else b"none"))
    if req is not None:
        h.append((H.OVERHEAD.raw, b"%.3f" % (overhead_s(req) * 1000.0)))
        if req.timing is not None:
            h.append((H.SERVER_TIMING.raw, req.timing.server_timing()))
    merged = {k.lower(): v for k, v in (req.response_headers.items() if req is not None else ())}
    merged.update({k.lower(): v for k, v in err.headers.items()})
    h += [(k.encode(), v.encode()) for k, v in merged.items()]
    return h


async def answer_error(out: Responder, err: GatewayError, rid: str | None, req: "ChatRequest | None") -> None:
    """The error as the client can still get it: an OpenAI error object with its status, or,
    once a stream started, an error event and ``[DONE]``. Headers that cannot be sent give
    way to the plain ones; a client that went away gets nothing."""
    metrics.REJECTIONS.labels(str(err.status), err.reason).inc()
    try:
        if out.started:
            if not out.finishing:
                await out.body(event(err.body()) + DONE)
                await out.end()
            return
        try:
            await out.start(err.status, error_headers(err, rid, req))
        except ClientGone:
            raise
        except Exception:
            log.exception("the error headers of request %s could not be sent; answering with the plain ones", rid)
            await out.start(err.status, error_headers(err, rid, None))
        await out.end(err.json())
    except ClientGone:
        pass


class CompletionEndpoint:
    """POST /v1/chat/completions and /v1/completions."""

    def __init__(self, route: str, parse: Callable[..., "ChatRequest"], get_gateway) -> None:
        self.route = route
        self.parse = parse
        self.get_gateway = get_gateway

    async def __call__(self, scope, receive, send) -> None:
        gw: Gateway = self.get_gateway(scope)
        ex = exchange(scope)
        rid = ex.request_id
        out = Responder(send)
        me = asyncio.current_task()
        disconnect = None
        req = None
        model = "unknown"
        status = 200
        tm = Timing(scope.get(FIRST_BYTE) or time.perf_counter())
        timing.CURRENT.set(tm)  # this task's context: the pools count its jobs
        try:
            raw = await read_json_body(scope, receive, gw.cfg.server.max_body_bytes)
            tm.body_done = time.perf_counter()
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            req = self.parse(raw, headers, rid)
            tm.parsed = time.perf_counter()
            req.t_start, req.timing = tm.first_byte, tm
            ex.req = req
            model = req.model if req.model in gw.pool.known_models else "other"
            disconnect = asyncio.ensure_future(_until_disconnect(receive))
            disconnect.add_done_callback(lambda t: None if out.finishing or t.cancelled() else me.cancel())
            reply = await gw.chain.run(req)
            if reply is not None:
                await self._reply(gw, req, reply, out)
            elif req.stream:
                await gw.relay.stream(req, out)
            else:
                await gw.relay.non_stream(req, out)
            status = out.status
        except (asyncio.CancelledError, ClientGone):
            status = 499  # client closed the request
        except GatewayError as e:
            status = e.status
            ex.error = e.reason  # bounded reason, for the access log
            await answer_error(out, e, rid, req)
        except Exception:
            status = 500
            log.exception("unexpected error in %s (request %s)", self.route, rid)
            err = GatewayError("The gateway hit an internal error; the request was not completed",
                               code="internal_error")
            ex.error = err.reason
            await answer_error(out, err, rid, req)
        finally:
            if disconnect is not None:
                disconnect.cancel()
            if req is not None and gw.chain.pending(req):
                await _finish(gw.chain, req)
            ex.status = status
            metrics.REQUESTS.labels(self.route, model, str(status)).inc()
            metrics.REQUEST_DURATION.labels(self.route, model).observe(time.perf_counter() - tm.first_byte)
            if req is not None:
                metrics.OVERHEAD.labels(self.route).observe(overhead_s(req))
                for phase, seconds in tm.phases().items():
                    metrics.OVERHEAD_PHASE.labels(self.route, phase).observe(seconds)
            recent.record(self.route, req, status)

    async def _reply(self, gw: "Gateway", req: "ChatRequest", reply: Reply, out: Responder) -> None:
        req.response_headers.update(reply.headers)
        completion = fresh_ids(reply.completion)
        if req.stream:
            await out.start(200, gw.response_headers(req, b"text/event-stream"))
            for ev in replay(completion, req.include_usage):
                await out.body(ev)
            await out.end()
        else:
            await out.start(200, gw.response_headers(req, b"application/json"))
            await out.end(orjson.dumps(completion))
