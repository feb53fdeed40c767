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


def final_filter(im: Image.Image, target: tuple[int, int], resample: str = "bicubic") -> Image.Image:
    if im.size == target:
        return im
    if vips.VIPS and im.mode in vips.BANDS:
        return vips.resize(im, target, resample)
    return im.resize(target, FILTERS.get(resample, Image.Resampling.BICUBIC))


def downscale(im: Image.Image, target: tuple[int, int], resample: str = "bicubic", gap: float = 2.0) -> Image.Image:
    if im.size == target:
        return im
    k = reduce_factor(im.size, target, gap)
    if k >= 2:
        im = im.reduce(k)
    return final_filter(im, target, resample)
