"""Accept the client's ``x-request-id`` (if sane) or make one; expose it to the
endpoints through the exchange record (``exchange.py``). Every response carries ``x-request-id`` and
``x-vlm-gateway-overhead-ms``: the completion routes set the overhead themselves
(time in the gateway, upstream excluded); for every other response it is the time
from the request's arrival here to its first response byte."""

from __future__ import annotations

import re
import time
import uuid

from .exchange import exchange

_SANE = re.compile(rb"^[A-Za-z0-9._:-]{1,128}$")
OVERHEAD = b"x-vlm-gateway-overhead-ms"


class RequestIdMiddleware:
    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        rid = None
        for k, v in scope["headers"]:
            if k == b"x-request-id":
                if _SANE.match(v):
                    rid = v.decode()
                break
        rid = rid or uuid.uuid4().hex
        exchange(scope).request_id = rid
        raw = rid.encode()

        async def send_with_id(message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers") or [])
                names = {k.lower() for k, _ in headers}
                if b"x-request-id" not in names:
                    headers.append((b"x-request-id", raw))
                if OVERHEAD not in names:
                    headers.append((OVERHEAD, b"%.3f" % ((time.perf_counter() - t0) * 1000.0)))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_id)
