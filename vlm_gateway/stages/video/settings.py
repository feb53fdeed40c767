"""VideoSettings: everything the rewrite is allowed and asked to do, as one frozen value.

Limits are checked on what is decoded (not only on headers) and none of them can be
raised by a request: the stage builds this from the gateway's config (per model and
tenant), never from client fields.

Sampling: ``fps`` is the analysis rate (at most the engine's own sampling rate, 2 fps
for Qwen3-VL on vLLM, so that the engine then takes every output frame); ``max_frames``
caps sampled frames (the rate halves while a long video would exceed it);
``min_fps`` is the lowest output rate the dedupe may fall to; ``plan`` picks how kept
states become output frames (plan.py: ``groups`` keeps every state in an engine group of
its own, ``frames`` puts each frame at its exact time and may pair two states).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from ...video_tokens import QWEN3_VL, VideoProcessorSpec


@dataclass(frozen=True)
class VideoSettings:
    # sampling and dedupe
    fps: Fraction = Fraction(2)
    max_frames: int = 128
    min_fps: Fraction = Fraction(1, 5)
    dedupe: bool = True
    plan: str = "groups"                  # "groups" | "frames" (plan.py)
    dedupe_thumb_long_side: int = 128     # grey thumbnail the duplicate test runs on
    dedupe_pixel_delta: int = 12          # a thumbnail pixel "changed" above this (0-255)
    dedupe_changed_fraction: float = 0.0005   # a frame is new above this share of changed pixels
    # per-frame size: long-side budget on the token grid (the image policy's)
    max_long_side: int = 768
    grid_factor: int = 32
    # encoding
    crf: int = 20
    # x264 ultrafast (CAVLC, no B-frames, no deblocking): against veryfast, 1.7-2.8x less CPU
    # to encode and 1.9-3.0x less for the engine's loader (OpenCV or PyAV) to decode, PSNR
    # 0.3-1.4 dB higher at the same CRF, 1.7x the bytes (docs/benchmarks/video.md)
    preset: str = "ultrafast"
    # limits (refusals)
    max_bytes: int = 64 * 1024 * 1024
    max_duration_s: float = 600.0
    max_source_frames: int = 36_000             # decoded frames, any size
    max_frame_pixels: int = 3840 * 2160         # per frame, declared and decoded
    max_decoded_pixels: int = 16_000_000_000    # all decoded frames together
    max_decode_s: float = 60.0                  # wall clock for the whole rewrite
    max_buffer_bytes: int = 384 * 1024 * 1024   # sampled frames kept in memory
    decode_threads: int = 1                     # FFmpeg codec threads per decode; 0: the pool's grant (images/spare.py)
    skip_nonref: bool = True                    # skip unreferenced frames when sampling far below the source rate
    # the engine's video processor (token rule; output must stay within its sampling)
    engine: VideoProcessorSpec = field(default=QWEN3_VL)

    def analysis_fps(self) -> Fraction:
        """Sampling rate: the configured one, never above the engine's (which would then
        subsample our output and break the 1:1 mapping of output frames to timestamps)."""
        return min(Fraction(self.fps), Fraction(self.engine.fps).limit_denominator(1000))
