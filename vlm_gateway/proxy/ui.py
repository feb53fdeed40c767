"""The playground and status page at /ui, and the small JSON APIs behind it.

Static files (``vlm_gateway/ui/``) need no build step. The APIs:

- ``POST /ui/api/rewrite`` ``{"image": "data:...;base64,...", "model": .., "detail": ..}``
  runs the image stage's rewrite on the bytes and returns before/after figures
  (size, bytes, visual tokens) plus the rewritten image as a data URI;
  ``POST /ui/api/rewrite-video`` does the same for a video (ui_video.py);
- ``GET /ui/api/status``: backends (profile, health, load, in-flight), cache hit
  ratios per level, image totals and this worker's recent requests.

Access: ``server.ui: false`` removes all of it. When an admin key is configured
(``auth.admin_key_sha256``) the APIs require it as ``Authorization: Bearer``; the
static files carry no data and stay readable. When tenants are configured but no
admin key is, /ui is disabled: the status view would show every tenant's traffic.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .. import metrics
from ..config import GatewayConfig
from ..data_uri import BASE64_URI, DataUriError, decode as data_uri_decode
from ..stages.auth import check_admin
from ..stages.images.stage import PLAN, ImageRewriter
from ..vision_tokens import visual_tokens
from . import recent
from .playground_body import model_of, read_object
from ..core.errors import BadRequest, GatewayError, NotFound
from ..core.request import ChatRequest, ImagePart

if TYPE_CHECKING:
    from .gateway import Gateway

STATIC_DIR = Path(__file__).resolve().parent.parent / "ui"


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json",
                    headers={"cache-control": "no-store"})


def _error(err: GatewayError) -> Response:
    return Response(err.json(), status_code=err.status, media_type="application/json",
                    headers=err.headers)


def _gateway(request: Request) -> "Gateway":
    return request.app.state.gateway


def _guarded(cfg: GatewayConfig, handler):
    async def endpoint(request: Request) -> Response:
        try:
            check_admin(cfg.auth, request.headers, "/ui APIs", open_without_key=True)
            return await handler(request)
        except GatewayError as e:
            return _error(e)
    return endpoint


# -- rewrite ---------------------------------------------------------------------------

def _describe(data: bytes, cfg: GatewayConfig) -> dict[str, Any]:
    """Size/format/tokens of encoded image bytes (header only, no full decode). The image
    stage's probe, not a bare Image.open: the same format allow-list and structural caps."""
    from ..stages.images.decode import ImageError, probe
    try:
        head = probe(data, cfg.images.max_source_pixels)
        w, h, fmt = head.width, head.height, head.format
    except ImageError as e:
        raise BadRequest(f"The image could not be read: {e}", param="image", code="invalid_image") from None
    ic = cfg.images
    try:
        tokens = visual_tokens(w, h, ic.grid_factor, ic.min_pixels, ic.max_pixels)
    except ValueError as e:
        raise BadRequest(f"The image cannot be sent to the model: {e}", param="image",
                         code="invalid_image") from None
    return {"width": w, "height": h, "bytes": len(data), "format": fmt, "tokens": tokens}


def _decode_data_uri(value: Any) -> tuple[bytes, str]:
    if not isinstance(value, str) or not BASE64_URI.match(value):
        raise BadRequest("'image' must be a base64 data URI (data:image/...;base64,...)",
                         param="image", code="invalid_type")
    try:
        return data_uri_decode(value), value
    except DataUriError:
        raise BadRequest("'image' is not valid base64", param="image", code="invalid_image") from None


def _budget_info(r) -> dict[str, Any] | None:
    """The long-side decision as the x-vlm-gateway-image-budget header reports it."""
    b = r.budget
    if b is None:
        return None
    return {"class": b.cls, "text_px": round(b.text_px, 1), "long_side": b.long_side,
            "legible_floor": b.legible_floor, "reason": b.reason}


async def _rewrite_with_stage(gw: "Gateway", data_uri: str, model: str, detail: str) -> tuple[str, dict]:
    """Run the gateway's own image stage on a one-image chat request, as a real
    request would go through it (same policy, same L1 cache), for the backend the
    router would pick now (its profile may cap the budget further). Returns the
    data URI that would go upstream and what the stage recorded. Nothing is sent
    and no request metrics are counted."""
    if not gw.cfg.images.enabled:
        return data_uri, {"rewritten": False, "reason": "image rewriting is switched off (images.enabled)"}
    rewriter = gw.chain.find(ImageRewriter)
    if rewriter is None:
        return data_uri, {"rewritten": False, "reason": "the image stage is not installed"}
    part: dict[str, Any] = {"type": "image_url", "image_url": {"url": data_uri}}
    if detail in ("low", "high"):
        part["image_url"]["detail"] = detail
    body = {"model": model, "messages": [{"role": "user", "content": [part]}]}
    image = ImagePart(0, 0, part)
    req = ChatRequest(body=body, route="chat", model=model, stream=False, headers={},
                      request_id="ui-rewrite", images=[image])
    try:
        await rewriter(req)
    finally:
        await gw.chain.finish(req)  # give back the media bytes the stage held for this request
    plan = req.state.get(PLAN)
    info: dict[str, Any] = {"tokens_before": image.tokens_before, "tokens_after": image.tokens_after}
    if plan is not None and plan.results:
        info["conversions"] = list(plan.results[0][0].conversions)
        info["image_budget"] = _budget_info(plan.results[0][0])
    try:
        backend = gw.pool.policy.rank(req, gw.pool.candidates(req))[0]
    except GatewayError:
        backend = None
    info["backend"] = backend.name if backend is not None else None
    if plan is not None and plan.policies and backend is not None:
        pol = plan.policies[0]
        capped = rewriter.for_backend(pol, plan.sources[0], backend)
        if capped != pol:
            r, _ = await rewriter.rewritten(image, plan.sources[0], capped)
            info["tokens_after"] = r.tokens_after
            info["budget"] = r.budget.long_side if r.budget is not None else capped.max_long_side
            info["image_budget"] = _budget_info(r)
            info["conversions"] = list(r.conversions)
            return (r.url or data_uri), {**info, "rewritten": r.url is not None}
    if plan is not None and plan.policies:
        b = plan.results[0][0].budget if plan.results else None
        info["budget"] = b.long_side if b is not None else plan.policies[0].max_long_side
    url = image.url
    return url, {**info, "rewritten": url != data_uri}


def routes_rewrite(cfg: GatewayConfig):
    async def rewrite(request: Request) -> Response:
        gw = _gateway(request)
        # the chat route's streaming limit: never more than max_body_bytes in memory
        body = await read_object(request, cfg.server.max_body_bytes)
        if body is None:
            return Response(status_code=400)  # the client went away mid-body: nobody reads this
        model = model_of(body, gw)
        detail = body.get("detail") or "auto"
        src, data_uri = _decode_data_uri(body.get("image"))
        loop = asyncio.get_running_loop()
        before = await loop.run_in_executor(None, _describe, src, cfg)
        t0 = time.perf_counter()
        try:
            out_uri, info = await _rewrite_with_stage(gw, data_uri, model, detail)
        except GatewayError as e:
            e.param = "image" if e.param and "image_url" in e.param else e.param
            raise
        ms = (time.perf_counter() - t0) * 1000.0
        if out_uri == data_uri:
            after = dict(before)
        else:
            out_bytes, _ = _decode_data_uri(out_uri)
            after = await loop.run_in_executor(None, _describe, out_bytes, cfg)
        # the stage's own token counts (per-model grid) win over the generic estimate
        if info.get("tokens_before"):
            before["tokens"] = info["tokens_before"]
        if info.get("tokens_after"):
            after["tokens"] = info["tokens_after"]
        return _json({"model": model, "detail": detail, "before": before, "after": after,
                      "rewritten": info.get("rewritten", False), "reason": info.get("reason"),
                      "backend": info.get("backend"), "budget": info.get("budget"),
                      "image_budget": info.get("image_budget"),
                      "tokens_saved": before["tokens"] - after["tokens"],
                      "rewrite_ms": round(ms, 2), "image": out_uri,
                      "conversions": info.get("conversions", [])})
    return rewrite


# -- status ----------------------------------------------------------------------------

def _counter_values() -> dict[str, dict[tuple, float]]:
    """Current values of the counters the status view summarises (all workers
    in multi-process mode, since render() aggregates them)."""
    from prometheus_client.parser import text_string_to_metric_families
    wanted = {"vlm_gateway_cache_lookups", "vlm_gateway_cache_hits", "vlm_gateway_requests",
              "vlm_gateway_visual_tokens", "vlm_gateway_image_bytes", "vlm_gateway_images"}
    body, _ = metrics.render()
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(body.decode()):
        if fam.name not in wanted:
            continue
        for s in fam.samples:
            if s.name.endswith("_total"):
                out.setdefault(fam.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def _sum_by(values: dict[tuple, float], label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for labels, v in values.items():
        key = dict(labels).get(label, "")
        out[key] = out.get(key, 0.0) + v
    return out


def _backend_view(b) -> dict[str, Any]:
    now = time.monotonic()
    cap = b.capacity
    return {
        "name": b.name, "engine": b.engine, "url": b.base_url, "models": sorted(b.models),
        "profile": b.profile.get("name") or (f"simulator: {b.sim_profile}" if b.sim_profile else ""),
        "gpu": b.profile.get("gpu") or "",
        "healthy": b.healthy, "available": b.available,
        "state": ("down" if not b.healthy else "ejected" if now < b.ejected_until
                  else "drained" if getattr(b, "drained", False) else "ok"),
        "inflight": b.inflight, "capacity": cap,
        "load": round(b.inflight / cap, 3) if cap else None,
        "engine_load": dict(b.engine_load),
        "scraped_age_s": round(now - b.scraped_at, 1) if b.scraped_at else None,
    }


def routes_status(cfg: GatewayConfig):
    async def status(request: Request) -> Response:
        gw = _gateway(request)
        loop = asyncio.get_running_loop()
        counters = await loop.run_in_executor(None, _counter_values)
        lookups = _sum_by(counters.get("vlm_gateway_cache_lookups", {}), "level")
        hits = _sum_by(counters.get("vlm_gateway_cache_hits", {}), "level")
        cache = [{"level": lvl, "lookups": int(lookups.get(lvl, 0)), "hits": int(hits.get(lvl, 0)),
                  "ratio": round(hits.get(lvl, 0) / n, 4) if n else None}
                 for lvl, n in sorted(lookups.items())]
        vt = _sum_by(counters.get("vlm_gateway_visual_tokens", {}), "stage")
        ib = _sum_by(counters.get("vlm_gateway_image_bytes", {}), "direction")
        req_by_status = _sum_by(counters.get("vlm_gateway_requests", {}), "status")
        return _json({
            "time": time.time(),
            "backends": [_backend_view(b) for b in gw.pool.backends],
            "routing_policy": cfg.routing.policy,
            # SLO-aware image budgets: each model pool's level (0 = full budgets) and its evidence
            "image_budget": {"enabled": cfg.slo.enabled, "pools": gw.pool.slo.status()},
            "cache": cache,
            "images": {"visual_tokens": {k: int(v) for k, v in vt.items()},
                       "bytes": {k: int(v) for k, v in ib.items()},
                       "outcomes": {k: int(v) for k, v in _sum_by(counters.get("vlm_gateway_images", {}),
                                                                 "outcome").items()}},
            "requests_by_status": {k: int(v) for k, v in req_by_status.items()},
            "recent": recent.snapshot(),
            "workers": cfg.server.workers,
        })
    return status


async def _models(request: Request) -> Response:
    return _json({"models": _gateway(request).pool.models()})


def routes(cfg: GatewayConfig) -> list:
    if not cfg.server.ui:
        return []
    if cfg.auth.tenants and not cfg.auth.admin_key_sha256:
        async def disabled(request: Request) -> Response:
            return _error(NotFound("The /ui page is disabled: API keys are configured but no admin key "
                                   "(auth.admin_key_sha256) is", code="ui_disabled"))
        return [Route("/ui", disabled), Route("/ui/{path:path}", disabled, methods=["GET", "POST"])]

    async def to_index(request: Request) -> Response:
        return RedirectResponse("/ui/", status_code=307)

    async def config(request: Request) -> Response:
        return _json({"auth": bool(cfg.auth.admin_key_sha256), "api_auth": bool(cfg.auth.tenants)})

    from . import ui_video
    return [
        Route("/ui", to_index, methods=["GET"]),
        Route("/ui/api/config", config, methods=["GET"]),
        Route("/ui/api/models", _guarded(cfg, _models), methods=["GET"]),
        Route("/ui/api/status", _guarded(cfg, routes_status(cfg)), methods=["GET"]),
        Route("/ui/api/rewrite", _guarded(cfg, routes_rewrite(cfg)), methods=["POST"]),
        Route("/ui/api/rewrite-video", _guarded(cfg, ui_video.route(cfg)), methods=["POST"]),
        Mount("/ui", app=StaticFiles(directory=str(STATIC_DIR), html=True), name="ui"),
    ]
