"""Request stages: plain async functions over one parsed ``ChatRequest``.

A stage is ``async def stage(req) -> Reply | None``. Returning a ``Reply`` ends the
chain and answers the client without a backend (a cache hit); raising a
``GatewayError`` answers with that error. Stages can also register
``req.before_send`` hooks (run once a backend is chosen) and ``req.on_complete``
hooks (run with a complete, successful response). ``build_stages`` assembles the
chain from the configuration, in the order of DESIGN.md:
auth/rate-limit -> image rewrite (L1) -> L3 lookup.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable

if TYPE_CHECKING:
    from ..core.request import ChatRequest


@dataclass(slots=True)
class Reply:
    """A complete answer produced by a stage (e.g. a cached completion)."""

    completion: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


Stage = Callable[["ChatRequest"], Awaitable["Reply | None"]]


async def run_stages(stages: list[Stage], req: "ChatRequest") -> Reply | None:
    for stage in stages:
        reply = await stage(req)
        if reply is not None:
            return reply
    return None
