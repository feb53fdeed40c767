"""Send one request upstream and relay the answer.

``open`` picks a backend, runs the ``before_send`` hooks for it and sends; a
connect error or a 5xx before the first byte is retried on the next-best backend
(``routing.max_retries``). Streams are relayed chunk by chunk as they arrive,
with SSE keepalive comments while the first byte is awaited: each read is framed
into whole events (``upstream.max_sse_event_bytes`` checked), then goes through the
request's response transform, then the watcher, then to the client. After the first
byte nothing is retried and a failure becomes an in-stream error event (the endpoint
ends a stream that any other exception interrupts the same way). Each attempt's
backend slot is owned by a ``Lease`` that is released exactly once, whatever raises.

A backend is trusted with nothing it could use against the gateway: redirects are
never followed (the prompt is never re-posted elsewhere; a 3xx is a failure and is
retried elsewhere), a non-streamed body is read up to ``upstream.max_response_bytes``,
a streamed event up to ``upstream.max_sse_event_bytes``, and an HTTP 200 carrying
an error object is a 502 and counts as a failure of that backend.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any, Callable

import aiohttp
import orjson

from .. import metrics, offload
from ..backends.backend import CHOSEN, Backend
from ..backends.pool import Lease, Pool
from ..backends.slo import Sent
from ..config import GatewayConfig
from ..core.errors import BadGateway, GatewayError, GatewayTimeout, Unavailable
from ..core.request import ChatRequest
from ..core.state import Slot
from ..stages.chain import Chain
from .sse import DONE, KEEPALIVE, EventTooLarge, StreamWatcher, event

log = logging.getLogger("vlm_gateway.relay")

PATHS = {"chat": "/chat/completions", "completions": "/completions"}
_MAX_ERROR_BODY = 64 * 1024
# chunks of a relayed stream assembled on the event loop at most (more: on the text thread)
ASSEMBLE_INLINE = 512
# the engine's usage object of a successful answer (the access log reads it)
USAGE: Slot[dict[str, Any]] = Slot("usage")


class ClientGone(Exception):
    """Sending to the client failed: it went away, nothing more can reach it."""


# what HTTP/1.1 allows in a header: RFC 9110 token characters in names, no control characters
# (but tab) in values
_TOKEN = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


def _bad(name: bytes, value: bytes) -> bool:
    return bool(name.translate(None, _TOKEN)) or _BAD_VALUE.search(value) is not None


def check_headers(headers: list[tuple[bytes, bytes]]) -> None:
    """ValueError naming the first header HTTP cannot carry (checked before anything is sent:
    a server that refuses it after the status line would cut the connection instead)."""
    if _BAD_VALUE.search(b"".join([v for _, v in headers])) or b"".join([k for k, _ in headers]).translate(None, _TOKEN):
        bad = next(k for k, v in headers if _bad(k, v))
        raise ValueError(f"response header {bad[:64]!r} cannot be sent (a control character or a bad name)")


class Responder:
    """Wraps ASGI ``send``: remembers whether the response started (its status line went out)
    and whether it is finishing (so a disconnect watcher does not cancel a completed request).
    A send that fails because the client went away raises ``ClientGone``."""

    __slots__ = ("send", "started", "finishing", "status")

    def __init__(self, send) -> None:
        self.send = send
        self.started = False
        self.finishing = False
        self.status = 0

    async def _send(self, msg: dict) -> None:
        try:
            await self.send(msg)
        except OSError as e:
            raise ClientGone(str(e)) from e

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        check_headers(headers)
        await self._send({"type": "http.response.start", "status": status, "headers": headers})
        self.started = True
        self.status = status

    async def body(self, data: bytes) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def end(self, data: bytes = b"") -> None:
        self.finishing = True
        await self._send({"type": "http.response.body", "body": data, "more_body": False})


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


class ResponseTooLarge(Exception):
    pass


async def _read_capped(resp: aiohttp.ClientResponse, cap: int) -> bytes:
    """The whole body, or ``ResponseTooLarge`` as soon as it passes ``cap`` bytes
    (at once when the declared length already does)."""
    if resp.content_length is not None and resp.content_length > cap:
        raise ResponseTooLarge
    buf = bytearray()
    async for chunk in resp.content.iter_any():
        buf += chunk
        if len(buf) > cap:
            raise ResponseTooLarge
    return bytes(buf)


def _error_message(obj: dict) -> str:
    err = obj.get("error")
    msg = err.get("message") if isinstance(err, dict) else err if isinstance(err, str) else obj.get("message")
    return str(msg or "no message")[:500]


def _drop_opened(t: "asyncio.Future") -> None:
    """An ``open`` whose caller stopped waiting: if it got a backend anyway, give it back."""
    if t.cancelled() or t.exception() is not None:
        return
    lease, resp = t.result()
    resp.close()
    lease.release()


def _quiet(t: "asyncio.Future") -> None:
    if not t.cancelled():
        t.exception()  # retrieved: a read that failed after its reader left is no error to log


class Relay:
    """Every slot this relay takes is owned by a ``Lease`` that a ``finally`` (or, for an
    ``open`` left behind, a done callback) releases: whatever raises -- the engine, a hook, the
    transform, the watcher, the client going away, a cancellation -- gives the slot back once."""

    def __init__(self, pool: Pool, cfg: GatewayConfig, chain: Chain,
                 response_headers: Callable[["ChatRequest", bytes], list[tuple[bytes, bytes]]]) -> None:
        self.pool = pool
        self.chain = chain
        self.response_headers = response_headers
        self.max_retries = cfg.routing.max_retries
        up = cfg.upstream
        self.timeout = aiohttp.ClientTimeout(total=up.total_timeout_s, connect=up.connect_timeout_s,
                                             sock_read=up.read_timeout_s)
        self.keepalive = cfg.server.keepalive_interval_s
        self.max_response = up.max_response_bytes
        self.max_event = up.max_sse_event_bytes

    # -- sending -----------------------------------------------------------------------
    async def open(self, req: "ChatRequest") -> tuple[Lease, aiohttp.ClientResponse]:
        """Send to the best backend; returns with a slot held on it (the caller releases the lease)."""
        exclude: set = set()
        last: GatewayError | None = None
        path = PATHS[req.route]
        headers = {"content-type": "application/json", "x-request-id": req.request_id}
        tm = req.timing
        for attempt in range(self.max_retries + 1):
            t_route = time.perf_counter()
            pooled = tm.queue_s + tm.media_s if tm is not None else 0.0
            try:
                lease = await self.pool.lease(req, exclude)
            except Unavailable:
                if last is not None:
                    raise last from None
                raise
            b = lease.backend
            try:
                req.state[CHOSEN] = b
                t0 = time.perf_counter()
                try:
                    if req.hooks:
                        await self.chain.before_send(req, b)
                    data = req.encode()
                    t0 = time.perf_counter()
                    if tm is not None:  # pool time of the hooks (rewrites for this backend) is not routing
                        tm.route_s += max(0.0, t0 - t_route - (tm.queue_s + tm.media_s - pooled))
                        tm.sent = tm.sent or t0
                    resp = await b.session.post(b.base_url + path, data=data, headers=headers,
                                                timeout=self.timeout, allow_redirects=False)
                except aiohttp.ConnectionTimeoutError:
                    last = self._failed(lease, exclude, "connect_timeout",
                                        f"Backend {b.name} did not accept the connection in time")
                    continue
                except asyncio.TimeoutError:
                    lease.release(failed=True)
                    raise GatewayTimeout("The upstream engine did not answer in time", code="upstream_timeout") from None
                except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError) as e:
                    last = self._failed(lease, exclude, "connect_error",
                                        f"Backend {b.name} is unreachable ({type(e).__name__})")
                    continue
                finally:
                    req.upstream_s += time.perf_counter() - t0
                kept = False
                try:
                    if resp.status >= 500:
                        t0 = time.perf_counter()
                        try:
                            await resp.content.read(_MAX_ERROR_BODY)
                        except (aiohttp.ClientError, asyncio.TimeoutError):
                            pass
                        finally:
                            req.upstream_s += time.perf_counter() - t0
                        last = self._failed(lease, exclude, "upstream_5xx", f"Backend {b.name} answered HTTP {resp.status}",
                                            status=resp.status)
                        continue
                    if 300 <= resp.status < 400:
                        last = self._failed(lease, exclude, "upstream_redirect",
                                            f"Backend {b.name} answered a redirect (HTTP {resp.status}); "
                                            "redirects are not followed")
                        continue
                    if resp.status >= 400:
                        try:
                            body = await resp.content.read(_MAX_ERROR_BODY)
                        except (aiohttp.ClientError, asyncio.TimeoutError):
                            body = b""
                        lease.release()
                        raise _upstream_error(resp.status, body)
                    if req.stream and resp.content_type != "text/event-stream":
                        # e.g. an HTML error page from a proxy in front of the engine: never relay it as SSE
                        last = self._failed(lease, exclude, "upstream_bad_content_type",
                                            f"Backend {b.name} answered a stream with content-type "
                                            f"{resp.content_type[:64]!r}")
                        continue
                    self.pool.policy.served(req, b)
                    kept = True
                    return lease, resp
                finally:
                    if not kept:
                        resp.close()
            except BaseException:
                lease.release()  # whatever it was: the slot goes back (a no-op when already released)
                raise
        assert last is not None
        raise last

    def _failed(self, lease: Lease, exclude, reason: str, message: str, status: int = 502) -> GatewayError:
        lease.release(failed=True)
        exclude.add(lease.backend)
        metrics.RETRIES.labels(reason).inc()
        log.warning("%s; trying another backend", message)
        if status in (503,):
            return Unavailable(message, code=reason, headers={"retry-after": "1"})
        return BadGateway(message, code=reason)

    @staticmethod
    def _ttft(b: "Backend", t_sent: float, sent: "Sent") -> None:
        """Time to first byte from the engine (the admission wait included): the metric and
        the model pool's budget controller."""
        t = time.perf_counter() - t_sent
        metrics.UPSTREAM_TTFT.labels(b.name).observe(t)
        sent.first(t)

    def _done(self, req: "ChatRequest", lease: Lease, t_sent: float, usage: Any) -> None:
        lease.release(ok=True)
        b = lease.backend
        metrics.UPSTREAM_E2E.labels(b.name).observe(time.perf_counter() - t_sent)
        if isinstance(usage, dict):
            req.state[USAGE] = usage
            pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
            if type(pt) is int and pt >= 0:
                metrics.TOKENS.labels(req.model, "prompt").inc(pt)
            if type(ct) is int and ct >= 0:
                metrics.TOKENS.labels(req.model, "completion").inc(ct)

    # -- non-stream --------------------------------------------------------------------
    async def non_stream(self, req: "ChatRequest", out: Responder) -> None:
        sent = self.pool.slo.sent(req.model)
        try:
            await self._non_stream(req, out, sent)
        finally:
            sent.close()

    async def _non_stream(self, req: "ChatRequest", out: Responder, sent: "Sent") -> None:
        t_sent = time.perf_counter()
        lease, resp = await self.open(req)
        b = lease.backend
        failed = False
        try:
            t0 = time.perf_counter()
            try:
                body = await _read_capped(resp, self.max_response)
            except ResponseTooLarge:
                failed = True
                raise BadGateway(f"Backend {b.name} sent an answer larger than upstream.max_response_bytes "
                                 f"({self.max_response} bytes)", code="upstream_too_large") from None
            except asyncio.TimeoutError:
                failed = True
                raise GatewayTimeout("The upstream engine did not answer in time", code="upstream_timeout") from None
            except (aiohttp.ClientError, OSError):
                failed = True
                raise BadGateway(f"Backend {b.name} broke off the response", code="upstream_disconnected") from None
            finally:
                req.upstream_s += time.perf_counter() - t0
            self._ttft(b, t_sent, sent)
            try:
                completion = _checked(b, body)
            except BadGateway:
                failed = True
                raise
            self._done(req, lease, t_sent, completion.get("usage"))
        finally:
            resp.close()
            lease.release(failed=failed)
        # the engine's part is over and its slot free; what follows fails as the gateway's own error
        if req.response_transform is not None and await req.response_transform.completion(completion):
            body = orjson.dumps(completion)
        if req.wants_completion:
            await self.chain.complete(req, completion)
        await out.start(200, self.response_headers(req, b"application/json"))
        await out.end(body)

    # -- stream ------------------------------------------------------------------------
    async def stream(self, req: "ChatRequest", out: Responder) -> None:
        sent = self.pool.slo.sent(req.model)
        try:
            await self._stream(req, out, sent)
        finally:
            sent.close()

    async def _open_keepalive(self, req: "ChatRequest", out: Responder) -> tuple[Lease, aiohttp.ClientResponse]:
        """``open``, with keepalive comments to the client while it waits."""
        opening = asyncio.ensure_future(self.open(req))
        try:
            while True:
                done, _ = await asyncio.wait((opening,), timeout=self.keepalive)
                if done:
                    return opening.result()
                await self._keepalive(req, out)
        except BaseException:
            opening.cancel()
            opening.add_done_callback(_drop_opened)  # done already, or done later: its slot goes back
            raise

    async def _stream(self, req: "ChatRequest", out: Responder, sent: "Sent") -> None:
        t_sent = time.perf_counter()
        lease, resp = await self._open_keepalive(req, out)
        b = lease.backend
        watcher = StreamWatcher(assemble=req.wants_completion, max_event_bytes=self.max_event,
                                max_assembled_bytes=self.max_response)
        tf = None
        ok = False
        failed = False
        t0 = time.perf_counter()
        try:
            if not out.started:
                await out.start(200, self.response_headers(req, b"text/event-stream"))
            tf = req.response_transform.stream() if req.response_transform is not None else None
            it = resp.content.iter_any().__aiter__()
            first = asyncio.ensure_future(it.__anext__())
            first.add_done_callback(_quiet)
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
            self._ttft(b, t_sent, sent)
            while chunk:
                # whole events only, each within the cap, before any transform sees them
                await self._forward(watcher, tf, out, watcher.frame(chunk))
                try:
                    chunk = await it.__anext__()
                except StopAsyncIteration:
                    break
            tail = watcher.rest()
            if tail:  # an unterminated last event (e.g. "data: [DONE]" without its blank line)
                await self._forward(watcher, tf, out, tail + b"\n\n")
            if tf is not None:
                await self._forward(watcher, None, out, await tf.close())
            ok = watcher.done and watcher.error is None
            failed = watcher.error is not None  # the engine reported a failure in-stream
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
        except EventTooLarge as e:
            failed = True
            await self._forward(watcher, tf, out, e.events)  # whole events that came before the oversized one
            await self._stream_error(out, BadGateway(
                f"Backend {b.name} sent an event larger than upstream.max_sse_event_bytes ({self.max_event} bytes)"
                f" (at least {e.size} bytes)", code="upstream_event_too_large"))
        except BadGateway as e:
            failed = True
            await self._stream_error(out, e)
        finally:
            req.upstream_s += time.perf_counter() - t0
            resp.close()
            if ok:
                self._done(req, lease, t_sent, watcher.usage)
            lease.release(failed=failed)
        if ok and req.wants_completion:
            completion = await self._assembled(req, watcher)
            if completion is not None:
                await self.chain.complete(req, completion)
        if not out.finishing:
            await out.end()

    @staticmethod
    async def _forward(watcher: StreamWatcher, tf, out: Responder, events: bytes) -> None:
        """Whole events to the client: through the request's transform, then noted by the watcher."""
        if events and tf is not None:
            events = await tf.feed(events)
        if events:
            watcher.scan(events)
            await out.body(events)

    @staticmethod
    async def _assembled(req: "ChatRequest", watcher: StreamWatcher) -> dict | None:
        """The relayed stream as one completion for the ``on_complete`` hooks (a long one assembled
        off the event loop); None when it cannot be (the client has its answer either way)."""
        try:
            if len(watcher.chunks) > ASSEMBLE_INLINE:
                return await offload.run(watcher.completion)
            return watcher.completion()
        except Exception:
            log.exception("the stream of request %s could not be assembled; its answer is not cached",
                          req.request_id)
            return None

    async def _keepalive(self, req: "ChatRequest", out: Responder) -> None:
        if not out.started:
            await out.start(200, self.response_headers(req, b"text/event-stream"))
        await out.body(KEEPALIVE)

    async def _stream_error(self, out: Responder, err: GatewayError) -> None:
        metrics.REJECTIONS.labels(str(err.status), err.reason).inc()
        await out.body(event(err.body()) + DONE)
        await out.end()


def _checked(b: "Backend", body: bytes) -> dict:
    """A non-streamed answer as a completion, or the 502 it is (malformed, an error, no choices)."""
    try:
        completion = orjson.loads(body)
        if not isinstance(completion, dict):
            raise ValueError
    except ValueError:
        raise BadGateway(f"Backend {b.name} returned a malformed response", code="upstream_malformed") from None
    if completion.get("error") not in (None, "", {}) or completion.get("object") == "error":
        raise BadGateway(f"Backend {b.name} answered HTTP 200 with an error: {_error_message(completion)}",
                         code="upstream_error_body")
    if not isinstance(completion.get("choices"), list):
        raise BadGateway(f"Backend {b.name} returned an answer without choices", code="upstream_malformed")
    return completion
