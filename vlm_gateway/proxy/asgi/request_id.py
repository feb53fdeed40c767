"""Accept the client's ``x-request-id`` (if sane) or make one; expose it to the
endpoints through ``scope["state"]`` and echo it on every response."""

from __future__ import annotations

import re
import uuid

_SANE = re.compile(rb"^[A-Za-z0-9._:-]{1,128}$")


class RequestIdMiddleware:
    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = None
        for k, v in scope["headers"]:
            if k == b"x-request-id":
                if _SANE.match(v):
                    rid = v.decode()
                break
        rid = rid or uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid
        raw = rid.encode()

        async def send_with_id(message) -> None:
            if message["type"] == "http.response.start":
                headers = message.get("headers") or []
                if not any(k == b"x-request-id" for k, _ in headers):
                    message["headers"] = [*headers, (b"x-request-id", raw)]
            await send(message)

        await self.app(scope, receive, send_with_id)
