"""Downscale to the token grid: a cheap integer pre-reduction that keeps at least
``gap`` x the target (DCT scaling for JPEG happens at decode, ``Image.reduce``
otherwise), then one good filter to the exact target size."""

from __future__ import annotations

from PIL import Image

FILTERS = {"lanczos": Image.Resampling.LANCZOS, "bicubic": Image.Resampling.BICUBIC,
           "bilinear": Image.Resampling.BILINEAR}


def prescale_size(target: tuple[int, int], gap: float) -> tuple[int, int]:
    """Smallest size a pre-reduction may reach: ``gap`` x the target (aliasing below)."""
    return max(1, int(target[0] * gap)), max(1, int(target[1] * gap))


def downscale(im: Image.Image, target: tuple[int, int], resample: str = "bicubic", gap: float = 2.0) -> Image.Image:
    if im.size == target:
        return im
    tw, th = target
    k = int(min(im.width / (tw * gap), im.height / (th * gap)))
    if k >= 2:
        im = im.reduce(k)
    return im.resize(target, FILTERS.get(resample, Image.Resampling.BICUBIC))
