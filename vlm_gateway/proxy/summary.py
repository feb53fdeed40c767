"""What the gateway did to one completion request, read in one place by the response
headers, the access log line, the ``/ui`` recent list and the overhead metric.

    overhead = now - t_start - upstream_s    time spent in the gateway, the upstream's excluded
    backend  = the backend the last attempt went to (None: a cache hit or a refusal)
    cache    = the x-vlm-gateway-cache result the stages set (None: no lookup)
    visual tokens before/after = sums over the request's images
"""

from __future__ import annotations

import time

from ..core import headers as H
from ..backends.backend import CHOSEN
from ..core.request import ChatRequest

CACHE_HEADER = H.CACHE.name


def overhead_s(req: ChatRequest, now: float | None = None) -> float:
    return max(0.0, (time.perf_counter() if now is None else now) - req.t_start - req.upstream_s)


def backend_name(req: ChatRequest) -> str | None:
    b = req.state.get(CHOSEN)
    return b.name if b is not None else None


def cache_result(req: ChatRequest) -> str | None:
    return next((v for k, v in req.response_headers.items() if k.lower() == CACHE_HEADER), None)


def visual_tokens(req: ChatRequest) -> tuple[int, int]:
    return sum(i.tokens_before for i in req.images), sum(i.tokens_after for i in req.images)
