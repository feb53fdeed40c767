"""The OpenAPI 3.1 description of the gateway's HTTP API, served at ``/openapi.json``.

It covers the OpenAI-compatible surface (the fields the gateway itself reads and
checks; anything else is forwarded to the engine untouched), health/readiness,
metrics and the admin endpoints. The fuzz tests generate requests from it.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .. import __version__
from ..config import GatewayConfig
from ..core import headers as H

_ERROR = {"$ref": "#/components/schemas/Error"}


def _errors(*codes: int) -> dict[str, Any]:
    return {str(c): {"description": "OpenAI-style error", "content": {"application/json": {"schema": _ERROR}}}
            for c in codes}


_IMAGE_PART = {
    "type": "object", "required": ["type", "image_url"],
    "properties": {
        "type": {"const": "image_url"},
        "image_url": {"oneOf": [
            {"type": "string"},
            {"type": "object", "required": ["url"], "properties": {
                "url": {"type": "string", "description": "https URL or data:image/...;base64,... URI"},
                "detail": {"enum": ["auto", "low", "high"]}}}]},
    },
}
_TEXT_PART = {"type": "object", "required": ["type", "text"],
              "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}
_MESSAGE = {
    "type": "object", "required": ["role"],
    "properties": {
        "role": {"enum": ["system", "developer", "user", "assistant", "tool", "function"]},
        "content": {"oneOf": [{"type": "string"}, {"type": "null"},
                              {"type": "array", "items": {"oneOf": [_TEXT_PART, _IMAGE_PART]}}]},
        "name": {"type": "string"},
    },
}
_COMMON = {
    "model": {"type": "string", "minLength": 1},
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    "max_tokens": {"type": "integer", "minimum": 0},
    "max_completion_tokens": {"type": "integer", "minimum": 0},
    "n": {"type": "integer", "minimum": 1},
    "temperature": {"type": "number"},
    "top_p": {"type": "number"},
    "seed": {"type": "integer"},
    "stop": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
}
_CHAT_REQUEST = {"type": "object", "required": ["model", "messages"],
                 "properties": {**_COMMON, "messages": {"type": "array", "minItems": 1, "items": _MESSAGE}}}
_COMPLETION_REQUEST = {"type": "object", "required": ["model", "prompt"],
                       "properties": {**_COMMON, "prompt": {"oneOf": [{"type": "string"},
                                                                      {"type": "array"}]}}}


def _completion_path(summary: str, schema_ref: str) -> dict[str, Any]:
    return {"post": {
        "summary": summary,
        "security": [{"bearer": []}, {}],
        "parameters": [{"name": h.name, "in": "header", "required": False, "description": h.doc,
                        "schema": {"type": "string"}} for h in H.REQUEST
                       if h.name.startswith("x-") or h.name == "cache-control"],
        "requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": schema_ref}}}},
        "responses": {
            "200": {"description": "A completion (JSON), or server-sent events when stream is true",
                    "content": {"application/json": {"schema": {"type": "object"}},
                                "text/event-stream": {"schema": {"type": "string"}}},
                    "headers": {name: {"description": h.doc, "schema": {"type": "string"}}
                                for h in H.RESPONSE for name in h.expand(1)}},
            **_errors(400, 401, 403, 404, 413, 429, 501, 502, 503, 504)}}}


def _admin(method: str, summary: str, params: list | None = None) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "security": [{"bearer": []}],
                          "responses": {"200": {"description": "Done",
                                                "content": {"application/json": {"schema": {"type": "object"}}}},
                                        **_errors(401, 403, 404)}}
    if params:
        op["parameters"] = params
    return {method: op}


_BACKEND_PARAM = [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}]


def spec(cfg: GatewayConfig | None = None) -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": "vlm-gateway", "version": __version__,
                 "description": "OpenAI-compatible gateway for vision-language model servers."},
        "paths": {
            "/v1/chat/completions": _completion_path("Chat completion (text and image_url parts)",
                                                     "#/components/schemas/ChatCompletionRequest"),
            "/v1/completions": _completion_path("Text completion", "#/components/schemas/CompletionRequest"),
            "/v1/models": {"get": {"summary": "Served models", "responses": {
                "200": {"description": "Model list", "content": {"application/json": {"schema": {
                    "type": "object", "properties": {"object": {"const": "list"}, "data": {"type": "array"}}}}}}}}},
            "/health": {"get": {"summary": "Liveness", "responses": {"200": {"description": "Alive"}}}},
            "/ready": {"get": {"summary": "Readiness: at least one healthy backend",
                               "responses": {"200": {"description": "Ready"}, **_errors(503)}}},
            "/metrics": {"get": {"summary": "Prometheus metrics",
                                 "responses": {"200": {"description": "Text exposition format"}}}},
            "/admin/status": _admin("get", "Backends with health, drain state and in-flight counts"),
            "/admin/backends/{name}/drain": _admin("post", "Stop sending new requests to a backend",
                                                   _BACKEND_PARAM),
            "/admin/backends/{name}/undrain": _admin("post", "Send requests to a drained backend again",
                                                     _BACKEND_PARAM),
            "/admin/cache/flush": _admin("post", "Empty the response and image caches of this replica "
                                                 "(and their Redis entries)"),
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "Tenant API key (admin key for /admin)"}},
            "schemas": {
                "ChatCompletionRequest": _CHAT_REQUEST,
                "CompletionRequest": _COMPLETION_REQUEST,
                "Error": {"type": "object", "required": ["error"], "properties": {"error": {
                    "type": "object", "required": ["message", "type"],
                    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                                   "param": {"type": ["string", "null"]},
                                   "code": {"type": ["string", "null"]}}}}},
            },
        },
    }


def routes(cfg: GatewayConfig) -> list:
    body = orjson.dumps(spec(cfg))

    async def openapi(request: Request) -> Response:
        return Response(body, media_type="application/json")

    return [Route("/openapi.json", openapi, methods=["GET"])]
