"""The ASGI application: routes, lifespan, middleware stack."""

from __future__ import annotations

import contextlib
import logging
import os

import orjson
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from .. import __version__, metrics
from ..config import GatewayConfig, config_from_json
from .asgi import AccessLogMiddleware, BrowserGuardMiddleware, RequestIdMiddleware
from .connection_guard import STATE_KEY as GUARD_STATE_KEY, make_guard
from .endpoints import CompletionEndpoint
from ..core import headers as H
from ..core.errors import GatewayError, NotFound, Unavailable, error_bytes
from .extra_routes import routes as extra_routes
from .gateway import Gateway
from ..core.request import parse_chat, parse_completion

log = logging.getLogger("vlm_gateway")

CONFIG_ENV = "VLM_GATEWAY_CONFIG_JSON"


def _json(data, status: int = 200, headers: dict | None = None) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json", headers=headers)


def _gateway(scope) -> Gateway:
    return scope["app"].state.gateway


async def models(request: Request) -> Response:
    gw = _gateway(request.scope)
    names = gw.pool.models()
    if gw.cfg.auth.tenants:  # with API keys, a key sees only the models it may use
        from ..stages.auth import visible_models
        try:
            names = visible_models(gw.keys, request.headers, names)
        except GatewayError as e:
            return Response(e.json(), status_code=e.status, media_type="application/json")
    data = [{"id": m, "object": "model", "created": 0, "owned_by": "vlm-gateway"} for m in names]
    return _json({"object": "list", "data": data})


def ui_served(cfg: GatewayConfig) -> bool:
    """/ui is on and not disabled for want of an admin key (see proxy/ui.py)."""
    return cfg.server.ui and not (cfg.auth.tenants and not cfg.auth.admin_key_sha256)


async def index(request: Request) -> Response:
    """``GET /``: a browser goes to the playground; anything else gets the map of the API."""
    cfg: GatewayConfig = request.app.state.config
    if ui_served(cfg) and "text/html" in request.headers.get("accept", ""):
        return RedirectResponse("/ui/", status_code=307)
    links = {"openai_base_url": "/v1", "models": "/v1/models", "chat": "/v1/chat/completions",
             "health": "/health", "ready": "/ready", "metrics": "/metrics", "openapi": "/openapi.json"}
    if ui_served(cfg):
        links["ui"] = "/ui/"
    return _json({"service": "vlm-gateway", "version": __version__, **links})


async def health(request: Request) -> Response:
    return _json({"status": "ok"})


async def ready(request: Request) -> Response:
    gw = _gateway(request.scope)
    healthy = [b.name for b in gw.pool.backends if b.available]
    if healthy:
        return _json({"status": "ready", "healthy_backends": len(healthy)})
    return Response(error_bytes(503, "No healthy backend", Unavailable.type, "no_healthy_backend"),
                    status_code=503, media_type="application/json", headers={"retry-after": "1"})


async def metrics_endpoint(request: Request) -> Response:
    body, ctype = metrics.render()
    return Response(body, media_type=ctype)


async def not_found(request: Request, exc: Exception) -> Response:
    err = NotFound(f"Unknown path {request.url.path}", code="unknown_url")
    return Response(err.json(), status_code=404, media_type="application/json")


async def method_not_allowed(request: Request, exc: Exception) -> Response:
    return Response(error_bytes(405, f"Method {request.method} not allowed on {request.url.path}",
                                "invalid_request_error", "method_not_allowed"),
                    status_code=405, media_type="application/json")


def middleware(cfg: GatewayConfig) -> list[Middleware]:
    """Outermost first: request id, access log, Host/Origin guard, CORS (only with allowed origins)."""
    s = cfg.server
    stack = [Middleware(RequestIdMiddleware), Middleware(AccessLogMiddleware),
             Middleware(BrowserGuardMiddleware, allowed_hosts=s.allowed_hosts, allowed_origins=s.allowed_origins,
                        bind_host=s.host)]
    if s.allowed_origins:
        from starlette.middleware.cors import CORSMiddleware
        stack.append(Middleware(CORSMiddleware, allow_origins=s.allowed_origins, allow_methods=["GET", "POST"],
                                allow_headers=["*"], max_age=600,
                                # every response header, for the configured image and video counts
                                expose_headers=H.exposed(cfg.limits.max_images_per_request,
                                                         cfg.limits.max_videos_per_request)))
    return stack


def create_app(cfg: GatewayConfig | None = None) -> Starlette:
    """Build the ASGI app. ``cfg`` defaults to what the CLI passed to this worker."""
    if cfg is None:
        cfg = config_from_json(orjson.loads(os.environ[CONFIG_ENV])) if CONFIG_ENV in os.environ \
            else GatewayConfig()
    if not logging.getLogger("vlm_gateway").handlers:
        # a worker spawned by uvicorn (--workers > 1) starts with logging unset
        from ..logs import setup_logging
        setup_logging(cfg.server.log_level, cfg.server.log_format)

    guard = make_guard(cfg.server)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        gw = Gateway(cfg)
        app.state.gateway = gw
        await gw.start()
        try:
            # lifespan state reaches uvicorn's protocols: the connection guard's settings and table
            yield {GUARD_STATE_KEY: guard}
        finally:
            await gw.close()

    routes = [
        Route("/", index, methods=["GET"]),
        Route("/v1/chat/completions", CompletionEndpoint("chat", parse_chat, _gateway), methods=["POST"]),
        Route("/v1/completions", CompletionEndpoint("completions", parse_completion, _gateway), methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
    ]
    routes += extra_routes(cfg)  # ui, admin, openapi
    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware(cfg),
                    exception_handlers={404: not_found, 405: method_not_allowed})
    app.state.config = cfg
    return app
