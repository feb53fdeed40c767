"""Qwen3-VL video token accounting on vLLM 0.24: how many prompt tokens one video part costs.

The rule (sources and line numbers in docs/VIDEO.md):

1. **Frames vLLM samples** (vLLM ``Qwen3VLVideoBackend``, opencv loader): from the
   container's frame count ``N`` and rate ``r`` as OpenCV reports them (``nb_frames``,
   else ``floor(duration x r + 0.5)``; ``r`` = FFmpeg's guessed frame rate)::

       n = min(max(int(N / r x fps), min_frames), max_frames, N)      fps 2, min 4, max 768
       indices = round(linspace(0, N - 1, n))

2. **Size of every frame** (transformers ``Qwen3VLVideoProcessor``, ``smart_resize`` for
   video): both sides rounded to the 32-px grid, then scaled so that the *volume*
   ``t_bar x h x w`` (``t_bar = round(n / 2) x 2``) lies within [min_pixels, max_pixels]
   of the video processor (4096 and 25165824 for Qwen3-VL-2B: one budget shared by all
   frames, so long videos get small frames).

3. **Tokens**: frames are merged in pairs (temporal patch 2; an odd count repeats the last
   frame), ``G = ceil(n / 2)`` groups of ``(h / 32) x (w / 32)`` tokens. vLLM replaces the
   template's ``<|vision_start|><|video_pad|><|vision_end|>`` with, per group,
   ``tok("<{t:.1f} seconds>") + <|vision_start|> + tokens + <|vision_end|>``, where ``t``
   is the mean of the group's two frame times ``index / r``. So a video adds::

       G x (tokens_per_group + 2) + sum over groups of len(tok("<t seconds>"))

   and a request's ``usage.prompt_tokens`` = its text tokens + that.

The timestamp text's length depends on the served tokenizer: ``qwen_timestamp_tokens`` is
Qwen2's byte-level BPE rule (digits split one per token: ``4 + digits``); pass a counter
built from the served ``tokenizer.json`` (``tokenizer_counter``) to be exact for any
other.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

TimestampCounter = Callable[[str], int]


@dataclass(frozen=True)
class VideoProcessorSpec:
    """What the engine's video path is configured with (Qwen3-VL-2B on vLLM 0.24 by default)."""

    fps: float = 2.0                 # vLLM loader / HF processor sampling rate
    min_frames: int = 4
    max_frames: int = 768
    temporal_patch: int = 2
    factor: int = 32                 # patch 16 x spatial merge 2
    min_pixels: int = 4096           # video_preprocessor_config.json size.shortest_edge (volume)
    max_pixels: int = 25165824       # size.longest_edge: 768 x 32 x 32 x 32 (volume)
    cap_pixels_per_frame: bool = False   # transformers >= 5.22 default (qwen-vl-utils' per-frame cap)
    max_video_tokens: int = 768      # per-frame ceiling used by that cap


QWEN3_VL = VideoProcessorSpec()


@dataclass(frozen=True)
class VideoTokens:
    """Token cost of one video as the engine will see it."""

    frames: int                      # frames sampled by the engine
    groups: int                      # temporal groups (ceil(frames / 2))
    width: int                       # per-frame size after the processor's resize
    height: int
    tokens_per_group: int
    timestamps: tuple[float, ...]    # per group, seconds (before formatting)
    timestamp_tokens: int            # all "<t seconds>" texts together
    total: int                       # everything the video adds to the prompt

    @property
    def visual(self) -> int:
        """Video-pad tokens only (what goes through the vision encoder)."""
        return self.groups * self.tokens_per_group


def qwen_timestamp_tokens(text: str) -> int:
    """Tokens of ``"<12.5 seconds>"`` under Qwen2's tokenizer: its pre-tokenizer splits
    every digit into its own piece (``\\p{N}``), ``<``, ``.``, ``>`` and `` seconds`` are
    single vocabulary entries: 4 + digits."""
    return 4 + sum(ch.isdigit() for ch in text)


@functools.lru_cache(maxsize=8)
def tokenizer_counter(path: str) -> TimestampCounter:
    """A counter that encodes with a ``tokenizer.json`` (no special tokens), as vLLM does."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(path)

    @functools.lru_cache(maxsize=4096)
    def count(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False).ids)

    return count


def opencv_frame_count(nb_frames: int, duration_s: float, rate: float) -> int:
    """Frame count OpenCV's FFmpeg backend reports (``CAP_PROP_FRAME_COUNT``)."""
    if nb_frames:
        return int(nb_frames)
    return int(math.floor(duration_s * rate + 0.5))


def sample_indices(total_frames: int, source_fps: float, spec: VideoProcessorSpec = QWEN3_VL) -> list[int]:
    """Frame indices vLLM's Qwen3-VL loader decodes (``np.linspace(...).round()``)."""
    if total_frames <= 0 or source_fps <= 0:
        raise ValueError("the engine needs a positive frame count and frame rate")
    n = int(total_frames / source_fps * spec.fps)
    n = min(max(n, spec.min_frames), spec.max_frames, total_frames)
    if n == 1:
        return [0]
    step = (total_frames - 1) / (n - 1)
    # numpy's linspace computes start + i * step; .round() is round-half-even like Python's
    return [int(round(i * step)) if i < n - 1 else total_frames - 1 for i in range(n)]


def group_timestamps(indices: list[int], source_fps: float, temporal_patch: int = 2) -> list[float]:
    """Seconds printed for each temporal group: the mean time of its frames."""
    idx = list(indices)
    if len(idx) % temporal_patch:
        idx += [idx[-1]] * (temporal_patch - len(idx) % temporal_patch)
    times = [i / source_fps for i in idx]
    return [(times[i] + times[i + temporal_patch - 1]) / 2 for i in range(0, len(times), temporal_patch)]


def video_smart_resize(num_frames: int, height: int, width: int, spec: VideoProcessorSpec = QWEN3_VL) -> tuple[int, int]:
    """(height, width) every frame is resized to (transformers' video ``smart_resize``)."""
    factor, tf = spec.factor, spec.temporal_patch
    if num_frames < tf:
        raise ValueError(f"a video needs at least {tf} frames, got {num_frames}")
    if height <= 0 or width <= 0:
        raise ValueError("frame sides must be positive")
    max_pixels = spec.max_pixels
    if spec.cap_pixels_per_frame:
        frame_cap = spec.max_video_tokens * factor * factor
        per_frame = max(min(frame_cap, spec.max_pixels // num_frames), int(spec.min_pixels * 1.05))
        max_pixels = per_frame * num_frames
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise ValueError("aspect ratio must be smaller than 200")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = round(num_frames / tf) * tf
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt((num_frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < spec.min_pixels:
        beta = math.sqrt(spec.min_pixels / (num_frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def timestamp_text(t: float) -> str:
    return f"<{t:.1f} seconds>"


def tokens_for_indices(indices: list[int], source_fps: float, width: int, height: int,
                       spec: VideoProcessorSpec = QWEN3_VL,
                       count: TimestampCounter = qwen_timestamp_tokens) -> VideoTokens:
    """Cost of a video whose frames ``indices`` (at container rate ``source_fps``) reach the processor."""
    n = len(indices)
    h, w = video_smart_resize(n, height, width, spec)
    groups = -(-n // spec.temporal_patch)
    per_group = (h // spec.factor) * (w // spec.factor)
    stamps = group_timestamps(indices, source_fps, spec.temporal_patch)
    ts_tokens = sum(count(timestamp_text(t)) for t in stamps)
    return VideoTokens(frames=n, groups=groups, width=w, height=h, tokens_per_group=per_group,
                       timestamps=tuple(stamps), timestamp_tokens=ts_tokens,
                       total=groups * (per_group + 2) + ts_tokens)


def video_tokens(total_frames: int, source_fps: float, width: int, height: int,
                 spec: VideoProcessorSpec = QWEN3_VL,
                 count: TimestampCounter = qwen_timestamp_tokens) -> VideoTokens:
    """Cost of a container of ``total_frames`` at ``source_fps`` with ``width`` x ``height`` frames,
    as OpenCV reports them, when every sampled frame decodes."""
    return tokens_for_indices(sample_indices(total_frames, source_fps, spec), source_fps,
                              width, height, spec, count)
