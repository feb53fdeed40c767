"""Operational endpoints under ``/admin``, guarded by the admin key
(``auth.admin_key_sha256``; without one they answer 403):

- ``GET /admin/status``: backends with health, drain state (``departing``: discovery saw it
  leave), in-flight count;
- ``POST /admin/backends/{name}/drain`` / ``undrain``: stop / resume sending new
  requests to a backend (in-flight ones finish);
- ``POST /admin/cache/flush``: flush every cache of the stage chain (``Stage.flush``; what
  each forgot, by name).

They act on the worker that answers; with several workers or replicas call each.
"""

from __future__ import annotations

import logging

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..config import GatewayConfig
from ..stages.auth import check_admin
from ..core.errors import GatewayError, NotFound

log = logging.getLogger("vlm_gateway.admin")


def _json(data, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json",
                    headers={"cache-control": "no-store"})


def _guarded(fn):
    async def endpoint(request: Request) -> Response:
        gw = request.app.state.gateway
        try:
            check_admin(gw.cfg.auth, request.headers)
            return await fn(gw, request)
        except GatewayError as e:
            return Response(e.json(), status_code=e.status, media_type="application/json", headers=e.headers)
    return endpoint


def _backend(gw, name: str):
    for b in gw.pool.backends:
        if b.name == name:
            return b
    raise NotFound(f"No backend named {name!r}", param="name", code="backend_not_found")


def _describe(b) -> dict:
    return {"name": b.name, "healthy": b.healthy, "drained": b.drained, "departing": b.departing,
            "available": b.available,
            "inflight": b.inflight, "models": sorted(b.models)}


async def status(gw, request: Request) -> Response:
    return _json({"backends": [_describe(b) for b in gw.pool.backends]})


async def drain(gw, request: Request) -> Response:
    b = _backend(gw, request.path_params["name"])
    b.drained = True
    log.warning("backend %s drained by an admin request", b.name)
    return _json(_describe(b))


async def undrain(gw, request: Request) -> Response:
    b = _backend(gw, request.path_params["name"])
    b.drained = False
    log.warning("backend %s undrained by an admin request", b.name)
    return _json(_describe(b))


async def flush(gw, request: Request) -> Response:
    flushed = await gw.chain.flush()
    log.warning("caches flushed by an admin request")
    return _json({"flushed": flushed})


def routes(cfg: GatewayConfig) -> list:
    return [
        Route("/admin/status", _guarded(status), methods=["GET"]),
        Route("/admin/backends/{name}/drain", _guarded(drain), methods=["POST"]),
        Route("/admin/backends/{name}/undrain", _guarded(undrain), methods=["POST"]),
        Route("/admin/cache/flush", _guarded(flush), methods=["POST"]),
    ]
