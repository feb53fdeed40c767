"""Send one request upstream and relay the answer.

``open`` picks a backend, runs the ``before_send`` hooks for it and sends; a
connect error or a 5xx before the first byte is retried on the next-best backend
(``routing.max_retries``). Streams are relayed chunk by chunk as they arrive,
with SSE keepalive comments while the first byte is awaited; after the first
byte nothing is retried and a failure becomes an in-stream error event.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import aiohttp
import orjson

from .. import metrics
from .errors import BadGateway, GatewayError, GatewayTimeout, Unavailable
from .sse import DONE, KEEPALIVE, StreamWatcher, event

if TYPE_CHECKING:
    from ..backends.backend import Backend
    from .gateway import Gateway
    from .request import ChatRequest

log = logging.getLogger("vlm_gateway.relay")

PATHS = {"chat": "/chat/completions", "completions": "/completions"}
_MAX_ERROR_BODY = 64 * 1024


class Responder:
    """Wraps ASGI ``send``: remembers whether the response started and whether it
    is finishing (so a disconnect watcher does not cancel a completed request)."""

    __slots__ = ("send", "started", "finishing", "status")

    def __init__(self, send) -> None:
        self.send = send
        self.started = False
        self.finishing = False
        self.status = 0

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.started = True
        self.status = status
        await self.send({"type": "http.response.start", "status": status, "headers": headers})

    async def body(self, data: bytes) -> None:
        await self.send({"type": "http.response.body", "body": data, "more_body": True})

    async def end(self, data: bytes = b"") -> None:
        self.finishing = True
        await self.send({"type": "http.response.body", "body": data, "more_body": False})


class UpstreamClientError(GatewayError):
    """A 4xx from the engine, passed through with its own message."""

    type = "invalid_request_error"


def _upstream_error(status: int, body: bytes) -> GatewayError:
    message, etype, code, param = f"Upstream returned HTTP {status}", None, None, None
    try:
        obj = orjson.loads(body)
        err = obj.get("error", obj) if isinstance(obj, dict) else None
        if isinstance(err, dict):
            message = str(err.get("message") or obj.get("detail") or message)
            etype, code, param = err.get("type"), err.get("code"), err.get("param")
        elif isinstance(err, str):
            message = err
    except orjson.JSONDecodeError:
        pass
    if not isinstance(code, (str, type(None))):
        code = str(code)
    return UpstreamClientError(message[:2000], status=status, type=etype if isinstance(etype, str) else None,
                               code=code, param=param if isinstance(param, str) else None,
                               reason="upstream_4xx")


class Relay:
    def __init__(self, gw: "Gateway") -> None:
        self.gw = gw
        self.pool = gw.pool
        up = gw.cfg.upstream
        self.timeout = aiohttp.ClientTimeout(total=up.total_timeout_s, connect=up.connect_timeout_s,
                                             sock_read=up.read_timeout_s)
        self.keepalive = gw.cfg.server.keepalive_interval_s

    # -- sending -----------------------------------------------------------------------
    async def open(self, req: "ChatRequest") -> tuple["Backend", aiohttp.ClientResponse]:
        """Send to the best backend; returns with a slot held on it (release it!)."""
        exclude: set = set()
        last: GatewayError | None = None
        path = PATHS[req.route]
        headers = {"content-type": "application/json", "x-request-id": req.request_id}
        for attempt in range(self.gw.cfg.routing.max_retries + 1):
            try:
                b = await self.pool.acquire(req, exclude)
            except Unavailable:
                if last is not None:
                    raise last from None
                raise
            req.state["backend"] = b
            t0 = time.perf_counter()
            try:
                for hook in req.before_send:
                    await hook(req, b)
                data = req.encode()
                t0 = time.perf_counter()
                resp = await b.session.post(b.base_url + path, data=data, headers=headers, timeout=self.timeout)
            except aiohttp.ConnectionTimeoutError:
                last = self._failed(b, exclude, "connect_timeout", f"Backend {b.name} did not accept the connection in time")
                continue
            except asyncio.TimeoutError:
                self._release(b, failed=True)
                raise GatewayTimeout("The upstream engine did not answer in time", code="upstream_timeout") from None
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError) as e:
                last = self._failed(b, exclude, "connect_error", f"Backend {b.name} is unreachable ({type(e).__name__})")
                continue
            except BaseException:
                self._release(b)
                raise
            finally:
                req.upstream_s += time.perf_counter() - t0
            if resp.status >= 500:
                t0 = time.perf_counter()
                try:
                    await resp.content.read(_MAX_ERROR_BODY)
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    pass
                finally:
                    resp.close()
                    req.upstream_s += time.perf_counter() - t0
                last = self._failed(b, exclude, "upstream_5xx", f"Backend {b.name} answered HTTP {resp.status}",
                                    status=resp.status)
                continue
            if resp.status >= 400:
                try:
                    body = await resp.content.read(_MAX_ERROR_BODY)
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    body = b""
                finally:
                    resp.close()
                    self._release(b)
                raise _upstream_error(resp.status, body)
            if req.stream and resp.content_type != "text/event-stream":
                # e.g. an HTML error page from a proxy in front of the engine: never relay it as SSE
                resp.close()
                last = self._failed(b, exclude, "upstream_bad_content_type",
                                    f"Backend {b.name} answered a stream with content-type "
                                    f"{resp.content_type[:64]!r}")
                continue
            self.pool.policy.served(req, b)
            return b, resp
        assert last is not None
        raise last

    def _release(self, b: "Backend", failed: bool = False) -> None:
        self.pool.release(b)
        if failed:
            self.pool.record_failure(b)

    def _failed(self, b, exclude, reason: str, message: str, status: int = 502) -> GatewayError:
        self._release(b, failed=True)
        exclude.add(b)
        metrics.RETRIES.labels(reason).inc()
        log.warning("%s; trying another backend", message)
        if status in (503,):
            return Unavailable(message, code=reason, headers={"retry-after": "1"})
        return BadGateway(message, code=reason)

    def _done(self, req: "ChatRequest", b: "Backend", t_sent: float, usage: dict | None) -> None:
        self.pool.release(b)
        self.pool.record_success(b)
        metrics.UPSTREAM_E2E.labels(b.name).observe(time.perf_counter() - t_sent)
        if usage:
            req.state["usage"] = usage
            pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
            if isinstance(pt, int):
                metrics.TOKENS.labels(req.model, "prompt").inc(pt)
            if isinstance(ct, int):
                metrics.TOKENS.labels(req.model, "completion").inc(ct)

    # -- non-stream --------------------------------------------------------------------
    async def non_stream(self, req: "ChatRequest", out: Responder) -> None:
        t_sent = time.perf_counter()
        b, resp = await self.open(req)
        t0 = time.perf_counter()
        try:
            body = await resp.read()
        except asyncio.TimeoutError:
            self._release(b, failed=True)
            raise GatewayTimeout("The upstream engine did not answer in time", code="upstream_timeout") from None
        except (aiohttp.ClientError, OSError):
            self._release(b, failed=True)
            raise BadGateway(f"Backend {b.name} broke off the response", code="upstream_disconnected") from None
        except BaseException:
            resp.close()
            self._release(b)
            raise
        finally:
            req.upstream_s += time.perf_counter() - t0
        metrics.UPSTREAM_TTFT.labels(b.name).observe(time.perf_counter() - t_sent)
        try:
            completion = orjson.loads(body)
            if not isinstance(completion, dict):
                raise ValueError
        except ValueError:
            self._release(b, failed=True)
            raise BadGateway(f"Backend {b.name} returned a malformed response", code="upstream_malformed") from None
        if req.response_transform is not None and req.response_transform.completion(completion):
            body = orjson.dumps(completion)
        self._done(req, b, t_sent, completion.get("usage"))
        for hook in req.on_complete:
            await hook(req, completion)
        await out.start(200, self.gw.response_headers(req, b"application/json"))
        await out.end(body)

    # -- stream ------------------------------------------------------------------------
    async def stream(self, req: "ChatRequest", out: Responder) -> None:
        t_sent = time.perf_counter()
        opening = asyncio.ensure_future(self.open(req))
        try:
            while True:
                done, _ = await asyncio.wait((opening,), timeout=self.keepalive)
                if done:
                    break
                await self._keepalive(req, out)
        except BaseException:
            opening.cancel()
            raise
        b, resp = opening.result()
        if not out.started:
            await out.start(200, self.gw.response_headers(req, b"text/event-stream"))
        watcher = StreamWatcher(assemble=bool(req.on_complete))
        tf = req.response_transform.stream() if req.response_transform is not None else None
        it = resp.content.iter_any().__aiter__()
        ok = False
        failed = False
        t0 = time.perf_counter()
        try:
            first = asyncio.ensure_future(it.__anext__())
            try:
                while True:
                    done, _ = await asyncio.wait((first,), timeout=self.keepalive)
                    if done:
                        break
                    await out.body(KEEPALIVE)
            except BaseException:
                first.cancel()
                raise
            try:
                chunk = first.result()
            except StopAsyncIteration:
                chunk = b""
            metrics.UPSTREAM_TTFT.labels(b.name).observe(time.perf_counter() - t_sent)
            while chunk:
                if tf is not None:
                    chunk = tf.feed(chunk)
                watcher.feed(chunk)
                await out.body(chunk)
                try:
                    chunk = await it.__anext__()
                except StopAsyncIteration:
                    break
            if tf is not None and (chunk := tf.close()):
                watcher.feed(chunk)
                await out.body(chunk)
            ok = watcher.done and watcher.error is None
            if not watcher.done:
                raise BadGateway(f"Backend {b.name} ended the stream early", code="upstream_disconnected")
        except asyncio.TimeoutError:
            failed = True
            await self._stream_error(out, GatewayTimeout("The upstream engine stalled mid-stream",
                                                         code="upstream_timeout"))
        except (aiohttp.ClientError, OSError):
            failed = True
            await self._stream_error(out, BadGateway(f"Backend {b.name} broke off the stream",
                                                     code="upstream_disconnected"))
        except BadGateway as e:
            failed = True
            await self._stream_error(out, e)
        finally:
            req.upstream_s += time.perf_counter() - t0
            resp.close()
            if ok:
                self._done(req, b, t_sent, watcher.usage)
            else:
                self._release(b, failed=failed)
        if ok and req.on_complete:
            completion = watcher.completion()
            if completion is not None:
                for hook in req.on_complete:
                    await hook(req, completion)
        if not out.finishing:
            await out.end()

    async def _keepalive(self, req: "ChatRequest", out: Responder) -> None:
        if not out.started:
            await out.start(200, self.gw.response_headers(req, b"text/event-stream"))
        await out.body(KEEPALIVE)

    async def _stream_error(self, out: Responder, err: GatewayError) -> None:
        metrics.REJECTIONS.labels(str(err.status), err.reason).inc()
        await out.body(event(err.body()) + DONE)
        await out.end()
