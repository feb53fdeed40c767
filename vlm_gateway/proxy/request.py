"""Parse a request body once into the small typed object that travels through
the stages, validating only what the gateway itself needs. Every other field is
left untouched in ``body`` and forwarded as is (vLLM extras included)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Protocol

import orjson

from .errors import BadRequest

# Content-part types an OpenAI-compatible VLM server understands; others are refused
# rather than silently dropped by the engine.
PART_TYPES = frozenset({
    "text", "image_url", "input_audio", "audio_url", "video_url", "image_embeds",
    "image_pil", "file", "refusal", "input_image", "input_text",
})
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


@dataclass(slots=True)
class ImagePart:
    """One ``image_url`` content part, addressed by its position."""

    message: int
    index: int
    part: dict[str, Any]
    # Filled by the image stage.
    content_hash: str = ""
    width: int = 0
    height: int = 0
    source_bytes: int = 0
    tokens_before: int = 0
    tokens_after: int = 0

    @property
    def param(self) -> str:
        return f"messages[{self.message}].content[{self.index}].image_url"

    @property
    def url(self) -> str:
        iu = self.part.get("image_url")
        return iu if isinstance(iu, str) else iu.get("url", "")


Hook = Callable[..., Awaitable[None]]


class StreamTransform(Protocol):
    def feed(self, data: bytes) -> bytes: ...  # relayed SSE bytes in, bytes to send out
    def close(self) -> bytes: ...  # at the end of the upstream body: what is still held


class ResponseTransform(Protocol):
    """A per-request rewrite of the answer that the relay applies before the client
    (and the response cache) sees it: a complete completion is changed in place
    (True if it changed); a stream's bytes go through ``stream()``."""

    def completion(self, completion: dict[str, Any]) -> bool: ...
    def stream(self) -> StreamTransform: ...


@dataclass(slots=True)
class ChatRequest:
    body: dict[str, Any]
    route: str  # "chat" | "completions"
    model: str
    stream: bool
    headers: dict[str, str]
    request_id: str
    images: list[ImagePart] = field(default_factory=list)
    tenant: str = "anonymous"
    cache_scope: str = "anonymous"
    t_start: float = field(default_factory=time.perf_counter)
    # Set by stages, read by the relay/routing/metrics.
    response_headers: dict[str, str] = field(default_factory=dict)
    # Run after a backend is picked, before the body is sent: (req, backend) -> None.
    # The image stage rewrites for the chosen backend's budget here.
    before_send: list[Hook] = field(default_factory=list)
    # Run with the complete, successful response dict: (req, completion) -> None.
    on_complete: list[Hook] = field(default_factory=list)
    # Run once when the request ends, however it ends (success, error, client abort):
    # (req) -> None or awaitable. Releases per-request holds such as concurrency slots.
    on_finish: list[Callable[..., Any]] = field(default_factory=list)
    # Free-form per-stage state (cache keys, affinity keys, tenant limits, ...).
    state: dict[str, Any] = field(default_factory=dict)
    # Gateway-side CPU/wait time spent outside the upstream call (seconds).
    upstream_s: float = 0.0
    # The coordinate plan of a request with images (middleware.grounding.plan.GroundingPlan).
    grounding: Any = None
    # Set by a stage to rewrite the answer text; None keeps the plain byte relay.
    response_transform: ResponseTransform | None = None

    @property
    def include_usage(self) -> bool:
        so = self.body.get("stream_options")
        return bool(self.stream and isinstance(so, dict) and so.get("include_usage"))

    def encode(self) -> bytes:
        return orjson.dumps(self.body)


def _type(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean",
            int: "integer", float: "number", type(None): "null"}.get(type(value), type(value).__name__)


def parse_json(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"Request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequest(f"Request body must be a JSON object, got {_type(body)}", code="invalid_json")
    return body


def _check(body: dict, key: str, types: tuple, what: str) -> None:
    if key in body and body[key] is not None and (not isinstance(body[key], types) or
                                                  (bool not in types and isinstance(body[key], bool))):
        raise BadRequest(f"'{key}' must be {what}, got {_type(body[key])}", param=key, code="invalid_type")


def _common(body: dict) -> tuple[str, bool]:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required and must be a non-empty string", param="model",
                         code="invalid_type" if "model" in body else "missing_required_parameter")
    _check(body, "stream", (bool,), "a boolean")
    _check(body, "stream_options", (dict,), "an object")
    _check(body, "max_tokens", (int,), "an integer")
    _check(body, "max_completion_tokens", (int,), "an integer")
    _check(body, "n", (int,), "an integer")
    _check(body, "temperature", (int, float), "a number")
    _check(body, "top_p", (int, float), "a number")
    _check(body, "seed", (int,), "an integer")
    for k in ("max_tokens", "max_completion_tokens", "n"):
        v = body.get(k)
        if isinstance(v, int) and v < (1 if k == "n" else 0):
            raise BadRequest(f"'{k}' must be >= {1 if k == 'n' else 0}", param=k, code="invalid_value")
    return model, bool(body.get("stream"))


def parse_chat(raw: bytes, headers: dict[str, str], request_id: str | None = None) -> ChatRequest:
    body = parse_json(raw)
    model, stream = _common(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty array", param="messages",
                         code="invalid_type" if "messages" in body else "missing_required_parameter")
    images: list[ImagePart] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise BadRequest(f"messages[{i}] must be an object, got {_type(msg)}", param=f"messages[{i}]",
                             code="invalid_type")
        role = msg.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise BadRequest(f"messages[{i}].role must be one of {', '.join(sorted(ROLES))}",
                             param=f"messages[{i}].role", code="invalid_value")
        content = msg.get("content")
        if content is None or isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise BadRequest(f"messages[{i}].content must be a string or an array of content parts, "
                             f"got {_type(content)}", param=f"messages[{i}].content", code="invalid_type")
        for j, part in enumerate(content):
            p = f"messages[{i}].content[{j}]"
            if not isinstance(part, dict):
                raise BadRequest(f"{p} must be an object, got {_type(part)}", param=p, code="invalid_type")
            ptype = part.get("type")
            if not isinstance(ptype, str) or ptype not in PART_TYPES:
                raise BadRequest(f"{p}.type {ptype!r} is not a supported content-part type",
                                 param=f"{p}.type", code="invalid_value")
            if ptype == "text":
                if not isinstance(part.get("text"), str):
                    raise BadRequest(f"{p}.text must be a string", param=f"{p}.text", code="invalid_type")
            elif ptype == "image_url":
                iu = part.get("image_url")
                url = iu if isinstance(iu, str) else iu.get("url") if isinstance(iu, dict) else None
                if not isinstance(url, str) or not url:
                    raise BadRequest(f"{p}.image_url.url must be a non-empty string", param=f"{p}.image_url",
                                     code="invalid_type")
                if isinstance(iu, dict) and "detail" in iu and iu["detail"] not in ("auto", "low", "high"):
                    raise BadRequest(f"{p}.image_url.detail must be auto, low or high",
                                     param=f"{p}.image_url.detail", code="invalid_value")
                images.append(ImagePart(i, j, part))
    return ChatRequest(body=body, route="chat", model=model, stream=stream, headers=headers,
                       request_id=request_id or uuid.uuid4().hex, images=images)


def parse_completion(raw: bytes, headers: dict[str, str], request_id: str | None = None) -> ChatRequest:
    body = parse_json(raw)
    model, stream = _common(body)
    prompt = body.get("prompt")
    if not isinstance(prompt, (str, list)):
        raise BadRequest("'prompt' must be a string or an array", param="prompt",
                         code="invalid_type" if "prompt" in body else "missing_required_parameter")
    return ChatRequest(body=body, route="completions", model=model, stream=stream, headers=headers,
                       request_id=request_id or uuid.uuid4().hex)
