"""A cheap estimate of how small the significant text in an image is (or that it has none).

Contract: ``estimate(im, scale)`` -> ``Estimate`` (kind, text height in source pixels,
stroke measures), on a decoded image that may be reduced (``scale`` = source px per
decoded px: the size is converted back). Cost: grayscale of every second 192 px strip
(a quarter of the pixels after the column subsample), integer row profiles; about 1.5x
one full-frame grayscale conversion (docs/benchmarks/quality.md).

The rule. Text is rows of dense horizontal contrast (vertical strokes) separated by
quiet rows; texture is contrast without that rhythm.
1. Edge map: |g[y, x+2] - g[y, x]| >= EDGE on every second column of every second
   strip (both polarities: dark on light and light on dark alike).
2. Long vertical rules (table grid lines, chart axes, bar sides) are taken out: a column
   edged in >= 90 % of a 32-row band is a rule, not a glyph. Horizontal rules give no
   horizontal contrast and never count.
3. Per vertical strip (``STRIP`` px), a row profile (edges per row). A row is active at
   >= max(2, 30 % of the strip's busy-row level), so the faint ascender/descender rows
   drop out and tight lines separate: a run of active rows is about the x-height of
   Latin text, the full glyph of CJK.
4. A run is a text line when it is 3-120 px tall, quiet above and below and dense
   enough; a strip is text when its lines hold most of its active rows (texture: long
   or ragged runs) and there are >= 2 of them.
5. The text size is a low quantile (25th) of the line heights over all text strips, the
   small text that must stay legible, not the headline. Inside the lines, horizontal
   strokes per vertical stroke (``horizontal``) tell dense square CJK glyphs (0.6-0.75)
   from Latin text and digits (0.25-0.45), so the budget can ask them for more pixels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image

EDGE = 48  # gray-level step that counts as a stroke edge (noise and photo texture stay below)
STRIP = 192  # strip width in decoded px (after the column subsample: 96 samples)
RULE_BAND = 32
MIN_LINE, MAX_LINE = 3, 120
MIN_LINES = 2
FLOOR = 4  # edges per strip row below which a row is quiet (a stray vertical edge or two)


@dataclass(frozen=True, slots=True)
class Estimate:
    kind: str  # "text" | "none"
    text_px: float  # height of the small significant text lines, source px (0: none)
    density: float  # edges per sampled px within text lines (CJK: many strokes per glyph)
    horizontal: float  # horizontal-stroke edges per vertical-stroke edge inside lines (CJK ~ high)
    lines: int  # text lines found
    coverage: float  # share of strips that hold text


NONE = Estimate("none", 0.0, 0.0, 0.0, 0, 0.0)


def strips(im: Image.Image, box: tuple[int, int, int, int] | None = None) -> np.ndarray:
    """Grayscale samples of every second ``STRIP``-wide vertical strip, every second
    column: h x strips x STRIP/2 (a quarter of the pixels, converted by Pillow in C);
    ``box``: only this part of ``im`` (the content inside trimmed borders)."""
    x0, y0, x1, y1 = box or (0, 0, *im.size)
    w = x1 - x0
    sw = min(STRIP, w)
    xs = range(0, max(1, w - sw + 1), 2 * STRIP) if w >= 2 * STRIP else (0,)
    cols = [np.asarray(im.crop((x0 + x, y0, x0 + x + sw, y1)).convert("L"))[:, ::2] for x in xs]
    return np.stack(cols, axis=1)


def estimate(im: Image.Image | np.ndarray, scale: float = 1.0,
             box: tuple[int, int, int, int] | None = None) -> Estimate:
    """``im``: a decoded image (``box``: the part of it to measure), or ``strips(im)``;
    ``scale``: source px per decoded px."""
    s = strips(im, box) if isinstance(im, Image.Image) else im
    h, ns, sw = s.shape
    if h < 16 or sw < 8:
        return NONE
    v = s.astype(np.int16)
    e = np.abs(v[..., 1:] - v[..., :-1]) >= EDGE  # h x ns x (sw - 1)
    nb = h // RULE_BAND
    if nb:
        band = e[:nb * RULE_BAND].reshape(nb, RULE_BAND, ns, -1)
        rules = band.sum(axis=1, dtype=np.int16) >= int(RULE_BAND * 0.9)
        if rules.any():
            band &= ~rules[:, None]
    prof = e.sum(axis=2, dtype=np.int32).T  # ns x h
    # horizontal strokes: vertical contrast, per row (CJK glyphs are full of them)
    ey = (np.abs(v[1:] - v[:-1]) >= EDGE).sum(axis=2, dtype=np.int32).T  # ns x (h - 1)
    heights: list[np.ndarray] = []
    dens: list[np.ndarray] = []
    horiz: list[np.ndarray] = []
    text_strips = 0
    for p, py in zip(prof, ey):
        busy = p[p >= FLOOR]
        if busy.size < 2 * MIN_LINE:
            continue
        level = float(np.percentile(busy, 75))
        if level < 8:
            continue
        act = p >= max(FLOOR, 0.3 * level)
        d = np.diff(act.astype(np.int8), prepend=0, append=0)
        starts = np.flatnonzero(d == 1)
        ends = np.flatnonzero(d == -1)
        runs = ends - starts
        ok = (runs >= MIN_LINE) & (runs <= MAX_LINE)
        if ok.sum() < MIN_LINES or runs[ok].sum() < 0.6 * runs.sum():
            continue
        a0, a1, good = starts[ok], ends[ok], runs[ok]
        cp = np.concatenate(([0], np.cumsum(p)))
        cy = np.concatenate(([0, 0], np.cumsum(py)))
        # a line's mean density must look like glyphs, not a sparse diagonal or speckle
        ld = (cp[a1] - cp[a0]) / good / sw
        keep = ld >= 0.04
        if keep.sum() < MIN_LINES:
            continue
        text_strips += 1
        heights.append(good[keep])
        dens.append(ld[keep])
        # inner rows only: the line's top and bottom edges are vertical contrast of any text
        inner_y = cy[np.maximum(a1[keep] - 1, a0[keep] + 1)] - cy[a0[keep] + 1]
        horiz.append(inner_y / np.maximum(cp[a1[keep]] - cp[a0[keep]], 1))
    if not heights:
        return NONE
    hs = np.concatenate(heights).astype(np.float64)
    px = float(np.percentile(hs, 25)) * scale
    return Estimate("text", px, float(np.median(np.concatenate(dens))), float(np.median(np.concatenate(horiz))),
                    hs.size, text_strips / ns)
