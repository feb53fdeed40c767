"""What the ASGI layers and the completion endpoint tell each other about one HTTP
exchange: one typed record in the ASGI scope, not string keys in ``scope["state"]``.

Written by ``RequestIdMiddleware`` (the id), the endpoint (the parsed request, the final
status: 499 for a client that went away, the bounded error reason) and the browser guard
(its refusal's reason); read by ``AccessLogMiddleware`` when the response is sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, MutableMapping

from ...core.request import ChatRequest

_KEY = "vlm_gateway.exchange"


@dataclass(slots=True)
class Exchange:
    request_id: str | None = None
    req: ChatRequest | None = None
    status: int | None = None   # the status the endpoint settled on (the sent one may differ: 499)
    error: str | None = None    # bounded reason (a metric label's value), never client text


def exchange(scope: MutableMapping[str, Any]) -> Exchange:
    """This exchange's record, made on first use."""
    ex = scope.get(_KEY)
    if ex is None:
        ex = scope[_KEY] = Exchange()
    return ex
