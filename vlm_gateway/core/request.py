"""Parse a request body once into the small typed object that travels through
the stages, validating only what the gateway itself needs. Every other field is
left untouched in ``body`` and forwarded as is (vLLM extras included)."""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from .errors import BadRequest
from .state import State
from .timing import Timing

# Content-part types and where each keeps what the engine reads. Text parts carry
# text only; every other accepted type carries media and becomes a ``MediaPart``
# that the media stages police (fetch policy, limits, identity) or refuse.
TEXT_PARTS = {"text": "text", "input_text": "text", "refusal": "refusal"}
# type -> (kind, key holding the media)
MEDIA_PARTS: dict[str, tuple[str, str]] = {
    "image_url": ("image", "image_url"),
    "input_image": ("image", "image_url"),   # Responses-style: image_url is a string
    "video_url": ("video", "video_url"),
    "audio_url": ("audio", "audio_url"),
    "input_audio": ("audio", "input_audio"),  # {"data": base64, "format": "wav"}
    "image_embeds": ("embeds", "image_embeds"),
    "image_pil": ("pil", "image_pil"),
    "file": ("file", "file"),
}
PART_TYPES = frozenset(TEXT_PARTS) | frozenset(MEDIA_PARTS)
# Keys under which an engine finds media in a part whatever its type (vLLM reads them
# by key when a part has a ``uuid`` or no type). A part may carry only its own one.
MEDIA_KEYS = frozenset({"image_url", "video_url", "audio_url", "input_audio", "image_embeds", "audio_embeds",
                        "prompt_embeds", "image_pil", "file"})
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_AUDIO_FORMAT = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+-]{0,31}")


@dataclass(slots=True)
class MediaPart:
    """One content part that carries media, addressed by its position. ``kind`` is
    image | video | audio | embeds | pil | file; ``ptype`` the part's type."""

    message: int
    index: int
    part: dict[str, Any]
    # Filled by the media stages.
    content_hash: str = ""
    width: int = 0
    height: int = 0
    source_bytes: int = 0
    tokens_before: int = 0
    tokens_after: int = 0
    # the size the image stage sends (its rewrite before routing, or at the chosen backend's
    # cap after it); 0 until it has decided: admission checks this, not a guess
    sent_width: int = 0
    sent_height: int = 0
    # sent smaller than its own budget because of the SLO budget level (stages/images/pressure.py)
    degraded: bool = False
    kind: str = "image"
    ptype: str = "image_url"
    # what the video stage did (stages.video.stage.VideoSent) for a video part
    video: Any = None

    @property
    def param(self) -> str:
        return f"messages[{self.message}].content[{self.index}].{self.ptype}"

    @property
    def key(self) -> str:
        """The key of ``part`` that holds the media."""
        return MEDIA_PARTS[self.ptype][1]

    @property
    def url(self) -> str:
        """The URL (http(s) or data:) of a URL-carrying part; "" for others."""
        v = self.part.get(self.key)
        if isinstance(v, str):
            return v
        if isinstance(v, dict) and self.ptype in ("image_url", "video_url", "audio_url"):
            u = v.get("url")
            return u if isinstance(u, str) else ""
        return ""

    def set_url(self, url: str) -> None:
        """Write the URL to send back in the shape the client used."""
        v = self.part.get(self.key)
        if isinstance(v, dict):
            v["url"] = url
        else:
            self.part[self.key] = url

    @property
    def detail(self) -> str | None:
        if self.ptype == "input_image":
            d = self.part.get("detail")
        else:
            v = self.part.get(self.key)
            d = v.get("detail") if isinstance(v, dict) else None
        return d if isinstance(d, str) else None


# Most of the code deals with images only; an image part is a media part of kind "image".
ImagePart = MediaPart


class Subscriber(Protocol):
    """What a subscriber of a request offers (``core.stage.Hooks`` is the base, of every
    ``Stage`` too)."""

    async def before_send(self, req: "ChatRequest", backend: Any) -> None: ...
    async def on_complete(self, req: "ChatRequest", completion: dict[str, Any]) -> None: ...
    async def on_finish(self, req: "ChatRequest") -> None: ...


class StreamTransform(Protocol):
    # whole SSE events in (the relay frames them and applies the event cap first), events out
    async def feed(self, events: bytes) -> bytes: ...
    async def close(self) -> bytes: ...  # at the end of the upstream body: what is still held


class ResponseTransform(Protocol):
    """A per-request rewrite of the answer that the relay applies before the client
    (and the response cache) sees it: a complete completion is changed in place
    (True if it changed); a stream's events go through ``stream()``. Both are coroutines so
    that an implementation can do large inputs off the event loop."""

    async def completion(self, completion: dict[str, Any]) -> bool: ...
    def stream(self) -> StreamTransform: ...


@dataclass(slots=True)
class MediaTally:
    """Media bytes of one request: per kind (data: payloads and fetched bodies, for
    the per-request totals) and held (reserved from the process-wide bound on
    bytes in flight, given back when the request ends)."""

    by_kind: dict[str, int] = field(default_factory=dict)
    held: int = 0


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
    # Stages whose hooks (before_send, on_complete, on_finish) run for this request, in
    # the order they subscribed (core/stage.py); ``wants_completion``: a subscriber needs
    # the complete answer (a stream is then assembled as it passes).
    hooks: list[Subscriber] = field(default_factory=list)
    wants_completion: bool = False
    # Typed per-request state, keyed by slots their writers declare (core/state.py).
    state: State = field(default_factory=State)
    # Gateway-side CPU/wait time spent outside the upstream call (seconds).
    upstream_s: float = 0.0
    # Every media part (images included, in order); ``images`` is its image subset.
    media: list[MediaPart] = field(default_factory=list)
    # Media bytes this request counts against its limits and holds in memory.
    media_bytes: MediaTally = field(default_factory=MediaTally)

    def subscribe(self, stage: Subscriber, completion: bool = False) -> None:
        """Run ``stage``'s hooks for this request (once, however often it asks)."""
        if stage not in self.hooks:
            self.hooks.append(stage)
        if completion:
            self.wants_completion = True

    def visual_items(self) -> int:
        """Parts a per-minute image limit counts: images, videos, image embeddings."""
        return len(self.images) + sum(1 for p in self.media if p.kind in ("video", "embeds"))
    # The coordinate plan of a request with images (stages.grounding.plan.GroundingPlan).
    grounding: Any = None
    # Where the gateway's time went, from the request's first byte (core/timing.py).
    timing: Timing | None = None
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


def _url_of(v: Any, p: str, key: str) -> None:
    url = v if isinstance(v, str) else v.get("url") if isinstance(v, dict) else None
    if not isinstance(url, str) or not url:
        raise BadRequest(f"{p}.{key}.url must be a non-empty string", param=f"{p}.{key}", code="invalid_type")


def _media_part(i: int, j: int, part: dict, ptype: str, p: str) -> MediaPart:
    kind, key = MEDIA_PARTS[ptype]
    v = part.get(key)
    if ptype in ("image_url", "video_url", "audio_url"):
        _url_of(v, p, key)
        if ptype == "image_url" and isinstance(v, dict) and "detail" in v and v["detail"] not in ("auto", "low", "high"):
            raise BadRequest(f"{p}.image_url.detail must be auto, low or high",
                             param=f"{p}.image_url.detail", code="invalid_value")
    elif ptype == "input_image":
        if not isinstance(v, str) or not v:
            raise BadRequest(f"{p}.image_url must be a non-empty URL string (file_id references are not "
                             "supported: send the image itself)", param=f"{p}.input_image", code="invalid_type")
        if part.get("detail") not in (None, "auto", "low", "high"):
            raise BadRequest(f"{p}.detail must be auto, low or high", param=f"{p}.detail", code="invalid_value")
    elif ptype == "input_audio":
        if not isinstance(v, dict) or not isinstance(v.get("data"), str) or not v["data"]:
            raise BadRequest(f"{p}.input_audio.data must be a non-empty base64 string",
                             param=f"{p}.input_audio", code="invalid_type")
        fmt = v.get("format")
        if not isinstance(fmt, str) or not _AUDIO_FORMAT.fullmatch(fmt):
            raise BadRequest(f"{p}.input_audio.format must be an audio format name such as wav or mp3",
                             param=f"{p}.input_audio", code="invalid_value")
    elif ptype == "image_embeds":
        if not (isinstance(v, str) and v) and not (isinstance(v, dict) and v and
                                                    all(isinstance(x, str) for x in v.values())):
            raise BadRequest(f"{p}.image_embeds must be a base64 string or an object of base64 strings",
                             param=f"{p}.image_embeds", code="invalid_type")
    elif ptype == "image_pil":
        raise BadRequest(f"{p}: image_pil parts hold an in-process Python image, which an HTTP request cannot "
                         "carry; send the image as an image_url part with a data: URI",
                         param=f"{p}.image_pil", code="unsupported_content_part")
    elif ptype == "file":
        raise BadRequest(f"{p}: file parts are not read by the engines behind this gateway; send images as "
                         "image_url parts (data: URI or http(s) URL)", param=f"{p}.file",
                         code="unsupported_content_part")
    return MediaPart(i, j, part, kind=kind, ptype=ptype)


def parse_chat(raw: bytes, headers: dict[str, str], request_id: str | None = None) -> ChatRequest:
    body = parse_json(raw)
    model, stream = _common(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty array", param="messages",
                         code="invalid_type" if "messages" in body else "missing_required_parameter")
    images: list[MediaPart] = []
    media: list[MediaPart] = []
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
                raise BadRequest(f"{p}.type {ptype!r} is not a supported content-part type (supported: "
                                 f"{', '.join(sorted(PART_TYPES - {'image_pil', 'file'}))})",
                                 param=f"{p}.type", code="invalid_value")
            for k in part:
                if k == "uuid" and part[k] is not None:
                    raise BadRequest(f"{p}.uuid is not accepted: it lets the engine reuse media it cached under a "
                                     "client-chosen id, which the gateway cannot check; send the media itself",
                                     param=f"{p}.uuid", code="media_uuid_not_allowed")
                if k in MEDIA_KEYS and MEDIA_PARTS.get(ptype, ("", ""))[1] != k:
                    raise BadRequest(f"{p} is a {ptype!r} part but also carries {k!r}; send each image, video "
                                     "or audio as its own part", param=f"{p}.{k}", code="unexpected_media_field")
            if ptype in TEXT_PARTS:
                key = TEXT_PARTS[ptype]
                if not isinstance(part.get(key), str):
                    raise BadRequest(f"{p}.{key} must be a string", param=f"{p}.{key}", code="invalid_type")
                continue
            mp = _media_part(i, j, part, ptype, p)
            media.append(mp)
            if mp.kind == "image":
                images.append(mp)
    return ChatRequest(body=body, route="chat", model=model, stream=stream, headers=headers,
                       request_id=request_id or uuid.uuid4().hex, images=images, media=media)


def parse_completion(raw: bytes, headers: dict[str, str], request_id: str | None = None) -> ChatRequest:
    body = parse_json(raw)
    model, stream = _common(body)
    prompt = body.get("prompt")
    if not isinstance(prompt, (str, list)):
        raise BadRequest("'prompt' must be a string or an array", param="prompt",
                         code="invalid_type" if "prompt" in body else "missing_required_parameter")
    return ChatRequest(body=body, route="completions", model=model, stream=stream, headers=headers,
                       request_id=request_id or uuid.uuid4().hex)
