"""libvips for the two steps where it is measured faster than Pillow (docs/benchmarks/images.md):
PNG decode (libspng, GIL released: 2880x1800 screenshot 27 ms vs Pillow 42 ms on one core,
and Pillow's chunked PNG decode does not scale over threads) and the final filter of a
downscale (vips reduce, Catmull-Rom "cubic" = Pillow's BICUBIC family, 1.8 ms vs 4.7 ms for
960x540 -> 768x448). Everything else (checks, colour, trim, encode) stays in Pillow.

Only plain PNGs take the libvips decode: 8-bit RGB or grey, no transparency, no colour
profile, nothing ``decode.static_reasons`` would convert; the structural scan (chunk
CRCs, IEND, caps) and the size checks have already run on the bytes. Anything else, or
libvips missing, goes the Pillow way.
"""

from __future__ import annotations

import os

from PIL import Image

os.environ.setdefault("VIPS_CONCURRENCY", "1")  # one thread per job: the bounded pool spends the cores
try:
    import pyvips

    pyvips.cache_set_max(0)  # no operation cache: every image is new, memory stays bounded
    VIPS = True
except (ImportError, OSError):  # pragma: no cover - depends on the install
    VIPS = False


def _forked() -> None:
    # libvips' thread pool does not survive fork(): a forked child would wait on threads
    # that are not there. Workers are spawned; a forked child (a test harness) uses Pillow.
    global VIPS
    VIPS = False


os.register_at_fork(after_in_child=_forked)

KERNELS = {"bicubic": "cubic", "bilinear": "linear", "lanczos": "lanczos3"}


def plain_png(im: Image.Image) -> bool:
    """An opened PNG that libvips may decode to the same pixels Pillow would."""
    return (VIPS and im.format == "PNG" and im.mode in ("RGB", "L") and "transparency" not in im.info
            and not im.info.get("icc_profile") and not im.info.get("interlace")
            and getattr(im, "_PngImageFile__frame", 0) == 0)


def decode_png(data: bytes, size: tuple[int, int]) -> Image.Image:
    """The pixels of a plain PNG (``plain_png``) as a read-only Pillow image of ``size`` that
    shares libvips' memory: ``RGBX`` (RGB and a padding band, Pillow's own layout for RGB,
    so nothing is copied) or ``L``. ``rgb()`` turns it into RGB, best after a reduction."""
    v = pyvips.Image.new_from_buffer(data, "", access="sequential", fail=True)
    if (v.width, v.height) != size or v.format != "uchar" or v.bands not in (1, 3):
        raise ValueError(f"libvips read {v.width}x{v.height}x{v.bands} {v.format}, the header says {size}")
    mode = "L" if v.bands == 1 else "RGBX"
    buf = (v if v.bands == 1 else v.bandjoin(255)).write_to_memory()
    im = Image.frombuffer(mode, size, buf, "raw", mode, 0, 1)
    im._vips_pixels = buf  # noqa: SLF001 - resize() reads them back without a copy (_pixels)
    return im


def _pixels(im: Image.Image) -> bytes:
    """``im``'s pixels for libvips: the decode's own buffer while the image is still the
    read-only view of it (Pillow copies on any in-place change and clears ``readonly``),
    else a copy. Saves a full-size copy (20 MB for 2880x1800) per PNG sent near full size."""
    buf = getattr(im, "_vips_pixels", None)
    return buf if buf is not None and im.readonly else im.tobytes()


def rgb(im: Image.Image) -> Image.Image:
    return im.convert("RGB") if im.mode in ("RGBX", "L") else im


BANDS = {"RGB": 3, "L": 1, "RGBX": 4}


def resize(im: Image.Image, target: tuple[int, int], resample: str,
           box: tuple[int, int, int, int] | None = None) -> Image.Image:
    """``im`` (RGB, L, or RGBX as ``decode_png`` gives it; ``box``: only that part) resized to
    exactly ``target`` with libvips' reduce, in ``im``'s mode: RGBX comes back RGBX, handed to
    Pillow without a copy (Pillow stores RGB in four bytes; ``rgb()`` after the reduction is
    a cheap copy, where dropping the band in libvips and unpacking three bytes measured
    3-10 % slower over the whole rewrite)."""
    v = pyvips.Image.new_from_memory(_pixels(im), im.width, im.height, BANDS[im.mode], "uchar")
    if box is not None:
        v = v.crop(box[0], box[1], box[2] - box[0], box[3] - box[1])
    v = v.resize(target[0] / v.width, vscale=target[1] / v.height, kernel=KERNELS.get(resample, "cubic"))
    if (v.width, v.height) != target:  # rounding of the scale: never off by more than a pixel
        v = v.crop(0, 0, min(v.width, target[0]), min(v.height, target[1])).gravity(
            "north-west", target[0], target[1], extend="copy")
    return Image.frombuffer(im.mode, target, v.write_to_memory(), "raw", im.mode, 0, 1)
