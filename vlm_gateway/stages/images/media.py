"""The media stage for parts other than images: ``video_url``, ``audio_url``,
``input_audio`` and (where ``images.allow_image_embeds``) ``image_embeds``.

Each goes through the same source policy as an image (``source.MediaSources``):
a data: URI is size-checked against its kind's per-part cap and decoded to
identify it; an http(s) URL is fetched by the safe fetcher (its kind's cap, every
chunk counted against the request's total and the process's bytes in flight)
and inlined as a data: URI, so the engine never fetches anything itself; under
``url_mode: reject`` a URL is refused, under ``passthrough`` it is checked here
and forwarded. ``part.content_hash`` is the hash of the bytes sent.

What is sent for a source is decided by the kind's ``MediaRewrite`` in the
stage's ``rewrites`` (``REWRITES`` by default):

    await rewrite(req, part, source) -> Sent
        the request, the part and its resolved ``Source`` (bytes, hash, declared
        content type) in; the ``Sent`` URL and the identity of what it sends out

A plain function is one (``forward``); a rewrite with state is a class whose
``__call__`` has this shape. It is not a ``Stage`` (``core/stage.py``: a stage is
called with the request alone, in the chain): the media stage owns it, closes and
flushes it with itself, and it may subscribe a request for the per-request hooks
(``core.stage.Hooks``). Audio and image embeddings are forwarded as they came; with
``video.enabled`` (the default) ``rewrites["video"]`` is the video rewrite
(stages/video/stage.py ``VideoRewriter``: frame sampling, near-duplicate removal,
downscale, re-encode), else videos are forwarded too.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ... import metrics
from ...config import GatewayConfig
from ...core.stage import Stage
from .decode import ImageError
from .fetch import FetchError
from .forward import MediaRewrite, forward
from .source import MediaSources, Source, as_error

if TYPE_CHECKING:
    from ...core.request import ChatRequest, MediaPart
    from ..video.stage import VideoRewriter

KINDS = ("video", "audio", "embeds")


REWRITES: dict[str, MediaRewrite] = {"video": forward, "audio": forward, "embeds": forward}


class MediaStage(Stage):
    name = "media"

    def __init__(self, sources: MediaSources, allow_embeds: bool, video: "VideoRewriter | None" = None) -> None:
        self.sources = sources
        self.allow_embeds = allow_embeds
        self.rewrites: dict[str, MediaRewrite] = dict(REWRITES)
        # the video rewrite (stages/video/stage.py), None with video.enabled false; the
        # /ui playground runs videos through it
        self.video = video
        if video is not None:
            self.rewrites["video"] = video

    @classmethod
    def from_config(cls, cfg: GatewayConfig, shared) -> "MediaStage":
        video = None
        if cfg.video.enabled:
            from ..video.stage import VideoRewriter
            video = VideoRewriter(cfg.video, cfg.images, cfg.limits.max_video_bytes, cfg.redis_url, cfg.redis_prefix,
                                  cfg.server.workers)
        return cls(shared.sources, cfg.images.allow_image_embeds, video)

    async def close(self) -> None:
        if self.video is not None:
            await self.video.close()

    async def flush(self) -> dict[str, int | None]:
        return await self.video.flush() if self.video is not None else {}

    async def resolve(self, req: "ChatRequest", part: "MediaPart") -> Source:
        try:
            return await self.sources.resolve(req, part)
        except (ImageError, FetchError) as e:
            metrics.MEDIA_PARTS.labels(part.kind, "refused").inc()
            raise as_error(part, e) from None

    async def send(self, req: "ChatRequest", part: "MediaPart", src: Source) -> None:
        sent = await self.rewrites[part.kind](req, part, src)
        if sent.url is not None:
            part.set_url(sent.url)
        part.content_hash = sent.identity
        part.source_bytes = src.size
        metrics.MEDIA_PARTS.labels(part.kind, "inlined" if src.kind == "url" else
                                   "url_passthrough" if src.kind == "url_passthrough" else "forwarded").inc()

    async def __call__(self, req: "ChatRequest"):
        parts = [p for p in req.media if p.kind in KINDS]
        if not parts:
            return None
        # every source first (fetched, counted against the request's totals), then the
        # rewrites: a request over its byte totals is refused before any video is decoded
        sources = await _first_error(self.resolve(req, p) for p in parts)
        await _first_error(self.send(req, p, s) for p, s in zip(parts, sources))
        return None


async def _first_error(coros) -> list:
    """Run concurrently; raise the error of the first failing part (in order)."""
    results = await asyncio.gather(*coros, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results
