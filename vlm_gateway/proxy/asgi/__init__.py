"""Pure-ASGI middleware, one concern per module (in the style of Starlette's own)."""

from .access_log import AccessLogMiddleware
from .browser_guard import BrowserGuardMiddleware
from .request_id import RequestIdMiddleware

__all__ = ["AccessLogMiddleware", "BrowserGuardMiddleware", "RequestIdMiddleware"]
