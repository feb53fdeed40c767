"""Whether one request may be answered from, and stored into, the response cache.

Default (``cache.mode: deterministic``): only answers that are reproducible are
cached: temperature 0, a seed, or top_k 1. ``always`` caches every request,
``off`` none. With ``cache.client_control`` a client can switch it per request:
``x-vlm-gateway-cache-mode: on | off``; ``Cache-Control: no-cache`` skips the
lookup but stores the fresh answer, ``no-store`` skips both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from ...core import headers as H

if TYPE_CHECKING:
    from ...config import CacheConfig
    from ...core.request import ChatRequest

MODE_HEADER = H.CACHE_MODE.name


class Decision(NamedTuple):
    lookup: bool
    store: bool


OFF = Decision(False, False)


def deterministic(body: dict) -> bool:
    t = body.get("temperature")
    if isinstance(t, (int, float)) and not isinstance(t, bool) and t == 0:
        return True
    if isinstance(body.get("seed"), int) and not isinstance(body.get("seed"), bool):
        return True
    return body.get("top_k") == 1


def decide(req: "ChatRequest", cfg: "CacheConfig") -> Decision:
    if req.route != "chat":
        return OFF
    on = cfg.mode == "always" or (cfg.mode == "deterministic" and deterministic(req.body))
    if not cfg.client_control:
        return Decision(on, on)
    asked = req.headers.get(MODE_HEADER, "").strip().lower()
    if asked == "off":
        return OFF
    if asked == "on":
        on = True
    if not on:
        return OFF
    cc = req.headers.get("cache-control", "").lower()
    if "no-store" in cc:
        return OFF
    if "no-cache" in cc:
        return Decision(False, True)
    return Decision(True, True)


def storable(req: "ChatRequest", completion: dict) -> bool:
    """Only complete, successful answers. ``finish_reason: length`` is complete for
    the max_tokens the client set (part of the key); without an explicit limit it
    was cut by the engine's own context limit, which differs per backend: not stored."""
    if not isinstance(completion, dict) or "error" in completion:
        return False
    choices = completion.get("choices")
    if not isinstance(choices, list) or not choices:
        return False
    explicit_limit = req.body.get("max_tokens") is not None or req.body.get("max_completion_tokens") is not None
    for c in choices:
        if not isinstance(c, dict) or not isinstance(c.get("message"), dict):
            return False
        fr = c.get("finish_reason")
        if fr in ("stop", "tool_calls", "function_call"):
            continue
        if fr == "length" and explicit_limit:
            continue
        return False
    return True
