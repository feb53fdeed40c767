"""Synthetic test images (generated, nothing downloaded): photographic-like
JPEGs, screenshots with margins, every mode/format the decoder must handle and
the hostile cases it must refuse. Used by the tests and the benchmark."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
from PIL import Image, ImageDraw, ImageFilter


def photo_array(w: int, h: int, seed: int = 1) -> np.ndarray:
    """Smooth shading, fine texture and hard edges: compresses and resizes like a photo."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    r = 128 + 100 * np.sin(x / 97.0) * np.cos(y / 53.0)
    g = 128 + 90 * np.sin((x + y) / 141.0)
    b = 128 + 80 * np.cos(x / 37.0 + y / 71.0)
    a = np.stack([r, g, b], -1) + rng.normal(0, 10, (h, w, 3)).astype(np.float32)
    a[((x.astype(int) // 150 + y.astype(int) // 110) % 5) == 0] *= 0.6
    im = Image.fromarray(np.clip(a, 0, 255).astype(np.uint8)).filter(ImageFilter.GaussianBlur(0.7))
    return np.asarray(im)


def save(im: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def photo_jpeg(w: int, h: int, quality: int = 92, progressive: bool = False, seed: int = 1) -> bytes:
    return save(Image.fromarray(photo_array(w, h, seed)), "JPEG", quality=quality, progressive=progressive)


def screenshot(w: int = 1920, h: int = 1080, margin: tuple[int, int] = (360, 90), seed: int = 3) -> Image.Image:
    """A flat UI screenshot: white margins around a window with text lines and boxes."""
    rng = np.random.default_rng(seed)
    im = Image.new("RGB", (w, h), (255, 255, 255))
    d = ImageDraw.Draw(im)
    mx, my = margin
    d.rectangle([mx, my, w - mx - 1, h - my - 1], fill=(246, 247, 249), outline=(200, 200, 205))
    d.rectangle([mx, my, w - mx - 1, my + 40], fill=(52, 101, 164))
    y = my + 60
    while y < h - my - 30:
        x = mx + 20
        d.text((x, y), "Revenue by region Q3 " + "".join(chr(65 + int(c)) for c in rng.integers(0, 26, 30)),
               fill=(20, 20, 30))
        d.rectangle([w - mx - 220, y, w - mx - 220 + int(rng.integers(20, 180)), y + 10],
                    fill=(int(rng.integers(0, 255)), 140, 90))
        y += 22
    return im


def screenshot_png(w: int = 1920, h: int = 1080, margin: tuple[int, int] = (360, 90)) -> bytes:
    return save(screenshot(w, h, margin), "PNG")


def letterboxed_jpeg(w: int = 1920, h: int = 1080, bar: int = 140) -> bytes:
    a = np.zeros((h, w, 3), np.uint8)
    a[bar:h - bar] = photo_array(w, h - 2 * bar, seed=5)
    return save(Image.fromarray(a), "JPEG", quality=92)


def exif_rotated_jpeg(w: int = 1600, h: int = 1000, orientation: int = 6) -> bytes:
    """Stored w x h, displayed rotated: the left half red, the right half blue as stored."""
    a = np.zeros((h, w, 3), np.uint8)
    a[:, : w // 2] = (220, 20, 20)
    a[:, w // 2:] = (20, 20, 220)
    im = Image.fromarray(a)
    exif = Image.Exif()
    exif[0x0112] = orientation
    return save(im, "JPEG", quality=92, exif=exif.tobytes())


def cmyk_jpeg(w: int = 1200, h: int = 900, rgb: tuple[int, int, int] = (200, 60, 30)) -> bytes:
    return save(Image.new("RGB", (w, h), rgb).convert("CMYK"), "JPEG", quality=95)


def palette_png_transparent(w: int = 1000, h: int = 800) -> bytes:
    """Palette PNG: transparent background (index 0), an opaque green square."""
    im = Image.new("P", (w, h), 0)
    im.putpalette([0, 0, 0, 0, 160, 0] + [0] * 762)
    ImageDraw.Draw(im).rectangle([w // 4, h // 4, 3 * w // 4, 3 * h // 4], fill=1)
    return save(im, "PNG", transparency=0)


def png16_gray(w: int = 1000, h: int = 800) -> bytes:
    a = np.tile(np.linspace(0, 65535, w, dtype=np.uint16), (h, 1))
    return save(Image.fromarray(a), "PNG")


def gray_jpeg(w: int = 1200, h: int = 800) -> bytes:
    return save(Image.fromarray(photo_array(w, h)).convert("L"), "JPEG", quality=92)


def webp(w: int = 1200, h: int = 800) -> bytes:
    return save(Image.fromarray(photo_array(w, h)), "WEBP", quality=90)


def animated_gif(w: int = 1000, h: int = 800) -> bytes:
    frames = [Image.new("RGB", (w, h), c).convert("P") for c in ((250, 0, 0), (0, 250, 0), (0, 0, 250))]
    return save(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)


def bmp(w: int = 1000, h: int = 800) -> bytes:
    return save(Image.fromarray(photo_array(w, h)), "BMP")


def tiff(w: int = 1000, h: int = 800) -> bytes:
    return save(Image.fromarray(photo_array(w, h)), "TIFF")


def bomb_png(side: int = 30000) -> bytes:
    """A few hundred bytes declaring a side x side canvas (900 megapixels)."""
    raw = zlib.compress(b"\x00" * (side // 8 + 1) * 16, 9)  # a few rows; the header is what matters

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0))
            + chunk(b"IDAT", raw) + chunk(b"IEND", b""))


SVG = b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg" width="4000" height="4000"><rect width="10" height="10"/></svg>'
TEXT_AS_IMAGE = b"Hello, I am definitely a PNG image. Trust me.\n" * 20
