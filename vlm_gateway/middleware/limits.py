"""Request limits checked before any image is decoded: number of messages, images
per request, total inline image bytes, and the max_tokens cap (per tenant, else
global). Each refusal is a 4xx that names the limit; the body size itself is
refused earlier with 413 by the endpoint. Pixels per image are checked by the
image stage once the header is read (``images.max_source_pixels``).

A request that leaves ``max_tokens`` out gets the cap written in, so the engine's
own default (often the whole context) cannot exceed it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..proxy.errors import BadRequest, PayloadTooLarge

if TYPE_CHECKING:
    from ..proxy.gateway import Gateway
    from ..proxy.request import ChatRequest


def inline_bytes(url: str) -> int:
    """Decoded size of a ``data:`` URL's payload, from its length (no decoding)."""
    if not url.startswith("data:"):
        return 0
    comma = url.find(",")
    if comma < 0:
        return 0
    n = len(url) - comma - 1
    if ";base64" in url[:comma]:
        return n * 3 // 4
    return n


def make(gw: "Gateway"):
    lim = gw.cfg.limits

    async def limits(req: "ChatRequest"):
        if req.route == "chat" and lim.max_messages and len(req.body["messages"]) > lim.max_messages:
            raise BadRequest(f"Too many messages: {len(req.body['messages'])} > limit max_messages "
                             f"({lim.max_messages})", param="messages", code="too_many_messages")
        if lim.max_images_per_request and len(req.images) > lim.max_images_per_request:
            raise BadRequest(f"Too many images: {len(req.images)} > limit max_images_per_request "
                             f"({lim.max_images_per_request})", param="messages", code="too_many_images")
        if lim.max_total_image_bytes and req.images:
            total = sum(inline_bytes(p.url) for p in req.images)
            if total > lim.max_total_image_bytes:
                raise PayloadTooLarge(f"Inline images total {total} bytes > limit max_total_image_bytes "
                                      f"({lim.max_total_image_bytes})", param="messages",
                                      code="image_bytes_too_large", reason="image_bytes_too_large")
        t = req.state.get("tenant_cfg")
        cap = (t.max_tokens_cap if t is not None and t.max_tokens_cap else 0) or lim.max_tokens_cap
        if cap:
            asked = [(k, req.body[k]) for k in ("max_tokens", "max_completion_tokens")
                     if isinstance(req.body.get(k), int)]
            for k, v in asked:
                if v > cap:
                    raise BadRequest(f"'{k}' is {v}, above this key's limit max_tokens_cap ({cap})",
                                     param=k, code="max_tokens_exceeded")
            if not asked:
                req.body["max_tokens"] = cap
        return None

    return limits
