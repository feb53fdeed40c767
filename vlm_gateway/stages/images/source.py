"""Resolve a media part to its source under one policy for every kind (image,
video, audio, image embeddings):

- ``data:`` URI (or ``input_audio`` / ``image_embeds`` payload): size-checked
  against the per-part cap of its kind before decoding, decoded, counted and held
  (``inflight``), identified by the hash of its bytes;
- ``http(s)`` URL: ``images.url_mode`` decides. ``reject``: 400; ``passthrough``:
  scheme, domain lists and address guard checked here, then the engine fetches;
  ``fetch``: fetched by the one safe ``Fetcher`` with the per-part cap of its kind,
  every chunk counted and held, identified by the hash of the bytes received;
- anything else: 400.

The identity of a part is always the hash of the bytes that are used
(``vlm_gateway.hashing``). ``UrlMemo`` remembers only a URL's strong ETag with
the hash of the body it came with: a repeat asks the origin (If-None-Match) and
uses the remembered identity only on 304; it is cleared by the admin cache flush.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, TypeVar

import orjson

from ... import data_uri
from ...hashing import content_hash
from ...lru import LRU
from ...core.errors import BadRequest
from .decode import Header, ImageError
from .fetch import Fetched, Fetcher, FetchError, FetchPolicy, check_address
from .inflight import MediaBudget
from .pool import BoundedPool, cores
from .spare import Spare

if TYPE_CHECKING:
    from ...config import ImagesConfig, LimitsConfig
    from ...core.request import ChatRequest, MediaPart

__all__ = ["content_hash", "decode_data_uri", "Source", "UrlMemo", "MediaSources"]

_SMALL = 256 * 1024  # decode/hash bigger payloads in the pool
ACCEPT = {"image": "image/*", "video": "video/*", "audio": "audio/*"}


class MediaError(ImageError):
    """A media part that cannot be used; ``code`` names why (400 naming the part)."""


def decode_data_uri(url: str) -> bytes:
    """Bytes of a ``data:`` URI (``data_uri.decode``), errors as ``ImageError``."""
    try:
        return data_uri.decode(url)
    except data_uri.DataUriError as e:
        raise ImageError(str(e), e.code) from None


def decode_base64(payload: str) -> bytes:
    try:
        return data_uri.decode_base64(payload)
    except data_uri.DataUriError as e:
        raise ImageError(str(e), e.code) from None


payload_bytes = data_uri.payload_bytes
T = TypeVar("T")


def _decoded_and(url: str, then: Callable[[bytes], T]) -> tuple[bytes, T]:
    data = decode_data_uri(url)
    return data, then(data)



def inline_size(part: "MediaPart") -> int:
    """Bytes a part carries inline (data: URI, input_audio, image_embeds), from lengths."""
    if part.ptype == "input_audio":
        return len(part.part["input_audio"]["data"]) * 3 // 4
    if part.ptype == "image_embeds":
        v = part.part["image_embeds"]
        return sum(len(x) for x in (v.values() if isinstance(v, dict) else [v])) * 3 // 4
    url = part.url
    return payload_bytes(url) if url[:5].lower() == "data:" else 0


@dataclass(slots=True)
class Source:
    kind: str  # "data" | "url" | "url_passthrough" | "inline"
    url: str
    hash: str
    header: Header | None
    size: int
    data: bytes | None = None
    # content type the origin declared for a fetched body ("" otherwise)
    content_type: str = ""


class UrlMemo:
    """URL -> (strong ETag, content hash, header, size) for ``ttl_s``; used only to
    revalidate with the origin, never as an identity on its own."""

    def __init__(self, ttl_s: float, max_entries: int = 10_000) -> None:
        self.ttl_s = ttl_s
        self._d: LRU[str, tuple[str, str, Header | None, int]] = LRU(max_entries, ttl_s=ttl_s)

    def __len__(self) -> int:
        return len(self._d)

    def get(self, url: str) -> tuple[str, str, Header | None, int] | None:
        return self._d.get(url)

    def put(self, url: str, etag: str, h: str, header: Header | None, size: int) -> None:
        if self.ttl_s <= 0:
            return
        if not etag:
            self._d.pop(url)
            return
        self._d.put(url, (etag, h, header, size))

    def forget(self, url: str) -> None:
        self._d.pop(url)

    def flush(self) -> int:
        return self._d.clear()


class MediaSources:
    """One per process: the fetcher, pool, memo and byte budget every media stage uses."""

    def __init__(self, cfg: "ImagesConfig", lim: "LimitsConfig", budget: MediaBudget, processes: int = 1) -> None:
        self.cfg = cfg
        self.fetcher = Fetcher(FetchPolicy(cfg.fetch_timeout_s, cfg.max_fetch_bytes, cfg.max_redirects,
                                           cfg.allow_private_networks, list(cfg.allow_networks),
                                           list(cfg.allow_domains), list(cfg.deny_domains)))
        # the machine's cores shared by the worker processes: threads beyond them only slow
        # every job down together, where a queue shows the overload (and its wait is bounded)
        workers = cfg.pool_workers or max(1, cores() // max(1, processes))
        self.pool = BoundedPool(workers, cfg.max_queue, max_wait_s=cfg.max_queue_wait_ms / 1000,
                                spare=Spare(cfg.max_threads_per_image) if cfg.max_threads_per_image > 1 else None)
        self.memo = UrlMemo(cfg.url_cache_ttl_s)
        self.budget = budget
        # per-part caps: fetched images keep images.max_fetch_bytes; data: images are
        # bounded by the request's total
        self.fetch_cap = {"image": cfg.max_fetch_bytes, "video": lim.max_video_bytes, "audio": lim.max_audio_bytes}
        self.part_cap = {"video": (lim.max_video_bytes, "limits.max_video_bytes"),
                         "audio": (lim.max_audio_bytes, "limits.max_audio_bytes")}

    async def close(self) -> None:
        await self.fetcher.close()
        self.pool.close()

    def flush(self) -> int:
        """Admin cache flush: forget every remembered URL."""
        return self.memo.flush()

    # -- pieces ------------------------------------------------------------------------
    def _check_part_cap(self, part: "MediaPart", n: int) -> None:
        cap, key = self.part_cap.get(part.kind, (0, ""))
        if cap and n > cap:
            raise MediaError(f"the {part.kind} is {n} bytes, above the limit {key} ({cap})", f"{part.kind}_too_large")

    async def decode(self, req: "ChatRequest", part: "MediaPart", payload: str, b64: bool = False) -> bytes:
        """Decode a data: URI (or a bare base64 payload) after checking its size; the
        decoded bytes are held for the request."""
        est = len(payload) * 3 // 4 if b64 else payload_bytes(payload)
        self._check_part_cap(part, est)
        self.budget.hold(req, part, est)
        fn = decode_base64 if b64 else decode_data_uri
        return fn(payload) if len(payload) <= _SMALL else await self.pool.run(fn, payload)

    async def decode_and(self, req: "ChatRequest", part: "MediaPart", url: str,
                         then: Callable[[bytes], T]) -> tuple[bytes, T]:
        """``decode`` of a data: URI, and ``then(bytes)`` in the same pool job (one queue
        wait for a large payload, not two: the image stage hashes and probes there)."""
        est = payload_bytes(url)
        self._check_part_cap(part, est)
        self.budget.hold(req, part, est)
        if len(url) <= _SMALL:
            return _decoded_and(url, then)
        return await self.pool.run(_decoded_and, url, then)

    async def hash(self, data: bytes) -> str:
        return content_hash(data) if len(data) <= _SMALL else await self.pool.run(content_hash, data)

    def url_mode(self, part: "MediaPart", url: str) -> str:
        """"data" | "fetch" | "passthrough"; refuses what the policy refuses."""
        low = url[:8].lower()
        if low.startswith("data:"):
            return "data"
        if not low.startswith(("http://", "https://")):
            raise MediaError(f"{part.ptype} must be a data: URI or an http(s) URL", f"invalid_{part.kind}_url")
        if self.cfg.url_mode == "reject":
            raise MediaError(f"this gateway accepts {part.kind}s only as data: URIs (images.url_mode: reject)",
                             f"{part.kind}_url_not_allowed")
        return self.cfg.url_mode

    async def fetch(self, req: "ChatRequest", part: "MediaPart", url: str, etag: str = "") -> Fetched:
        return await self.fetcher.get(url, max_bytes=self.fetch_cap.get(part.kind, self.cfg.max_fetch_bytes),
                                      what=part.kind, accept=ACCEPT.get(part.kind, "*/*"),
                                      on_chunk=self.budget.fetched(req, part), etag=etag)

    # -- whole sources (kinds without a decoder here: video, audio, embeddings) ----------
    async def resolve(self, req: "ChatRequest", part: "MediaPart") -> Source:
        """The source of a part whose bytes are forwarded as they are (no probe)."""
        if part.ptype == "input_audio":
            payload = part.part["input_audio"]["data"]
            data = await self.decode(req, part, payload, b64=True)
            return Source("inline", "", await self.hash(data), None, len(data))
        if part.ptype == "image_embeds":
            raw = orjson.dumps(part.part["image_embeds"], option=orjson.OPT_SORT_KEYS)
            self.budget.hold(req, part, len(raw))
            return Source("inline", "", await self.hash(raw), None, inline_size(part))
        url = part.url
        mode = self.url_mode(part, url)
        if mode == "data":
            data = await self.decode(req, part, url)
            return Source("data", url, await self.hash(data), None, len(data), data)
        if mode == "passthrough":
            await check_address(url, self.fetcher.policy, part.kind)
            return Source("url_passthrough", url, "url:" + content_hash(url.encode()), None, 0)
        got = await self.fetch(req, part, url)
        assert got.data is not None
        return Source("url", url, await self.hash(got.data), None, len(got.data), got.data, got.content_type)


def as_error(part: "MediaPart", e: ImageError | FetchError) -> BadRequest:
    """The 400 for a part that cannot be used, naming it; codes name its kind."""
    code = e.code if part.kind == "image" else e.code.replace("image", part.kind)
    return BadRequest(f"Invalid {part.kind} at {part.param}: {e}", param=part.param, code=code)
