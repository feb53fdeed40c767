"""Deterministic re-encode: the same pixels and settings always give the same
bytes (no timestamps, no EXIF, fixed encoder options), so the engines' prefix
and multimodal caches hit on a repeated image.

Photographic content goes out as JPEG q90. Flat-colour content (at most
FLAT_MAX_COLOURS distinct colours after the resize: charts, diagrams, UI flats)
is also tried as PNG and sent lossless when that is at most PNG_SIZE_SLACK x the
JPEG. Measured on a 1920x1080 text screenshot (~2300 colours after the resize):
PNG was 1.9x the JPEG and slower to encode, lossless WebP 1.2x but 20-60x slower,
and the JPEG kept 39.7 dB, so text-heavy screenshots go out as JPEG.
"""

from __future__ import annotations

import io

import pybase64
from PIL import Image

# few distinct colours after the resize = flat-colour content (UI, charts, text)
FLAT_MAX_COLOURS = 1024
# keep the lossless PNG when it is at most this much larger than the JPEG
PNG_SIZE_SLACK = 1.5


# Nothing of the source's metadata goes out: Pillow would copy a JPEG comment and (into a PNG)
# the image's ICC profile from ``im.info``; LittleCMS's sRGB profile on a converted image
# carries its creation time, so the same source gave other bytes in another process.
_NO_META_JPEG = {"icc_profile": None, "comment": "", "exif": b""}
_NO_META_PNG = {"icc_profile": None, "transparency": None, "exif": None}


def encode_jpeg(im: Image.Image, quality: int) -> bytes:
    """``im``: RGB, L, or RGBX (libjpeg-turbo reads the padding band's layout as it is: the
    same bytes as the RGB image, without unpacking it first)."""
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=quality, optimize=False, progressive=False, subsampling="4:2:0", **_NO_META_JPEG)
    return buf.getvalue()


# zlib level 1: on a 768x448 chart 3.5 ms and 0.23x the JPEG's bytes (level 6: 5 ms, 0.12x);
# on noisy low-colour content, where the PNG loses to the JPEG anyway, 28 ms instead of 111 ms.
PNG_COMPRESS_LEVEL = 1


def encode_png(im: Image.Image) -> bytes:
    if im.mode == "RGBX":  # PNG has no padding band
        im = im.convert("RGB")
    buf = io.BytesIO()
    im.save(buf, "PNG", compress_level=PNG_COMPRESS_LEVEL, optimize=False, **_NO_META_PNG)
    return buf.getvalue()


def is_flat(im: Image.Image) -> bool:
    return im.getcolors(FLAT_MAX_COLOURS) is not None


def encode(im: Image.Image, quality: int) -> tuple[bytes, str]:
    """(bytes, mime) for an RGB (or RGBX: ``vips.resize``'s output) image."""
    jpeg = encode_jpeg(im, quality)
    if is_flat(im):
        png = encode_png(im)
        if len(png) <= len(jpeg) * PNG_SIZE_SLACK:
            return png, "image/png"
    return jpeg, "image/jpeg"


def data_uri(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{pybase64.b64encode(data).decode('ascii')}"
