"""Downscale to the token grid: a cheap integer pre-reduction that keeps at least
``gap`` x the target (DCT scaling for JPEG happens at decode, ``Image.reduce`` box
averaging otherwise), then one good filter to the exact target size (libvips' reduce
where installed, measured 2.6x faster than Pillow's for the same Catmull-Rom / Lanczos-3
/ triangle kernels; Pillow's otherwise)."""

from __future__ import annotations

from PIL import Image

from . import vips

FILTERS = {"lanczos": Image.Resampling.LANCZOS, "bicubic": Image.Resampling.BICUBIC,
           "bilinear": Image.Resampling.BILINEAR}


def prescale_size(target: tuple[int, int], gap: float) -> tuple[int, int]:
    """Smallest size a pre-reduction may reach: ``gap`` x the target (aliasing below)."""
    return max(1, int(target[0] * gap)), max(1, int(target[1] * gap))


def reduce_factor(size: tuple[int, int], target: tuple[int, int], gap: float = 2.0) -> int:
    """Largest integer box reduction of ``size`` that keeps ``gap`` x ``target`` (1 = none)."""
    k = int(min(size[0] / (target[0] * gap), size[1] / (target[1] * gap)))
    return k if k >= 2 else 1


def final_filter(im: Image.Image, target: tuple[int, int], resample: str = "bicubic",
                 box: tuple[int, int, int, int] | None = None) -> Image.Image:
    """``im`` (or its ``box``) resized to exactly ``target``; libvips reads the box in place,
    not cropped into a copy first."""
    if box is not None and box == (0, 0, *im.size):
        box = None
    if box is None and im.size == target:
        return im
    if vips.VIPS and im.mode in vips.BANDS:
        return vips.resize(im, target, resample, box)
    # cropped first: Pillow's resize(box=) would read past the box's edges
    return (im.crop(box) if box else im).resize(target, FILTERS.get(resample, Image.Resampling.BICUBIC))


def downscale(im: Image.Image, target: tuple[int, int], resample: str = "bicubic", gap: float = 2.0,
              box: tuple[int, int, int, int] | None = None,
              reduced: tuple[int, Image.Image] | None = None) -> Image.Image:
    """``im`` (or its ``box``: the content inside trimmed borders) on ``target``. ``reduced``:
    ``(k, im.reduce(k))`` made already (for the border search), taken when ``k`` is the
    reduction wanted here."""
    size = (box[2] - box[0], box[3] - box[1]) if box else im.size
    k = reduce_factor(size, target, gap)
    if k >= 2:
        if box is None and reduced is not None and reduced[0] == k:
            im = reduced[1]
        else:
            im = im.reduce(k, box=box) if box else im.reduce(k)
        box = None
    return final_filter(im, target, resample, box)
