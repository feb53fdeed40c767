"""Near-duplicate frames: a cheap perceptual difference on small grey thumbnails.

A sample is *new* when, against the last kept sample's thumbnail (long side
``dedupe_thumb_long_side`` px, area-averaged luma), more than
``dedupe_changed_fraction`` of the thumbnail's pixels moved by more than
``dedupe_pixel_delta`` grey levels. Area averaging folds compression noise and a
blinking caret into sub-threshold changes, while a changed line of text, a dialog or a
scroll moves whole thumbnail pixels. The first sample is always new.

``thumbnail`` works on a PyAV frame (FFmpeg's area scaler to grey, no RGB conversion
of the full frame); ``is_new`` on two uint8 arrays of the same shape.
"""

from __future__ import annotations

import numpy as np


def thumb_size(width: int, height: int, long_side: int) -> tuple[int, int]:
    s = long_side / max(width, height)
    return max(2, round(width * s)), max(2, round(height * s))


def thumbnail(frame, long_side: int) -> np.ndarray:
    w, h = thumb_size(frame.width, frame.height, long_side)
    return frame.reformat(width=w, height=h, format="gray", interpolation="AREA").to_ndarray()


def changed_fraction(a: np.ndarray, b: np.ndarray, delta: int) -> float:
    if a.shape != b.shape:
        return 1.0
    d = np.abs(a.astype(np.int16) - b.astype(np.int16))
    return float(np.count_nonzero(d > delta)) / d.size


def is_new(thumb: np.ndarray, ref: np.ndarray | None, delta: int, fraction: float) -> bool:
    return ref is None or changed_fraction(thumb, ref, delta) > fraction
