"""The budget level (``backends/slo.py``) applied to one image: the long side it is sent at.

    level 0                      the image's own long side (``base``)
    photo / none (no text)       max(min(base, photo_floor), base x photo_scales[level-1])
    text                         max(min(base, floor), base x text_scales[level-1])
    unknown (no floor known)     base: its text, if any, is kept legible
    opted in (below_floor)       text and unknown are scaled like text, down to the photo floor

A level beyond the configured ones is the deepest one. Never above ``base``. Images without
text give up pixels first because ``text_scales`` stay at 1.0 for the first levels
(defaults in config.SloConfig); text never goes below its legibility floor unless the
client (``detail: low``, ``x-vlm-gateway-image-policy: below-floor``) or the tenant
(``images_below_floor``) opted in.
"""

from __future__ import annotations

from collections.abc import Sequence

NO_TEXT = frozenset({"photo", "none"})


def long_side(base: int, floor: int, cls: str, level: int, photo_scales: Sequence[float],
              text_scales: Sequence[float], photo_floor: int, below_floor: bool = False) -> int:
    """The long side (px) to send an image at under budget ``level``."""
    if level <= 0 or base <= 0 or not photo_scales:
        return base
    i = min(level, len(photo_scales)) - 1
    if cls in NO_TEXT:
        return max(min(base, photo_floor), min(base, round(base * photo_scales[i])))
    if cls != "text" and not below_floor:
        return base  # unknown content: nothing says how small its text may get
    low = min(base, photo_floor) if below_floor else min(base, max(0, floor))
    return max(low, min(base, round(base * text_scales[min(i, len(text_scales) - 1)])))
