"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}``.

Everything a client can get wrong or the pool can fail at is raised as a
``GatewayError`` somewhere below and turned into this shape here; anything else
becomes a generic 500 whose details stay in the server log.
"""

from __future__ import annotations

import orjson


class GatewayError(Exception):
    status = 500
    type = "server_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 status: int | None = None, type: str | None = None,
                 headers: dict[str, str] | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        if status is not None:
            self.status = status
        if type is not None:
            self.type = type
        self.headers = headers or {}
        # bounded label for the rejections metric
        self.reason = reason or code or self.type

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type,
                          "param": self.param, "code": self.code}}

    def json(self) -> bytes:
        return orjson.dumps(self.body())


class BadRequest(GatewayError):
    status = 400
    type = "invalid_request_error"


class Unauthorized(GatewayError):
    status = 401
    type = "authentication_error"


class Forbidden(GatewayError):
    status = 403
    type = "permission_error"


class NotFound(GatewayError):
    status = 404
    type = "invalid_request_error"


class PayloadTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"


class RateLimited(GatewayError):
    status = 429
    type = "rate_limit_error"


# Every 5xx has OpenAI's type for server-side failures, "server_error"; the code says
# which one (upstream_timeout, no_healthy_backend, upstream_malformed, ...).
class BadGateway(GatewayError):
    status = 502
    type = "server_error"


class Unavailable(GatewayError):
    status = 503
    type = "server_error"


class GatewayTimeout(GatewayError):
    status = 504
    type = "server_error"


def error_bytes(status: int, message: str, type: str, code: str | None = None,
                param: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type, "param": param, "code": code}})
