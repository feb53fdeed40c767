"""The whole video rewrite as one pure, synchronous call (run it in the decode pool).

``rewrite_video(data, settings, budget=None, count=...) -> RewrittenVideo``:

1. probe: container from magic bytes, declared limits (probe.py);
2. decode with hard bounds (decode.py; frames no other frame references are skipped
   when the source runs at 4 or more frames per sample), sampling on the analysis grid
   (sample.py): each sample is stored at the frame budget's ceiling size (RGB) plus a
   grey thumbnail;
3. dedupe (dedupe.py) marks each sample new or a near-duplicate of the last kept one;
4. plan (plan.py) picks the output rate and frames so every distinct state is shown
   near its own time (``groups``: in an engine group of its own; ``frames``: each frame
   at its exact time);
5. per-frame size: ``budget(w, h, None)`` is the ceiling (default: the image policy's
   long-side budget on the token grid); a content-aware budget is asked again with each
   kept frame and the largest answer wins; then the engine's own video resize is
   applied so the engine will not resize again (its pixel budget covers all frames);
6. encode (encode.py) deterministic H.264/MP4 at the output rate.

Token counts come from video_tokens.py: ``before`` for the source as the engine would
read it, ``after`` for the output (every output frame is sampled: rate <= engine fps).
Timings are this thread's CPU seconds (time.thread_time: FFmpeg's own codec threads,
with ``decode_threads`` > 1, are not included) and wall seconds.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ...video_tokens import TimestampCounter, VideoTokens, qwen_timestamp_tokens, video_smart_resize, video_tokens
from ..images.spare import granted
from . import decode, dedupe, encode, probe
from .budget import FrameBudget, frame_budget
from .errors import VideoError
from .plan import Plan, plan_frames, plan_groups
from .sample import GridSampler
from .settings import VideoSettings


def grid_budget(settings: VideoSettings) -> FrameBudget:
    """The image policy's budget: long side <= max_long_side, both sides on the token grid."""
    return frame_budget(settings.max_long_side, settings.grid_factor)


@dataclass(frozen=True)
class RewrittenVideo:
    data: bytes
    mime: str
    digest: str                      # sha256 of data
    source: probe.VideoHeader
    decoded_frames: int
    duration_s: float                # time of the last decoded frame
    sample_rate: Fraction            # analysis rate after any halving
    samples: int
    plan: Plan
    width: int
    height: int
    frame_times: tuple[float, ...]   # per output frame: the source time it shows
    before: VideoTokens | None       # the source, as the engine would read it
    after: VideoTokens               # the output
    cpu_s: float
    wall_s: float

    @property
    def frames(self) -> int:
        return len(self.plan.grid)


def source_tokens(header: probe.VideoHeader, settings: VideoSettings,
                  count: TimestampCounter = qwen_timestamp_tokens) -> VideoTokens | None:
    """Tokens the engine would spend on the source as sent (None where it could not read it)."""
    n, r = header.opencv_frames, float(header.rate)
    if n <= 0 or r <= 0:
        return None
    try:
        return video_tokens(n, r, header.width, header.height, settings.engine, count)
    except ValueError:
        return None


def probe_video(data: bytes, settings: VideoSettings) -> probe.VideoHeader:
    container, _, header = probe.open_video(data, settings)
    container.close()
    return header


def _resize(arr: np.ndarray, w: int, h: int) -> np.ndarray:
    if arr.shape[1] == w and arr.shape[0] == h:
        return arr
    from PIL import Image
    return np.asarray(Image.fromarray(arr).resize((w, h), Image.BICUBIC))


def rewrite_video(data: bytes, settings: VideoSettings, budget: FrameBudget | None = None,
                  count: TimestampCounter = qwen_timestamp_tokens) -> RewrittenVideo:
    c0, w0 = time.thread_time(), time.monotonic()
    budget = budget or grid_budget(settings)
    container, stream, header = probe.open_video(data, settings)
    cw, ch = budget(header.width, header.height, None)
    per_frame = cw * ch * 3
    max_frames = min(settings.max_frames, max(2, settings.max_buffer_bytes // max(1, per_frame)),
                     settings.engine.max_frames)
    f = settings.analysis_fps()
    tl = settings.dedupe_thumb_long_side

    def store(frame, t):
        if frame.width * frame.height > settings.max_frame_pixels:   # decode.py checked; belt and braces
            raise VideoError("frame above the pixel limit", "video_frame_too_large")
        rgb = frame.reformat(width=cw, height=ch, format="rgb24", interpolation="BICUBIC").to_ndarray()
        return rgb, dedupe.thumbnail(frame, tl)

    sampler = GridSampler(f, max_frames, store)
    decoded = 0
    last_t = 0.0
    try:
        # at 4+ source frames per sample, skipping unreferenced frames (B-frames) leaves decoded
        # frames in every sampling interval (x264's longest B run is 3 frames, 100 ms at 30 fps)
        skip = settings.skip_nonref and header.rate and header.rate >= 4 * f
        for t, frame in decode.frames(container, stream, header, settings, started=w0,
                                      threads=settings.decode_threads or granted(), skip_nonref=bool(skip)):
            if frame.width != header.width or frame.height != header.height:
                raise VideoError(f"the video changes frame size mid-stream ({header.width}x{header.height} -> "
                                 f"{frame.width}x{frame.height})", "video_corrupt")
            sampler.offer(t, frame)
            decoded += 1
            last_t = t
        items = sampler.finish()
    finally:
        container.close()
    rate = sampler.rate
    kept, ref = [], None
    for _, thumb in items:
        new = not settings.dedupe or dedupe.is_new(thumb, ref, settings.dedupe_pixel_delta,
                                                   settings.dedupe_changed_fraction)
        kept.append(new)
        if new:
            ref = thumb
    if not settings.dedupe:
        p = plan_frames(kept, rate, rate)
    elif settings.plan == "frames":
        p = plan_frames(kept, rate, settings.min_fps)
    else:
        p = plan_groups(kept, rate, settings.min_fps)
    # per-frame size: the largest a kept frame needs, within the ceiling
    w, h = cw, ch
    if budget is not None:
        need = [budget(header.width, header.height, items[k][0]) for k in sorted(set(p.sources))]
        w, h = max(need, key=lambda s: s[0] * s[1])
        w, h = min(w, cw), min(h, ch)
    n = len(p.grid)
    spec = settings.engine
    for _ in range(4):   # the engine's volume budget over all frames: resize now, not there
        nh, nw = video_smart_resize(n, h, w, spec)
        if (nw, nh) == (w, h):
            break
        w, h = nw, nh
    frames = [_resize(items[k][0], w, h) for k in p.sources]
    data_out = encode.encode_mp4(frames, p.rate, settings.crf, settings.preset)
    after = video_tokens(n, float(p.rate), w, h, spec, count)
    if after.frames != n:   # the plan guarantees rate <= engine fps; a mismatch is a bug, not input
        raise AssertionError(f"engine would sample {after.frames} of {n} output frames")
    return RewrittenVideo(
        data=data_out, mime=encode.MIME, digest=hashlib.sha256(data_out).hexdigest(), source=header,
        decoded_frames=decoded, duration_s=last_t, sample_rate=rate, samples=len(items), plan=p,
        width=w, height=h, frame_times=tuple(float(g / rate) for g in p.grid),
        before=source_tokens(header, settings, count), after=after,
        cpu_s=time.thread_time() - c0, wall_s=time.monotonic() - w0)
