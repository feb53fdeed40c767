"""What both ``/ui/api`` POST routes (an image, a video) read first: the JSON object (only
``application/json``, under the chat route's streaming limit) and the model it names, or
the first one served."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from starlette.requests import Request

from ..core.errors import BadRequest
from .body import read_json_object

if TYPE_CHECKING:
    from .gateway import Gateway


async def read_object(request: Request, limit: int) -> dict | None:
    """The body, or None when the client went away mid-body (its disconnect cancels the
    read; nobody is left to answer)."""
    try:
        return await read_json_object(request.scope, request.receive, limit)
    except asyncio.CancelledError:
        if asyncio.current_task().cancelling():
            raise
        return None


def model_of(body: dict, gw: "Gateway") -> str:
    models = gw.pool.models()
    model = body.get("model") or (models[0] if models else "")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required (no backend serves any model yet)", param="model",
                         code="missing_required_parameter")
    return model
