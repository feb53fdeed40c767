"""A small ring of the last completed requests, for the status page (/ui).

Per worker process (each worker shows its own recent requests); holds only
metadata the operator already sees in logs and metrics — never prompts, images
or answers.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from ..backends.backend import CHOSEN
from ..core.request import ChatRequest

RECENT: deque[dict[str, Any]] = deque(maxlen=50)


def record(route: str, req: "ChatRequest | None", status: int) -> None:
    """Called once per completion request, after the response is finished."""
    entry: dict[str, Any] = {"time": time.time(), "route": route, "status": status}
    if req is not None:
        b = req.state.get(CHOSEN)
        entry.update(
            request_id=req.request_id, model=req.model, stream=req.stream, tenant=req.tenant,
            backend=b.name if b is not None else None, images=len(req.images),
            visual_tokens_before=sum(i.tokens_before for i in req.images),
            visual_tokens_after=sum(i.tokens_after for i in req.images),
            duration_ms=round((time.perf_counter() - req.t_start) * 1000.0, 1),
            overhead_ms=round(max(0.0, time.perf_counter() - req.t_start - req.upstream_s) * 1000.0, 2),
            cache=next((v for k, v in req.response_headers.items() if k.lower() == "x-vlm-gateway-cache"), None),
        )
    RECENT.append(entry)


def snapshot(limit: int = 50) -> list[dict[str, Any]]:
    """Newest first."""
    return list(reversed(RECENT))[:limit]
