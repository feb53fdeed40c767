"""A small ring of the last completed requests, for the status page (/ui).

Per worker process (each worker shows its own recent requests); holds only
metadata the operator already sees in logs and metrics — never prompts, images
or answers.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from ..core.request import ChatRequest
from . import summary

RECENT: deque[dict[str, Any]] = deque(maxlen=50)


def record(route: str, req: "ChatRequest | None", status: int) -> None:
    """Called once per completion request, after the response is finished."""
    entry: dict[str, Any] = {"time": time.time(), "route": route, "status": status}
    if req is not None:
        now = time.perf_counter()
        before, after = summary.visual_tokens(req)
        entry.update(
            request_id=req.request_id, model=req.model, stream=req.stream, tenant=req.tenant,
            backend=summary.backend_name(req), images=len(req.images),
            visual_tokens_before=before, visual_tokens_after=after,
            duration_ms=round((now - req.t_start) * 1000.0, 1),
            overhead_ms=round(summary.overhead_s(req, now) * 1000.0, 2),
            cache=summary.cache_result(req),
        )
    RECENT.append(entry)


def snapshot(limit: int = 50) -> list[dict[str, Any]]:
    """Newest first."""
    return list(reversed(RECENT))[:limit]
