"""The video rewrite inside the media stage: its ``rewrites["video"]`` (images/media.py).

For each ``video_url`` part whose bytes the gateway holds (a data: URI, or a URL it
fetched under the media policy):

    key   = source content hash | settings key (every setting that changes the bytes
            or the counts: rates, caps, thresholds, plan, frame budget, engine spec,
            timestamp tokenizer)
    entry = L1.get(key) or rewrite_video(bytes, settings) in the video pool (one at a
            time per key: concurrent requests for the same video share it, "shared")
    sent  = data:video/mp4 of entry.data, identity = content hash of those bytes

The pool is a bounded thread pool of its own (``video.pool_workers``, ``video.max_queue``:
PyAV releases the GIL while FFmpeg works); a full pool answers 503 + Retry-After. Every
``VideoError`` becomes a 400 naming the part (``messages[i].content[j].video_url``) with
its code; without PyAV (a core dependency, so only an install that lost it) the gateway
answers 400 ``video_unavailable`` naming the command that installs it: a status SDKs do not
retry, since retrying cannot help (the log says so at start).

Not rewritten, and said so in the headers: ``video.enabled: false``, the request header
``x-vlm-gateway-video-policy: off`` (both forward the bytes as they came; with the header the
container's header is still checked against every limit and the source's tokens are
counted) and URLs under ``images.url_mode: passthrough`` (the engine fetches; tokens unknown).

Tokens (video_tokens.py): ``before`` is what the source would add to the prompt, as the
engine reads it; ``after`` what the output adds (every output frame is sampled). Both
are recounted for the chosen backend when its profile sets ``video_max_pixels``. The
headers, sums over the request's videos and one line per video::

    x-vlm-gateway-video-tokens: before=11930;after=5140
    x-vlm-gateway-video-1: part=messages[0].content[1].video_url; outcome=rewritten;
        frames=120->30; rate=30->1/2; size=1920x1080->768x448; states=14; plan=groups;
        seconds=5.210
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import TYPE_CHECKING

from ...core import headers as H
from ... import metrics, redis_keys
from ...config import ImagesConfig, VideoConfig
from ...hashing import content_hash
from ...core.errors import BadRequest, GatewayError
from ...core.stage import Hooks
from ...video_tokens import (QWEN3_VL, TimestampCounter, VideoProcessorSpec, qwen_timestamp_tokens,
                             tokenizer_counter, video_tokens)
from ..images import policy as image_policy
from ..images.encode import data_uri
from ..images.forward import Sent, forward
from ..images.pool import BoundedPool, cores
from ..images.spare import Spare
from .budget import frame_budget, legibility_budget
from .errors import VideoError
from .l1 import VideoEntry, VideoL1
from .settings import VideoSettings

if TYPE_CHECKING:
    from ...backends.backend import Backend
    from ...core.request import ChatRequest, MediaPart
    from ..images.source import Source

log = logging.getLogger("vlm_gateway.video")

TOKENS_HEADER = H.VIDEO_TOKENS.name
DETAIL_HEADER = H.VIDEO.nth("")          # + 1-based index of the video in the request
POLICY_HEADER = H.VIDEO_POLICY.name    # off | default
AUTO_DECODE_THREADS = 8   # most FFmpeg threads one video gets from idle cores (video.decode_threads: 0)


@dataclass(slots=True)
class VideoSent:
    """What the stage did with one video part (``MediaPart.video``)."""

    outcome: str                     # rewritten | shared | l1_hit | forwarded | url_passthrough
    entry: VideoEntry | None = None  # None unless rewritten or from L1
    before: int = 0                  # prompt tokens of the source (0 = unknown)
    after: int = 0                   # prompt tokens of what is sent (0 = unknown)
    counted: bool = False


# PyAV is a core dependency (pyproject.toml); the package is installed from its checkout
INSTALL_PYAV = "install it with pip install -e . in the gateway's checkout, or pip install 'av>=14'"


def pyav_available() -> bool:
    try:
        import av  # noqa: F401
    except ImportError:
        return False
    return True


def _frac(x: float) -> Fraction:
    return Fraction(x).limit_denominator(1000)


def _rate_text(r: str | Fraction) -> str:
    return str(Fraction(r))


class VideoRewriter(Hooks):
    """The ``MediaRewrite`` of the kind "video" (``await rewriter(req, part, source) -> Sent``),
    one per gateway process, owned by the media stage (which closes and flushes it). Not a
    ``Stage``: it is called per part, not per request; it subscribes a request with videos
    for ``before_send``."""

    def __init__(self, cfg: VideoConfig, images: ImagesConfig, max_video_bytes: int, redis_url: str,
                 redis_prefix: str = redis_keys.DEFAULT_PREFIX, processes: int = 1) -> None:
        self.cfg = cfg
        self.images = images
        self.max_bytes = max_video_bytes
        workers = cfg.pool_workers or max(1, cores() // 2 // max(1, processes))
        # decode_threads 0: one video's FFmpeg threads from the idle cores (images/spare.py)
        self.pool = BoundedPool(workers, cfg.max_queue, what="video",
                                spare=Spare(AUTO_DECODE_THREADS) if cfg.decode_threads == 0 else None)
        self.l1 = VideoL1(cfg.l1_max_bytes, redis_url, cfg.l1_redis_ttl_s, redis_prefix=redis_prefix)
        self.count: TimestampCounter = qwen_timestamp_tokens
        self.counter_id = "qwen"
        if cfg.tokenizer:
            self.count = tokenizer_counter(cfg.tokenizer)
            with open(cfg.tokenizer, "rb") as f:
                self.counter_id = content_hash(f.read())[:16]
        self.spec = replace(QWEN3_VL, fps=cfg.engine_fps, max_frames=cfg.engine_max_frames,
                            max_pixels=cfg.engine_max_pixels, min_pixels=cfg.engine_min_pixels)
        self._settings: dict[str, tuple[VideoSettings, str]] = {}
        self._inflight: dict[str, asyncio.Future[VideoEntry]] = {}
        self.available = pyav_available()
        if not self.available:
            log.warning("video.enabled is on but PyAV is not installed: video_url parts whose bytes the gateway "
                        "holds are answered with 400 video_unavailable (%s; or set video.enabled: false to "
                        "forward videos untouched)", INSTALL_PYAV)

    async def close(self) -> None:
        await self.l1.close()
        self.pool.close()

    async def flush(self) -> dict[str, int | None]:
        """``POST /admin/cache/flush``: the entries L1 forgot."""
        return {"VideoL1.flush": await self.l1.flush()}

    # -- settings -------------------------------------------------------------------------
    def settings(self, model: str) -> tuple[VideoSettings, str]:
        """(settings for ``model``, their L1 key part); the frame budget is the model's image budget."""
        hit = self._settings.get(model)
        if hit is not None:
            return hit
        c = self.cfg
        long_side = c.max_long_side or int(image_policy.model_settings(self.images, model)["max_long_side"])
        s = VideoSettings(fps=_frac(c.fps), max_frames=c.max_frames, min_fps=_frac(c.min_fps), dedupe=c.dedupe,
                          plan=c.plan, dedupe_pixel_delta=c.dedupe_pixel_delta,
                          dedupe_changed_fraction=c.dedupe_changed_fraction,
                          max_long_side=max(self.spec.factor, long_side), grid_factor=self.spec.factor, crf=c.crf,
                          max_bytes=self.max_bytes, max_duration_s=c.max_duration_s,
                          max_source_frames=c.max_source_frames, max_frame_pixels=c.max_frame_pixels,
                          max_decoded_pixels=c.max_decoded_pixels, max_decode_s=c.max_decode_s,
                          decode_threads=c.decode_threads, engine=self.spec)
        per_state = legibility_budget(self.images, model)
        key = content_hash(f"{s!r}|tok={self.counter_id}|legibility={per_state is not None}".encode())[:32]
        if len(self._settings) > 1024:
            self._settings.clear()
        self._settings[model] = (s, key)
        return s, key

    def spec_for(self, backend: "Backend | None") -> VideoProcessorSpec:
        """The engine spec of a backend: its profile's video_max_pixels replaces the default budget."""
        vpx = (backend.profile or {}).get("video_max_pixels") if backend is not None else None
        if isinstance(vpx, int) and vpx > 0 and vpx != self.spec.max_pixels:
            return replace(self.spec, max_pixels=vpx, min_pixels=min(self.spec.min_pixels, vpx))
        return self.spec

    def _rewrite(self, data: bytes, settings: VideoSettings, model: str) -> VideoEntry:
        from .rewrite import rewrite_video
        budget = frame_budget(settings.max_long_side, settings.grid_factor, legibility_budget(self.images, model))
        r = rewrite_video(data, settings, budget, self.count)
        h = r.source
        return VideoEntry(
            data=r.data, identity=content_hash(r.data), mime=r.mime, src_width=h.width, src_height=h.height,
            src_frames=h.opencv_frames, src_rate=str(h.rate), src_container=h.container, src_codec=h.codec,
            decoded_frames=r.decoded_frames, duration_s=round(r.duration_s, 3), width=r.width, height=r.height,
            frames=r.frames, rate=str(r.plan.rate), states=r.plan.states, plan=r.plan.kind,
            mixed_groups=r.plan.mixed_groups, tokens_before=r.before.total if r.before else 0,
            tokens_after=r.after.total, cpu_s=round(r.cpu_s, 4), wall_s=round(r.wall_s, 4))

    # -- the rewrite --------------------------------------------------------------------------
    async def __call__(self, req: "ChatRequest", part: "MediaPart", src: "Source") -> "Sent":
        if src.kind == "url_passthrough":
            return self._record(req, part, VideoSent("url_passthrough"), await forward(req, part, src))
        if _policy(req) == "off":
            return await self._forwarded(req, part, src)
        settings, skey = self.settings(req.model)
        key = f"{src.hash}|{skey}"
        entry = await self.l1.get(key)
        outcome = "l1_hit"
        if entry is None:
            # one rewrite per key at a time: concurrent requests for the same video wait for it
            job = self._inflight.get(key)
            outcome = "shared" if job is not None else "rewritten"
            if job is None:
                assert src.data is not None
                job = self._inflight[key] = asyncio.ensure_future(self._job(key, src.data, settings, req.model))
                job.add_done_callback(lambda j, k=key: self._done(k, j))
            try:
                entry = await asyncio.shield(job)
            except VideoError as e:
                raise _refusal(part, e) from None
        sent = VideoSent(outcome, entry, entry.tokens_before, entry.tokens_after)
        return self._record(req, part, sent, Sent(data_uri(entry.data, entry.mime), entry.identity))

    async def _forwarded(self, req: "ChatRequest", part: "MediaPart", src: "Source") -> "Sent":
        """The bytes as they came, for a request that turned the rewrite off: still the
        container and codec checks and the limits on size, duration, frames and frame pixels
        (read from the container's header, as the rewrite's first gate does), and the tokens
        the engine will spend on it, counted (so rate limits charge them). Without PyAV only
        the container's magic bytes are checked (``forward`` does that for every video) and
        the count is unknown."""
        tokens = 0
        if src.data is not None and self.available:
            from .rewrite import probe_video, source_tokens
            settings, _ = self.settings(req.model)
            try:
                header = await self.pool.run(probe_video, src.data, settings)
            except VideoError as e:
                raise _refusal(part, e) from None
            counted = source_tokens(header, settings, self.count)
            tokens = counted.total if counted is not None else 0
        return self._record(req, part, VideoSent("forwarded", None, tokens, tokens), await forward(req, part, src))

    async def _job(self, key: str, data: bytes, settings: VideoSettings, model: str) -> VideoEntry:
        if not self.available:
            raise VideoError(f"this gateway cannot decode video: PyAV is not installed ({INSTALL_PYAV}, or set "
                             "video.enabled: false to forward videos untouched)", "video_unavailable")
        entry = await self.pool.run(self._rewrite, data, settings, model)
        await self.l1.put(key, entry)
        metrics.VIDEO_REWRITE_SECONDS.observe(entry.wall_s)
        metrics.VIDEO_REWRITE_CPU.inc(entry.cpu_s)
        metrics.VIDEO_SECONDS.inc(entry.duration_s)
        return entry

    def _done(self, key: str, job: "asyncio.Future[VideoEntry]") -> None:
        if self._inflight.get(key) is job:
            del self._inflight[key]
        if not job.cancelled():
            job.exception()   # retrieved: a failure is raised to every waiter, never logged as lost

    def _record(self, req: "ChatRequest", part: "MediaPart", v: VideoSent, sent: "Sent") -> "Sent":
        part.video = v
        part.tokens_before, part.tokens_after = v.before, v.after
        if v.entry is not None:
            part.width, part.height = v.entry.src_width, v.entry.src_height
        req.subscribe(self)
        self._headers(req)
        return sent

    # -- after routing: counts for the chosen engine, metrics once ------------------------
    async def before_send(self, req: "ChatRequest", backend: "Backend") -> None:
        spec = self.spec_for(backend)
        for part in _videos(req):
            v: VideoSent = part.video
            e = v.entry
            if e is None:
                continue
            if spec is self.spec:
                v.before, v.after = e.tokens_before, e.tokens_after
            else:
                v.before, v.after = recount(e, spec, self.count)
            part.tokens_before, part.tokens_after = v.before, v.after
        self._headers(req)
        for part in _videos(req):
            self._count(req, part.video)

    def _count(self, req: "ChatRequest", v: VideoSent) -> None:
        if v.counted:
            return
        v.counted = True
        metrics.VIDEOS.labels(v.outcome).inc()
        e = v.entry
        if e is None:
            if v.after:  # forwarded as it came: what the engine spends on it, nothing saved
                metrics.VIDEO_TOKENS.labels(req.model, "before").inc(v.before)
                metrics.VIDEO_TOKENS.labels(req.model, "after").inc(v.after)
            return
        if v.outcome == "rewritten":
            metrics.VIDEO_FRAMES.labels("decoded").inc(e.decoded_frames)
        metrics.VIDEO_FRAMES.labels("out").inc(e.frames)
        if v.before:
            metrics.VIDEO_FRAMES.labels("in").inc(engine_frames(e, self.spec))
            metrics.VIDEO_TOKENS.labels(req.model, "before").inc(v.before)
            metrics.VIDEO_TOKENS_SAVED.labels(req.model).inc(max(0, v.before - v.after))
        metrics.VIDEO_TOKENS.labels(req.model, "after").inc(v.after)

    def _headers(self, req: "ChatRequest") -> None:
        vids = _videos(req)
        known_after = [p.video.after for p in vids if p.video.after]
        known_before = [p.video.before for p in vids if p.video.before]
        before = str(sum(known_before)) if len(known_before) == len(vids) else "unknown"
        after = str(sum(known_after)) if len(known_after) == len(vids) else "unknown"
        req.response_headers[TOKENS_HEADER] = f"before={before};after={after}"
        for i, p in enumerate(vids, 1):
            req.response_headers[f"{DETAIL_HEADER}{i}"] = describe(p.param, p.video, self.spec)


def recount(e: VideoEntry, spec: VideoProcessorSpec, count: TimestampCounter) -> tuple[int, int]:
    """(before, after) prompt tokens of an entry for an engine with ``spec``."""
    before = 0
    if e.src_frames > 0 and Fraction(e.src_rate) > 0:
        try:
            before = video_tokens(e.src_frames, float(Fraction(e.src_rate)), e.src_width, e.src_height,
                                  spec, count).total
        except ValueError:
            before = 0
    after = video_tokens(e.frames, float(Fraction(e.rate)), e.width, e.height, spec, count).total
    return before, after


def engine_frames(e: VideoEntry, spec: VideoProcessorSpec) -> int:
    """Frames the engine samples from the source as it came (0 = it could not tell)."""
    from ...video_tokens import sample_indices
    try:
        return len(sample_indices(e.src_frames, float(Fraction(e.src_rate)), spec))
    except ValueError:
        return 0


def describe(param: str, v: VideoSent, spec: VideoProcessorSpec = QWEN3_VL) -> str:
    e = v.entry
    if e is None:
        return f"part={param}; outcome={v.outcome}"
    src_n = engine_frames(e, spec)
    return (f"part={param}; outcome={v.outcome}; frames={src_n}->{e.frames}; "
            f"rate={_rate_text(e.src_rate)}->{_rate_text(e.rate)}; "
            f"size={e.src_width}x{e.src_height}->{e.width}x{e.height}; states={e.states}; plan={e.plan}; "
            f"seconds={e.duration_s:.3f}")


def _refusal(part: "MediaPart", e: VideoError) -> GatewayError:
    metrics.VIDEOS.labels("refused").inc()
    if e.code == "video_unavailable":  # the gateway's install, not the video: a 4xx no SDK retries
        return BadRequest(f"Cannot read the video at {part.param}: {e}", param=part.param, code=e.code)
    return BadRequest(f"Invalid video at {part.param}: {e}", param=part.param, code=e.code)


def _videos(req: "ChatRequest") -> list["MediaPart"]:
    return [p for p in req.media if p.kind == "video" and p.video is not None]


def _policy(req: "ChatRequest") -> str:
    v = (req.headers.get(POLICY_HEADER) or "").strip().lower()
    if v in ("", "default", "on", "auto", "below-floor"):  # below-floor concerns images only
        return "default"
    if v == "off":
        return "off"
    raise BadRequest(f"{POLICY_HEADER} must be off, default or below-floor, got {v[:40]!r}", param=POLICY_HEADER,
                     code="invalid_video_policy")
