"""Qwen-VL prompt token accounting: the one set of rules the image stage, the router,
admission and the simulator all use -- visual tokens exactly, text tokens estimated.

Qwen2/2.5/3-VL resize every image with ``smart_resize``: both sides rounded to a
multiple of ``factor`` (patch size x spatial merge: 16x2 = 32 for Qwen3-VL, 14x2 =
28 for Qwen2/2.5-VL), then scaled so the pixel count lies in [min_pixels,
max_pixels]. Each factor x factor cell becomes one token after the merge, and
the prompt gets two more for the vision start/end markers. Python's ``round`` is
round-half-even, which the reference implementation relies on.

Checked against vLLM 0.24 (``usage.prompt_tokens``): 1920x1080 -> 2040,
768x448 -> 336, 4032x3024 -> 11844, 500x300 -> 144 (+2 markers each).

Text is estimated at 4 bytes a token (``estimate_text_tokens``), plus the chat
template's tokens around every message and after the last one (Qwen3-VL's, as vLLM
0.24 counts them: a one-message "hi" prompt is 5 + 7 + 1 = 13). Admission's
context check and affinity's prefix lengths estimate with these; the simulator lays
its prompts out with the same counts, so it reports what they estimate.
"""

from __future__ import annotations

import math
from typing import Any

QWEN3_FACTOR = 32
QWEN3_MIN_PIXELS = 65536
QWEN3_MAX_PIXELS = 16777216
# vision start / end markers around every image's tokens
MARKER_TOKENS = 2


def smart_resize(height: int, width: int, factor: int = QWEN3_FACTOR,
                 min_pixels: int = QWEN3_MIN_PIXELS, max_pixels: int = QWEN3_MAX_PIXELS) -> tuple[int, int]:
    """(height, width) the model's processor resizes an image to."""
    if height <= 0 or width <= 0:
        raise ValueError("image sides must be positive")
    if max(height, width) / min(height, width) > 200:
        raise ValueError("aspect ratio must be smaller than 200")
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def visual_tokens(width: int, height: int, factor: int = QWEN3_FACTOR,
                  min_pixels: int = QWEN3_MIN_PIXELS, max_pixels: int = QWEN3_MAX_PIXELS,
                  markers: bool = False) -> int:
    """Visual tokens of a width x height image (+2 markers when ``markers``)."""
    h, w = smart_resize(height, width, factor, min_pixels, max_pixels)
    return (h // factor) * (w // factor) + (MARKER_TOKENS if markers else 0)


# Qwen3-VL's chat template: "<|im_start|>{role}\n" (3) and "<|im_end|>\n" (2) around every
# message, "<|im_start|>assistant\n<think>\n\n</think>\n\n" (7) after the last one
TEMPLATE_TOKENS_PER_MESSAGE = 5
TEMPLATE_TOKENS_PER_REQUEST = 7


def estimate_text_tokens(text: str | bytes) -> int:
    """Cheap text-token estimate (about 4 bytes a token) for routing and the simulator."""
    n = len(text.encode("utf-8")) if isinstance(text, str) else len(text)
    return (n + 3) // 4


def estimate_prompt_tokens(prompt: Any) -> int:
    """Tokens of a /v1/completions ``prompt``: a string, token ids, or a list of prompts
    (a batch: the sum); anything else counts 0."""
    if isinstance(prompt, (str, bytes)):
        return estimate_text_tokens(prompt)
    if isinstance(prompt, int) and not isinstance(prompt, bool):
        return 1
    if isinstance(prompt, list):
        return sum(estimate_prompt_tokens(p) for p in prompt)
    return 0


def long_side_within(width: int, height: int, max_pixels: int, factor: int = QWEN3_FACTOR,
                     min_pixels: int = QWEN3_MIN_PIXELS) -> int:
    """The largest long side at which ``target_size`` keeps a width x height image within
    ``max_pixels`` (an engine's ``max_pixels``: it would shrink anything larger itself);
    0 when the image already fits or there is no budget."""
    if max_pixels <= 0 or width * height <= max_pixels:
        return 0

    def fits(side: int) -> bool:
        w, h = target_size(width, height, side, factor, min_pixels)
        return w * h <= max_pixels

    long = max(width, height)
    side = int(long * math.sqrt(max_pixels / (width * height)))  # exact but for the grid's rounding
    while side > factor and not fits(side):
        side -= max(1, factor // 4)  # rounding overshot: a little smaller
    while side + factor < long and fits(side + factor):
        side += factor  # rounding left room (the short side rounded down): a cell longer
    return max(side, factor)


def send_cap(width: int, height: int, long_cap: int, max_pixels: int, factor: int = QWEN3_FACTOR,
             min_pixels: int = QWEN3_MIN_PIXELS) -> int:
    """The long side a backend's limits allow a width x height image: its profile's
    ``image_max_long_side`` and the long side that keeps it within ``image_max_pixels``
    (0 = no limit). The image stage rewrites under it; admission counts with it."""
    side = long_side_within(width, height, max_pixels, factor, min_pixels)
    return min(long_cap, side) if long_cap and side else (long_cap or side)


def target_size(width: int, height: int, max_long_side: int, factor: int = QWEN3_FACTOR,
                min_pixels: int = QWEN3_MIN_PIXELS) -> tuple[int, int]:
    """Size the image stage rewrites a width x height image to (width, height).

    Within budget (long side <= ``max_long_side``): unchanged, the image passes
    through. Otherwise scaled to the budget with aspect kept, both sides snapped to
    multiples of ``factor`` (round-half-even, at least one cell, long side never
    above the budget), and grown back if that fell under ``min_pixels`` (never
    beyond the source size): the model would upscale such an image anyway.
    """
    if max(width, height) <= max_long_side:
        return width, height
    cap = max(factor, (max_long_side // factor) * factor)
    scale = max_long_side / max(width, height)
    w = min(cap, max(factor, round(width * scale / factor) * factor))
    h = min(cap, max(factor, round(height * scale / factor) * factor))
    if w * h < min_pixels:
        beta = math.sqrt(min_pixels / (w * h))
        w = min(max(factor, (width // factor) * factor), math.ceil(w * beta / factor) * factor)
        h = min(max(factor, (height // factor) * factor), math.ceil(h * beta / factor) * factor)
    return w, h
