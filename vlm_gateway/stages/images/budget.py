"""The long side an image is sent at: the smallest that keeps its text legible.

Rule (``images.budget: legible``, the default), for content of long side S whose
significant text is ``t`` px tall (``legibility.estimate``: the x-height of Latin
text, the glyph height of dense CJK-like text):

    legible_floor = ceil_grid(S * need / t)      need = legible_text_px (Latin)
                                                      or legible_dense_px (CJK-like)
    long_side     = clamp(legible_floor, floor, ceiling)
    floor   = max_long_side (the fixed rule, 768) for text; without text
              photo_long_side when set (0: max_long_side), at most max_long_side
    ceiling = text_max_long_side, under the backend profile's image_max_long_side
              (max_pixels bounds the area afterwards, in ``target_size``)

``long_side >= S`` (or within ``NEAR_SOURCE`` of it: a downscale by less than 15 %
saves little and smears every one-pixel stroke): the image passes through untouched.
Without text the photo floor applies. ``images.budget: fixed`` and a client's own choice (``detail``, the
``x-vlm-gateway-image-policy`` header) keep the fixed rule at ``max_long_side``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .legibility import Estimate
from .policy import Policy

REASONS = ("legible", "floor", "ceiling", "no_text", "fixed", "client", "source", "pressure")
CLASSES = ("text", "dense_text", "no_text", "unmeasured")
# horizontal-stroke edges per vertical-stroke edge inside lines above which text is
# dense and square (CJK): Latin text and digits measure 0.25-0.45, CJK 0.6-0.75
DENSE_HORIZONTAL = 0.52
# a legible long side this close to the source's is not worth a resample (< 28 % fewer tokens)
NEAR_SOURCE = 0.85


@dataclass(frozen=True, slots=True)
class Budget:
    """The decision for one image (the header, the metric and the playground show it)."""

    cls: str  # text | dense_text | no_text | unmeasured (fixed rule: nothing estimated)
    text_px: float  # estimated text height in source px (0: none / not measured)
    long_side: int  # the long side chosen (>= the source's: sent as it is)
    legible_floor: int  # the smallest long side that keeps the text legible (0: no text)
    reason: str  # one of REASONS

    def header(self, param: str) -> str:
        return (f"{param};class={self.cls};text_px={self.text_px:.1f};long_side={self.long_side};"
                f"legible_floor={self.legible_floor};reason={self.reason}")

    def pack(self) -> list:
        return [self.cls, self.text_px, self.long_side, self.legible_floor, self.reason]

    @classmethod
    def unpack(cls, v) -> "Budget | None":
        if not isinstance(v, list) or len(v) != 5:
            return None
        return cls(str(v[0]), float(v[1]), int(v[2]), int(v[3]), str(v[4]))


def fixed(policy: Policy, source_long: int, reason: str = "fixed") -> Budget:
    return Budget("unmeasured", 0.0, policy.max_long_side, 0, reason)


def ceiling(policy: Policy) -> int:
    return max(policy.max_long_side, policy.text_max_long_side)


def photo_side(policy: Policy) -> int:
    """The long side of an image without text: photo_long_side (0: max_long_side), never above it."""
    p = policy.photo_long_side
    return max(policy.grid_factor, min(policy.max_long_side, p)) if p > 0 else policy.max_long_side


def estimate_side(policy: Policy) -> int:
    """Images above this long side are measured; at or below it they pass through."""
    return photo_side(policy)


def choose(est: Estimate, source_long: int, policy: Policy) -> Budget:
    """The long side for content of long side ``source_long`` with text ``est``."""
    f = policy.grid_factor
    if est.kind != "text" or est.text_px <= 0:
        return Budget("no_text", 0.0, photo_side(policy), 0, "no_text")
    dense = est.horizontal >= DENSE_HORIZONTAL
    need = policy.legible_dense_px if dense else policy.legible_text_px
    cls = "dense_text" if dense else "text"
    legible = max(f, math.ceil(source_long * need / est.text_px / f) * f)
    legible = min(legible, math.ceil(source_long / f) * f)
    top = ceiling(policy)
    if legible >= NEAR_SOURCE * source_long and top >= source_long:
        return Budget(cls, est.text_px, source_long, legible, "source")
    if legible <= policy.max_long_side:
        return Budget(cls, est.text_px, policy.max_long_side, legible, "floor")
    if legible > top:
        return Budget(cls, est.text_px, top, legible, "ceiling")
    return Budget(cls, est.text_px, legible, legible, "legible")
