"""Pure-ASGI middleware, one concern per module (in the style of Starlette's own)."""

from .request_id import RequestIdMiddleware

__all__ = ["RequestIdMiddleware"]
