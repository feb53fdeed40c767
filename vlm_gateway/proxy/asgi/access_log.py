"""One log line per HTTP request, written when the response has been sent.

It sits inside ``RequestIdMiddleware`` (so the request id is known) and reads what
the completion endpoint leaves in the exchange record (``exchange.py``): the parsed
``ChatRequest`` and the final status (499 for a client abort). The
line carries ids, hashes, counts and timings only: never an API key, a prompt, an
image or an answer. Probe and scrape paths are logged at DEBUG so a 1 s scrape
interval does not bury the request lines.
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Any

from .. import summary
from ..relay import USAGE
from .exchange import exchange

log = logging.getLogger("vlm_gateway.access")

QUIET_PATHS = frozenset({"/health", "/ready", "/metrics", "/favicon.ico"})


def tenant_hash(tenant: str) -> str:
    """Short stable hash: lets lines of one tenant be grouped without naming it."""
    return hashlib.sha256(tenant.encode()).hexdigest()[:12]


def _clip(value: Any, n: int = 64) -> str:
    """Client-chosen strings (model name) are clipped and kept printable."""
    s = str(value)[:n]
    return s if s.isprintable() else s.encode("unicode_escape").decode()[:n]


def request_fields(req, status: int) -> dict[str, Any]:
    """What a completed ChatRequest contributes to its log line."""
    out: dict[str, Any] = {
        "tenant": tenant_hash(req.tenant), "model": _clip(req.model), "stream": req.stream,
        "backend": summary.backend_name(req),
    }
    usage = req.state.get(USAGE)
    if isinstance(usage, dict):
        for k in ("prompt_tokens", "completion_tokens"):
            if isinstance(usage.get(k), int):
                out[k] = usage[k]
    if req.images:
        before, after = summary.visual_tokens(req)
        out.update(images=len(req.images), visual_tokens_before=before, visual_tokens_after=after,
                   visual_tokens_saved=max(0, before - after) if after else 0)
    out["cache"] = summary.cache_result(req)
    out["upstream_ms"] = round(req.upstream_s * 1000.0, 2)
    now = time.perf_counter()
    out["overhead_ms"] = round(summary.overhead_s(req, now) * 1000.0, 3)
    if req.timing is not None:  # the split of the time before the request went upstream
        for phase, seconds in req.timing.phases(now).items():
            out[f"{phase}_ms"] = round(seconds * 1000.0, 3)
    return out


class AccessLogMiddleware:
    def __init__(self, app, logger: logging.Logger | None = None) -> None:
        self.app = app
        self.log = logger or log

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        seen = {"status": 0, "ttfb": None, "bytes": 0}

        async def send_and_watch(message) -> None:
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
                seen["ttfb"] = time.perf_counter()
            elif message["type"] == "http.response.body":
                seen["bytes"] += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, send_and_watch)
        finally:
            try:
                self._write(scope, seen, t0)
            except Exception:  # logging must never break a response
                self.log.debug("access log line failed", exc_info=True)

    def _write(self, scope, seen: dict, t0: float) -> None:
        path = scope.get("path", "")
        level = logging.DEBUG if path in QUIET_PATHS else logging.INFO
        if not self.log.isEnabledFor(level):
            return
        ex = exchange(scope)
        status = ex.status or seen["status"] or 500
        fields: dict[str, Any] = {
            "request_id": ex.request_id, "method": scope.get("method"), "path": _clip(path, 128),
            "status": status, "duration_ms": round((time.perf_counter() - t0) * 1000.0, 2),
            "ttfb_ms": round((seen["ttfb"] - t0) * 1000.0, 2) if seen["ttfb"] is not None else None,
            "bytes_out": seen["bytes"],
        }
        if ex.req is not None:
            fields.update(request_fields(ex.req, status))
        if ex.error:
            fields["error"] = ex.error
        self.log.log(level, "%s %s %s", fields["method"], fields["path"], status, extra={"fields": fields})
