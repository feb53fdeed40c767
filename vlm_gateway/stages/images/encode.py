"""Deterministic re-encode: the same pixels and settings always give the same
bytes (no timestamps, no metadata, fixed encoder options), so the engines' prefix
and multimodal caches hit on a repeated image.

Every rewritten or converted image goes out as JPEG q90 (``images.jpeg_quality``)
with 4:2:0 chroma: per image class (light and dark screenshots, documents and
spreadsheets, charts, photos) it is what costs least to make here and to read in the
engine (vLLM decodes what it receives with Pillow, in its one API-server process), at
no OCR loss against the same pixels sent lossless (benchmarks/image_encodings.py,
docs/benchmarks/images.md). Measured against the other candidates on the same pixels:
JPEG 4:4:4 q90/q95 cost 1.3-2x on both sides; PNG (Pillow's zlib level 1, which flat
content used to get) 5-15x to encode and 2-4x to decode; libvips' PNG without filters
2-3x to encode, 1.5-2.5x the bytes; WebP, lossless or lossy, 5-20x to encode and 2-4x to
decode. The OCR readers' results moved less between JPEG and lossless than between
their own runs on neighbouring sizes.
"""

from __future__ import annotations

import io

import pybase64
from PIL import Image

# what the encoder writes; part of the L1 key, so a change of encoder is a miss, never old bytes
ENCODER = "jpeg420"

# Nothing of the source's metadata goes out: Pillow would copy a JPEG comment from
# ``im.info``; a converted image's LittleCMS sRGB profile carries its creation time, so the
# same source gave other bytes in another process.
_NO_META = {"icc_profile": None, "comment": "", "exif": b""}


def encode_jpeg(im: Image.Image, quality: int) -> bytes:
    """``im``: RGB, L, or RGBX (libjpeg-turbo reads the padding band's layout as it is: the
    same bytes as the RGB image, without unpacking it first)."""
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=quality, optimize=False, progressive=False, subsampling="4:2:0", **_NO_META)
    return buf.getvalue()


def encode(im: Image.Image, quality: int) -> tuple[bytes, str]:
    """(bytes, mime) for an RGB (or RGBX: ``vips.resize``'s output) image."""
    return encode_jpeg(im, quality), "image/jpeg"


def data_uri(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{pybase64.b64encode(data).decode('ascii')}"
