"""Deterministic re-encode: the same pixels and settings always give the same
bytes (no timestamps, no EXIF, fixed encoder options), so the engines' prefix
and multimodal caches hit on a repeated image.

Photographic content goes out as JPEG; flat-colour content (screenshots, charts,
few distinct colours) as PNG when PNG is not much larger than JPEG: text edges
survive intact, at a measured size cost (docs/benchmarks/images.md).
"""

from __future__ import annotations

import io

import pybase64
from PIL import Image

# few distinct colours after the resize = flat-colour content (UI, charts, text)
FLAT_MAX_COLOURS = 4096
# keep the lossless PNG when it is at most this much larger than the JPEG
PNG_SIZE_SLACK = 1.5


def encode_jpeg(im: Image.Image, quality: int) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=quality, optimize=False, progressive=False, subsampling="4:2:0")
    return buf.getvalue()


def encode_png(im: Image.Image) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "PNG", compress_level=6, optimize=False)
    return buf.getvalue()


def is_flat(im: Image.Image) -> bool:
    return im.getcolors(FLAT_MAX_COLOURS) is not None


def encode(im: Image.Image, quality: int) -> tuple[bytes, str]:
    """(bytes, mime) for an RGB image."""
    jpeg = encode_jpeg(im, quality)
    if is_flat(im):
        png = encode_png(im)
        if len(png) <= len(jpeg) * PNG_SIZE_SLACK:
            return png, "image/png"
    return jpeg, "image/jpeg"


def data_uri(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{pybase64.b64encode(data).decode('ascii')}"
