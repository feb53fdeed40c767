"""Request bodies of the JSON routes (the completion routes, ``/ui/api/rewrite``).

- ``require_json``: the media type must be ``application/json`` (or ``+json``),
  else 415 before a byte of the body is read. A web page can send ``text/plain``,
  form or multipart bodies cross-site without a CORS preflight; it cannot send
  ``application/json`` that way, so this closes the "simple request" path.
- ``read_body``: reads the body while counting it, and refuses with 413 as soon as
  it passes the limit (a declared Content-Length over the limit is refused before
  reading), so a chunked upload never costs more than the limit in memory.

How long a slow client may take to send it is bounded below, by the HTTP protocol
(``connection_guard.py``).
"""

from __future__ import annotations

import asyncio

import orjson

from ..core.errors import BadRequest, GatewayError, PayloadTooLarge

JSON_TYPES = ("application/json",)


class UnsupportedMediaType(GatewayError):
    status = 415
    type = "invalid_request_error"


def media_type(scope) -> str:
    for k, v in scope["headers"]:
        if k == b"content-type":
            return v.decode("latin-1").split(";", 1)[0].strip().lower()
    return ""


def require_json(scope) -> None:
    mt = media_type(scope)
    if mt in JSON_TYPES or (mt.startswith("application/") and mt.endswith("+json")):
        return
    got = f"'{mt[:64]}'" if mt else "no Content-Type"
    raise UnsupportedMediaType(f"Send the body as JSON with 'Content-Type: application/json' (got {got})",
                               code="unsupported_media_type", reason="unsupported_media_type")


async def read_body(scope, receive, limit: int) -> bytes:
    for k, v in scope["headers"]:
        if k == b"content-length":
            try:
                if int(v) > limit:
                    raise PayloadTooLarge(f"Request body is larger than the limit of {limit} bytes",
                                          code="body_too_large", reason="body_too_large")
            except ValueError:
                pass
            break
    chunks = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise asyncio.CancelledError
        body = msg.get("body", b"")
        size += len(body)
        if size > limit:
            raise PayloadTooLarge(f"Request body is larger than the limit of {limit} bytes",
                                  code="body_too_large", reason="body_too_large")
        chunks.append(body)
        if not msg.get("more_body"):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def read_json_body(scope, receive, limit: int) -> bytes:
    """``require_json`` then ``read_body``."""
    require_json(scope)
    return await read_body(scope, receive, limit)


async def read_json_object(scope, receive, limit: int) -> dict:
    """``read_json_body``, parsed: a JSON object or a 400 (the /ui API routes)."""
    raw = await read_json_body(scope, receive, limit)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise BadRequest("Request body is not valid JSON", code="invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequest("Request body must be a JSON object", code="invalid_json")
    return body
