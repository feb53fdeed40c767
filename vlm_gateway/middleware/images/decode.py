"""Safe decode: format from magic bytes, size from the header only, a pixel cap
before any pixel is decoded, then a full decode to 8-bit RGB (EXIF orientation
applied; CMYK, palette, alpha, 16-bit and grayscale converted correctly).

Errors are ``ImageError`` with a specific code; the stage turns them into 400s.
"""

from __future__ import annotations

import io
import struct
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps

# Our own pixel cap runs first; Pillow's bomb check would only repeat it.
Image.MAX_IMAGE_PIXELS = None
# Only the allow-listed decoders are ever tried (also keeps Image.open from probing others).
FORMATS = {"jpeg": "JPEG", "png": "PNG", "webp": "WEBP", "gif": "GIF", "bmp": "BMP", "tiff": "TIFF"}
MIME = {"jpeg": "image/jpeg", "png": "image/png", "webp": "image/webp", "gif": "image/gif",
        "bmp": "image/bmp", "tiff": "image/tiff"}


class ImageError(ValueError):
    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


def sniff(data: bytes) -> str:
    """Format name from magic bytes (never from a header or file name)."""
    if len(data) == 0:
        raise ImageError("the image is empty (0 bytes)", "image_empty")
    h = data[:16]
    if h[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if h[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if h[:4] == b"RIFF" and h[8:12] == b"WEBP":
        return "webp"
    if h[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if h[:2] == b"BM":
        return "bmp"
    if h[:4] in (b"II*\x00", b"MM\x00*"):
        return "tiff"
    head = data[:512].lstrip().lower()
    if head.startswith((b"<?xml", b"<svg")) or b"<svg" in head:
        raise ImageError("SVG images are not supported; send PNG, JPEG, WebP, GIF, BMP or TIFF",
                         "unsupported_image_format")
    if h[4:8] == b"ftyp":
        raise ImageError("HEIC/AVIF images are not supported; send PNG, JPEG, WebP, GIF, BMP or TIFF",
                         "unsupported_image_format")
    raise ImageError("the data is not a supported image (PNG, JPEG, WebP, GIF, BMP or TIFF)",
                     "unsupported_image_format")


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    i, n = 2, len(data)
    while i + 9 < n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        (length,) = struct.unpack_from(">H", data, i + 2)
        # SOF0..SOF15 except DHT (C4), JPG (C8), DAC (CC)
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            h, w = struct.unpack_from(">HH", data, i + 5)
            return w, h
        i += 2 + length
    return None


def _header_size(data: bytes, fmt: str) -> tuple[int, int] | None:
    try:
        if fmt == "jpeg":
            return _jpeg_size(data)
        if fmt == "png" and data[12:16] == b"IHDR":
            return struct.unpack_from(">II", data, 16)
        if fmt == "gif":
            return struct.unpack_from("<HH", data, 6)
        if fmt == "bmp":
            w, h = struct.unpack_from("<ii", data, 18)
            return w, abs(h)
        if fmt == "webp":
            chunk = data[12:16]
            if chunk == b"VP8X":
                w = int.from_bytes(data[24:27], "little") + 1
                h = int.from_bytes(data[27:30], "little") + 1
                return w, h
            if chunk == b"VP8L":
                b = int.from_bytes(data[21:25], "little")
                return (b & 0x3FFF) + 1, ((b >> 14) & 0x3FFF) + 1
            if chunk == b"VP8 ":
                w, h = struct.unpack_from("<HH", data, 26)
                return w & 0x3FFF, h & 0x3FFF
    except struct.error:
        return None
    return None  # tiff and odd layouts: ask Pillow


@dataclass(slots=True)
class Header:
    format: str
    width: int
    height: int


def probe(data: bytes, max_pixels: int) -> Header:
    """Format and size from the first bytes; refuses decompression bombs."""
    fmt = sniff(data)
    size = _header_size(data, fmt)
    if size is None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                im = Image.open(io.BytesIO(data), formats=[FORMATS[fmt]])
            size = im.size
        except Exception:
            raise ImageError(f"the {fmt.upper()} header is corrupt or truncated", "image_corrupt") from None
    w, h = size
    if w <= 0 or h <= 0:
        raise ImageError(f"the {fmt.upper()} header declares an empty image ({w}x{h})", "image_corrupt")
    if w * h > max_pixels:
        raise ImageError(f"the image is {w}x{h} = {w * h / 1e6:.1f} megapixels, above the limit of "
                         f"{max_pixels / 1e6:g} megapixels", "image_too_large")
    if max(w, h) / min(w, h) > 200:
        raise ImageError(f"the image aspect ratio {w}x{h} is above 200:1", "image_aspect_ratio")
    return Header(fmt, w, h)


_TRANSPOSED = (5, 6, 7, 8)  # EXIF orientations that swap width and height


def open_image(data: bytes, fmt: str) -> Image.Image:
    try:
        im = Image.open(io.BytesIO(data), formats=[FORMATS[fmt]])
    except Exception:
        raise ImageError(f"the {fmt.upper()} data is corrupt or truncated", "image_corrupt") from None
    return im


def orientation(im: Image.Image) -> int:
    try:
        return int(im.getexif().get(0x0112, 1) or 1)
    except Exception:
        return 1


def oriented_size(im: Image.Image) -> tuple[int, int]:
    w, h = im.size
    return (h, w) if orientation(im) in _TRANSPOSED else (w, h)


def _to_rgb(im: Image.Image) -> Image.Image:
    mode = im.mode
    if mode == "RGB":
        return im
    if mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        # 16/32-bit grayscale: scale to 8 bits (Pillow's convert would clip at 255)
        a = np.asarray(im).astype(np.uint32)
        top = 65535 if mode.startswith("I;16") or a.max(initial=0) > 255 else 255
        a8 = (a * 255 + top // 2) // top if top != 255 else a
        return Image.fromarray(np.clip(a8, 0, 255).astype(np.uint8)).convert("RGB")
    if mode == "F":
        a = np.asarray(im)
        scale = 255.0 if float(a.max(initial=0)) <= 1.0 else 1.0
        return Image.fromarray(np.clip(a * scale + 0.5, 0, 255).astype(np.uint8)).convert("RGB")
    if mode == "P" or mode == "PA":
        im = im.convert("RGBA") if ("transparency" in im.info or mode == "PA") else im.convert("RGB")
        mode = im.mode
        if mode == "RGB":
            return im
    if mode in ("RGBA", "LA", "RGBa", "La"):
        rgba = im.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    if mode == "L" and "transparency" in im.info:
        return _to_rgb(im.convert("LA"))
    if mode == "RGB" and "transparency" in im.info:
        return _to_rgb(im.convert("RGBA"))
    return im.convert("RGB")  # L, 1, CMYK, YCbCr, LAB, HSV


def decode(data: bytes, fmt: str, draft_size: tuple[int, int] | None = None) -> tuple[Image.Image, float]:
    """Full decode to RGB, upright, and the scale the decode applied (source px per
    decoded px). ``draft_size`` (as stored, before EXIF rotation) lets JPEG decode
    with DCT scaling to no less than that size."""
    im = open_image(data, fmt)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if fmt == "gif" or getattr(im, "n_frames", 1) > 1:
                im.seek(0)  # first frame only
            orient = orientation(im)
            stored_w = im.width
            if draft_size is not None and fmt == "jpeg":
                im.draft(None, draft_size)
            im.load()
            scale = stored_w / im.width
            if orient != 1:
                im = ImageOps.exif_transpose(im)
            # "transparency" in a GIF/PNG palette survives load; the first frame may be "P"
            return _to_rgb(im), scale
    except ImageError:
        raise
    except (OSError, SyntaxError, ValueError, EOFError, struct.error) as e:
        raise ImageError(f"the {fmt.upper()} data is corrupt or truncated ({str(e)[:80]})",
                         "image_corrupt") from None
    except (MemoryError, Image.DecompressionBombError):
        raise ImageError("the image is too large to decode", "image_too_large") from None
