"""Per-frame size of the video rewrite: the image policy's budget now, and the named
place where a content-aware (legibility) decision per distinct screen state plugs in.

``frame_budget(long_side, factor, per_state=None) -> FrameBudget`` where a FrameBudget
is called as ``budget(w, h, frame)`` with the source size and:

- ``frame=None``: the ceiling, the image rule on the token grid (long side <=
  ``long_side``, both sides multiples of ``factor``; vision_tokens.target_size without
  its image-only regrowth to 65536 px);
- ``frame`` = RGB pixels (uint8, H x W x 3) of one distinct screen state at the ceiling
  size: ``per_state(frame, (w, h), ceiling)`` when given (a size on the grid, clamped to
  the ceiling), else the ceiling. The rewrite asks once per distinct state and sends
  every frame at the largest answer (the engine takes one size per video).

``legibility_budget(images_cfg, model)`` is the hook for the legibility-aware image
budget: it returns None (every state gets the ceiling) until that budget offers a
per-image decision; it is then to return a ``StateBudget`` that measures the state's
significant text and answers the smallest grid size that keeps it legible. Calling it
per distinct state (not per sampled frame) keeps its cost to a few calls a video.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from ...vision_tokens import target_size

# (source width, source height, kept frame at the ceiling size or None) -> (width, height)
FrameBudget = Callable[[int, int, Optional[np.ndarray]], tuple[int, int]]
# (frame pixels at the ceiling size, source (w, h), ceiling (w, h)) -> (w, h) on the grid
StateBudget = Callable[[np.ndarray, tuple[int, int], tuple[int, int]], tuple[int, int]]


def frame_budget(long_side: int, factor: int, per_state: StateBudget | None = None) -> FrameBudget:
    def ceiling(w: int, h: int) -> tuple[int, int]:
        # min_pixels 0: the image processor's regrowth to 65536 px does not apply to video;
        # the video processor's minimum covers the whole volume (4096 px) and never binds here
        tw, th = target_size(w, h, long_side, factor, min_pixels=0)
        # within budget target_size keeps the source size; the engine would round it to the grid
        return max(factor, round(tw / factor) * factor), max(factor, round(th / factor) * factor)

    def budget(w: int, h: int, frame: Optional[np.ndarray] = None) -> tuple[int, int]:
        cw, ch = ceiling(w, h)
        if frame is None or per_state is None:
            return cw, ch
        sw, sh = per_state(frame, (w, h), (cw, ch))
        return (min(cw, max(factor, sw // factor * factor)), min(ch, max(factor, sh // factor * factor)))

    return budget


def legibility_budget(images_cfg: Any, model: str) -> StateBudget | None:
    """The legibility-aware decision for one distinct screen state (see the module
    docstring); None: every state gets the image policy's ceiling."""
    return None
