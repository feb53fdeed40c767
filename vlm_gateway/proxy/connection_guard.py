"""The HTTP/1.1 protocol the gateway listens with: uvicorn's httptools protocol plus
the limits it lacks against slow and numerous clients (the CLI passes this class as
uvicorn's ``http``; its settings arrive through the app's lifespan state).

- **Header deadline**: a request line and headers must arrive within
  ``server.header_timeout_s``, counted from the connection (a socket that sends
  nothing is closed too) or, on a keep-alive connection, from the request's first
  byte. Late: 408 and the connection is closed.
- **Header size**: more than ``server.max_header_bytes`` before the headers end:
  431 (httptools would otherwise buffer a header of any size).
- **Body deadline**: the body may pause at most ``server.body_timeout_s``, and its
  whole transfer may take ``body_timeout_s`` plus one second per
  ``server.body_min_bytes_per_s`` bytes received (mod_reqtimeout's rule); time during
  which the gateway itself is not reading does not count. Late: 408 (or a plain
  close once a response started) and the app sees a disconnect.
- **Send deadline**: a client that takes no response bytes for
  ``server.send_timeout_s`` while the gateway has some to send (a stream it stopped
  reading) is disconnected, which cancels the upstream request and frees its slot.
- **Connection cap**: at most ``server.max_connections`` per worker (0 = half the
  file-descriptor limit, leaving the other half to backends, Redis and image
  fetches, so the gateway never runs out of descriptors for its own probes). At the
  cap, a new connection closes the connection that has gone longest without a
  request being served (waiting for its first byte, reading headers, or idle
  between keep-alive requests), oldest first: a slow-header flood evicts itself,
  not the clients being served. When every connection is serving, up to ``RESERVE``
  more are accepted for ``/health``, ``/ready`` and ``/metrics`` only (others get
  503); beyond that a connection gets 503 at once.

The counter ``vlm_gateway_client_connections_closed_total{reason}`` counts each.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass

import httptools
import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .. import metrics
from . import rebalance

log = logging.getLogger("vlm_gateway.connections")

STATE_KEY = "vlm_gateway.connection_guard"
PROBE_PATHS = frozenset({b"/health", b"/ready", b"/metrics"})
RESERVE = 16
# descriptors kept for everything but client connections, below which no cap is sensible
MIN_FDS = 64


@dataclass(frozen=True, slots=True)
class GuardSettings:
    header_timeout_s: float = 15.0
    max_header_bytes: int = 65536
    body_timeout_s: float = 20.0
    body_min_bytes_per_s: int = 8192
    max_connections: int = 1024
    send_timeout_s: float = 60.0


def fd_limit() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def raise_fd_limit(wanted: int) -> int:
    """Raise the soft descriptor limit toward ``wanted`` (up to the hard limit); the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def connection_cap(configured: int, fds: int) -> int:
    """Client connections per worker: ``configured``, or (0) what half the descriptors allow."""
    return configured if configured else max(16, min(65536, (fds - MIN_FDS) // 2 - RESERVE))


def fds_needed(cap: int) -> int:
    """Descriptors a worker needs for ``cap`` client connections (as many again for the rest)."""
    return 2 * (cap + RESERVE) + MIN_FDS


def _error(status: int, message: str, code: str) -> bytes:
    """A whole response, written by the protocol itself (no request reached the app): the
    OpenAI error shape and the headers every response carries (a fresh request id; no
    time was spent on a request)."""
    body = orjson.dumps({"error": {"message": message, "type": "invalid_request_error" if status < 500
                                   else "server_error", "param": None, "code": code}})
    phrase = {400: b"Bad Request", 408: b"Request Timeout", 431: b"Request Header Fields Too Large",
              503: b"Service Unavailable"}[status]
    extra = b"retry-after: 1\r\n" if status == 503 else b""
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s"
            b"x-request-id: %s\r\nx-vlm-gateway-overhead-ms: 0.000\r\nconnection: close\r\n\r\n"
            % (status, phrase, len(body), extra, uuid.uuid4().hex.encode())) + body


class ConnectionGuard:
    """One per worker process: the settings and the connections that may be evicted."""

    def __init__(self, settings: GuardSettings) -> None:
        self.settings = settings
        self.open: set["GuardedHttpToolsProtocol"] = set()
        # connections not serving a request, oldest first (the eviction order)
        self.idle: OrderedDict["GuardedHttpToolsProtocol", None] = OrderedDict()

    def evict_one(self) -> bool:
        while self.idle:
            conn, _ = self.idle.popitem(last=False)
            if conn.closed(reason="evicted"):
                return True
        return False


async def _probes_only(scope, receive, send) -> None:
    """The app of a connection admitted beyond the cap for a path other than a probe."""
    body = orjson.dumps({"error": {"message": "The gateway is at its connection limit (server.max_connections); "
                                              "retry shortly", "type": "server_error", "param": None,
                                   "code": "too_many_connections"}})
    await send({"type": "http.response.start", "status": 503,
                "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1"),
                            (b"x-request-id", uuid.uuid4().hex.encode()), (b"x-vlm-gateway-overhead-ms", b"0.000"),
                            (b"connection", b"close"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


# scope key: perf_counter() at the request's first byte
FIRST_BYTE = "vlm_gateway.first_byte"


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.guard: ConnectionGuard | None = self.app_state.get(STATE_KEY)
        self._reading: str | None = "head"  # "head" | "body" | None (request fully received)
        self._serving = False
        self._probes_only = False
        self._timer: asyncio.TimerHandle | None = None
        self._head_deadline = 0.0
        self._head_bytes = 0
        self._body_start = self._body_last = 0.0
        self._body_bytes = 0
        self._first_byte = 0.0
        self._shared = False  # counted in rebalance.SHARE
        self._rebalanced = False  # asked to close after its response, to even out the workers
        self._send_stalled = 0.0  # when the client stopped taking response bytes (0: it takes them)

    # -- bookkeeping -------------------------------------------------------------------
    def _idle(self, on: bool) -> None:
        g = self.guard
        if on:
            g.idle[self] = None
            g.idle.move_to_end(self)
        else:
            g.idle.pop(self, None)

    def _arm(self, at: float) -> None:
        """Make sure a check runs by ``at``. A pending earlier check is kept: it re-arms
        for whatever deadline holds when it runs (one timer per connection, not one
        per request phase)."""
        when = self.loop.time() + max(0.0, at - time.monotonic())
        if self._timer is not None:
            if self._timer.when() <= when:
                return
            self._timer.cancel()
        self._timer = self.loop.call_at(when, self._check)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def closed(self, reason: str, answer: bytes = b"") -> bool:
        """Close this connection for ``reason`` (with ``answer`` written first when no
        response has started); False when it was closing already."""
        if self.transport is None or self.transport.is_closing():
            return False
        metrics.CONNECTIONS_CLOSED.labels(reason).inc()
        log.debug("closing client connection %s: %s", self.client, reason)
        cycle = self.cycle
        # a new response may be written before the next request's headers, or while the
        # current request has not been answered at all
        may_answer = self._reading == "head" or cycle is None or not cycle.response_started
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app's receive() now returns http.disconnect
            cycle.message_event.set()
        if answer and may_answer:
            self.transport.write(answer)
        self._forget()
        if reason == "send_timeout":
            self.transport.abort()  # close() would wait to flush what the client does not read
        else:
            self.transport.close()
        return True

    # -- connection --------------------------------------------------------------------
    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        g = self.guard
        if g is None:
            return
        cap = g.settings.max_connections
        if len(g.open) >= cap and not g.evict_one():
            if len(g.open) >= cap + RESERVE:
                g.open.add(self)
                self.closed("full", _error(503, "The gateway is at its connection limit (server.max_connections); "
                                                "retry shortly", "too_many_connections"))
                return
            self._probes_only = True
        g.open.add(self)
        if rebalance.SHARE is not None:
            rebalance.SHARE.opened()
            self._shared = True
        self._idle(True)
        self._head_deadline = time.monotonic() + g.settings.header_timeout_s
        self._arm(self._head_deadline)

    def send_400_response(self, msg: str) -> None:
        # unparsable HTTP: the OpenAI error shape instead of uvicorn's plain text
        metrics.CONNECTIONS_CLOSED.labels("bad_request").inc()
        self.transport.write(_error(400, f"The request is not valid HTTP/1.1 ({msg.rstrip('.')})",
                                    "invalid_http"))
        self._forget()
        self.transport.close()

    def handle_websocket_upgrade(self) -> None:
        # the connection leaves this protocol (the gateway has no WebSocket route, and the
        # CLI runs without a WebSocket protocol): it must not stay counted here
        self._forget()
        super().handle_websocket_upgrade()

    def _unsupported_upgrade_warning(self) -> None:
        # an Upgrade header is served as plain HTTP: not worth two warnings per request
        log.debug("ignored an Upgrade request from %s", self.client)

    def _forget(self) -> None:
        self._disarm()
        if self.guard is not None:
            self.guard.open.discard(self)
            self._idle(False)

    def connection_lost(self, exc) -> None:
        if self._shared:
            self._shared = False
            rebalance.SHARE.closed(self._rebalanced)
        self._forget()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.guard is None:
            super().data_received(data)
            return
        if self._reading != "body":
            self._head_bytes += len(data)
        super().data_received(data)
        if self._reading == "head" and self._head_bytes > self.guard.settings.max_header_bytes:
            self.closed("headers_too_large", _error(
                431, f"The request line and headers exceed server.max_header_bytes "
                     f"({self.guard.settings.max_header_bytes} bytes)", "headers_too_large"))

    # -- parser callbacks --------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._first_byte = time.perf_counter()  # the request's timing starts here (core/timing.py)
        if self.guard is None:
            return
        if self._reading != "head":  # a keep-alive request: its own deadline from its first byte
            self._reading = "head"
            self._head_deadline = time.monotonic() + self.guard.settings.header_timeout_s
            self._arm(self._head_deadline)

    def on_headers_complete(self) -> None:
        if self.guard is None:
            super().on_headers_complete()
            self.scope[FIRST_BYTE] = self._first_byte
            return
        self._reading, self._serving = "body", True
        self._head_bytes = 0
        self._idle(False)
        now = time.monotonic()
        self._body_start = self._body_last = now
        self._body_bytes = 0
        app = self.app
        if self._probes_only and httptools.parse_url(self.url).path not in PROBE_PATHS:
            self.app = _probes_only
        try:
            super().on_headers_complete()
        finally:
            self.app = app
        self.scope[FIRST_BYTE] = self._first_byte  # the app task has not run yet
        if self._shared and not self._rebalanced and self.cycle is not None and rebalance.SHARE.should_close():
            # more than this worker's share of the connections: this one closes after its response
            self._rebalanced = True
            self.cycle.keep_alive = False
            metrics.CONNECTIONS_CLOSED.labels("rebalance").inc()
        self._arm(now + self.guard.settings.body_timeout_s)

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        self._body_bytes += len(body)
        self._body_last = time.monotonic()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        if self.guard is None:
            return
        self._reading = None  # a pending check finds nothing to do
        if not self._serving:
            self._idle(True)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.guard is None or self.transport.is_closing():
            return
        self._serving = False
        if self._reading is None:
            self._idle(True)  # keep-alive: evictable until its next request

    # -- writing -----------------------------------------------------------------------
    def pause_writing(self) -> None:
        super().pause_writing()
        if self.guard is not None:
            self._send_stalled = time.monotonic()
            self._arm(self._send_stalled + self.guard.settings.send_timeout_s)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._send_stalled = 0.0

    # -- deadlines ---------------------------------------------------------------------
    def _check(self) -> None:
        self._timer = None
        s = self.guard.settings
        now = time.monotonic()
        if self._send_stalled:
            if now >= self._send_stalled + s.send_timeout_s:
                self.closed("send_timeout")  # the client stopped reading: the app sees a disconnect
                return
            self._arm(self._send_stalled + s.send_timeout_s)
        if self._reading == "head":
            if now >= self._head_deadline:
                self.closed("header_timeout", _error(
                    408, f"The request headers did not arrive within server.header_timeout_s "
                         f"({s.header_timeout_s:g}s)", "request_timeout"))
            else:
                self._arm(self._head_deadline)
        elif self._reading == "body":
            if self.flow.read_paused:  # the gateway is not reading: not the client's time
                self._body_last = now
                self._arm(now + s.body_timeout_s)
                return
            rate_allowance = self._body_bytes / s.body_min_bytes_per_s if s.body_min_bytes_per_s else float("inf")
            deadline = min(self._body_start + s.body_timeout_s + rate_allowance, self._body_last + s.body_timeout_s)
            if now >= deadline:
                self.closed("body_timeout", _error(
                    408, f"The request body arrived too slowly (server.body_timeout_s {s.body_timeout_s:g}s, "
                         f"server.body_min_bytes_per_s {s.body_min_bytes_per_s})", "request_timeout"))
            else:
                self._arm(deadline)


def make_guard(server_cfg) -> ConnectionGuard:
    """The guard of this worker, from ``server`` config and the descriptor limit."""
    return ConnectionGuard(GuardSettings(
        header_timeout_s=server_cfg.header_timeout_s, max_header_bytes=server_cfg.max_header_bytes,
        body_timeout_s=server_cfg.body_timeout_s, body_min_bytes_per_s=server_cfg.body_min_bytes_per_s,
        max_connections=connection_cap(server_cfg.max_connections, fd_limit()),
        send_timeout_s=server_cfg.send_timeout_s))
