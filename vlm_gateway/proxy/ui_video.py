"""``POST /ui/api/rewrite-video`` for the /ui playground: what the gateway does to a video.

Body ``{"video": "data:video/...;base64,...", "model": ..}``. Runs the gateway's own
video rewrite (stages/video/stage.py: same settings for the model, same decode
pool and L1 cache) on a one-video chat request, as a real request would go through
the media stage, and answers before/after figures: size, bytes, frames the engine
samples, their rate, prompt tokens (the engine's count for the source as sent and
for the rewrite), distinct screen states, the plan, the rewrite time, and the
rewritten video as a data URI. Nothing is sent upstream. Access control is the /ui
APIs' (ui.py).
"""

from __future__ import annotations

import time
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from .. import data_uri
from ..config import GatewayConfig
from ..stages.images.media import MediaStage
from ..stages.video.stage import engine_frames
from ..core.errors import BadRequest
from ..core.request import ChatRequest, MediaPart
from .playground_body import model_of, read_object

if TYPE_CHECKING:
    from .gateway import Gateway

def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json",
                    headers={"cache-control": "no-store"})


def _video_bytes(value: Any) -> bytes:
    if not isinstance(value, str) or not data_uri.BASE64_URI.match(value):
        raise BadRequest("'video' must be a base64 data URI (data:video/...;base64,...)", param="video",
                         code="invalid_type")
    try:
        return data_uri.decode(value)
    except data_uri.DataUriError:
        raise BadRequest("'video' is not valid base64", param="video", code="invalid_video") from None


def route(cfg: GatewayConfig):
    async def rewrite_video(request: Request) -> Response:
        gw: "Gateway" = request.app.state.gateway
        body = await read_object(request, cfg.server.max_body_bytes)
        if body is None:
            return Response(status_code=400)  # the client went away mid-body: nobody reads this
        model = model_of(body, gw)
        value = body.get("video")
        src_len = len(_video_bytes(value))
        stage = gw.chain.find(MediaStage)
        rewriter = stage.video if stage is not None else None
        if stage is None or rewriter is None:
            return _json({"model": model, "rewritten": False, "before": {"bytes": src_len}, "after": {"bytes": src_len},
                          "reason": "video rewriting is switched off (video.enabled)", "video": value})
        part_json = {"type": "video_url", "video_url": {"url": value}}
        req = ChatRequest(body={"model": model, "messages": [{"role": "user", "content": [part_json]}]},
                          route="chat", model=model, stream=False, headers={}, request_id="ui-rewrite-video",
                          media=[MediaPart(0, 0, part_json, kind="video", ptype="video_url")])
        t0 = time.perf_counter()
        try:
            await stage(req)
        except Exception as e:
            if getattr(e, "param", None) == "messages[0].content[0].video_url":
                e.param = "video"
            raise
        finally:
            await gw.chain.finish(req)  # give back the media bytes the stage held
        ms = (time.perf_counter() - t0) * 1000.0
        part = req.media[0]
        v = part.video
        e = v.entry
        src_n = engine_frames(e, rewriter.spec)
        return _json({
            "model": model, "rewritten": True, "outcome": v.outcome, "plan": e.plan, "states": e.states,
            "before": {"width": e.src_width, "height": e.src_height, "bytes": src_len, "frames": src_n,
                       "rate": str(Fraction(e.src_rate)), "tokens": v.before or None,
                       "seconds": e.duration_s, "decoded_frames": e.decoded_frames},
            "after": {"width": e.width, "height": e.height, "bytes": len(e.data), "frames": e.frames,
                      "rate": str(Fraction(e.rate)), "tokens": v.after},
            "tokens_saved": (v.before - v.after) if v.before else None,
            "rewrite_ms": round(ms, 2), "cpu_s": e.cpu_s, "video": part.url,
            "header": req.response_headers.get("x-vlm-gateway-video-1")})
    return rewrite_video

