"""The stage contract.

A stage is a class built once per process from its config section and the shared
clients it needs (never the whole gateway), listed in the one explicit chain
(``stages/chain.py``). For every request the chain calls, in order,

    await stage(req) -> Reply | None
        before routing. A ``Reply`` answers the client at once (a cache hit) and ends
        the chain; raising a ``GatewayError`` answers with that error.

A stage that needs to act later on this request subscribes to it with
``req.subscribe(self)``; the subscribed stages' hook methods then run in the order
they subscribed:

    await before_send(req, backend)     after a backend is picked, before each attempt
                                        is sent (a retry on another backend runs it again)
    await on_complete(req, completion)  with the complete, successful answer (only when
                                        a stage asked for it: ``req.subscribe(self, completion=True)``)
    await on_finish(req)                once when the request ends, however it ends

and, once per process: ``start()`` after the event loop runs, ``close()`` on shutdown,
``flush()`` for ``POST /admin/cache/flush`` (what each cache forgot, by name).

``Hooks`` is the per-request half on its own: the base of a part that a stage runs
inside itself and that subscribes requests too, without being a stage of the chain
(the video rewrite is a ``MediaRewrite`` of the media stage, stages/images/media.py:
called as ``rewrite(req, part, source)``, its process hooks called by the media stage).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .request import ChatRequest


@dataclass(slots=True)
class Reply:
    """A complete answer produced by a stage (e.g. a cached completion)."""

    completion: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


class Hooks:
    """What a request subscriber offers (``req.subscribe``); each hook does nothing
    unless overridden."""

    async def before_send(self, req: ChatRequest, backend: Any) -> None:
        return None

    async def on_complete(self, req: ChatRequest, completion: dict[str, Any]) -> None:
        return None

    async def on_finish(self, req: ChatRequest) -> None:
        return None


class Stage(Hooks):
    """Base of every stage; each hook does nothing unless a stage overrides it."""

    name = "stage"

    async def __call__(self, req: ChatRequest) -> Reply | None:
        return None

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def flush(self) -> dict[str, int | None]:
        return {}
