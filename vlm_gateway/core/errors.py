"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}``.

Everything a client can get wrong or the pool can fail at is raised as a
``GatewayError`` somewhere below and turned into this shape here; anything else
becomes a generic 500 whose details stay in the server log.

The hierarchy (status, OpenAI ``type``; the ``code`` names the case)::

    GatewayError                500  server_error
    ├── BadRequest              400  invalid_request_error
    ├── Unauthorized            401  authentication_error
    ├── Forbidden               403  permission_error
    ├── NotFound                404  invalid_request_error
    ├── PayloadTooLarge         413  invalid_request_error
    ├── RateLimited             429  rate_limit_error     (Retry-After)
    ├── BadGateway              502  server_error         (upstream_malformed, upstream_disconnected, ...)
    ├── Unavailable             503  server_error         (no_healthy_backend, image_queue_full, ...)
    └── GatewayTimeout          504  server_error         (upstream_timeout)

A raise may override ``status`` or ``type`` per instance (e.g. 501 for a video the engine
cannot be sent) without a class of its own; ``error_bytes`` gives the same shape where no
exception is raised (a 405, the readiness probe).
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
