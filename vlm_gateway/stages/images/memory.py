"""Decode memory, known before a pixel is decoded: per image against a cap, per process
against a bound.

``need(fmt, im, nclx, ...)``: the bytes a decode holds at its peak, when ``im`` (the
opened image, after any JPEG draft) is decoded at its size:

    need = px x (stored + kept + max(transient, conversions + after)) + after_fixed
           + coefficients + BASE

- ``px``: the decoded canvas (a GIF's, an animation's, a grid's whole canvas, whatever
  the frames cover);
- ``stored``: Pillow's bytes per pixel for the mode (4 for RGB, RGBA, CMYK, 32-bit;
  2 for 16-bit; 1 for L, P, 1; the libvips PNG decode: 4 for RGBX, 1 for L);
- ``kept`` and ``transient``: what the decoder holds beside Pillow's image, for as long
  as the image is open and only while it decodes (``KEPT``, ``TRANSIENT``: libwebp's
  animation decoder, which Pillow uses for every WebP, keeps two RGBA canvases and hands
  over a third copy; libavif keeps its YUV planes and hands over RGB; libheif frees its
  planes and RGB buffer once Pillow has the pixels);
- ``conversions``: each full-size copy the conversion to 8-bit sRGB makes (``_convert``:
  palette or transparency expanded, alpha composited on white, colour profile, nclx,
  16-bit scaling, EXIF rotation);
- ``after``: what follows at that size (``"rewrite"``: the text estimate and the trim's
  reduction, and ``after_fixed`` for the resize to the target and its encode;
  ``"convert"``: the re-encode of an image sent at its own size; ``"check"``: nothing);
- ``coefficients``: a progressive or multi-scan JPEG buffers every DCT coefficient of the
  whole source (2 bytes per sample) however small it is decoded.

The figures are measured peaks of the resident set (``tests/bounded.py --legit``, at two
sizes: docs/IMAGES.md has the table), rounded up; ``tests/test_images_memory.py`` checks
that ``need`` is never below what a decode really takes.

``DecodeBudget``: one rewrite's decodes. ``need`` above ``max_bytes``
(``images.max_decode_bytes``) is a 400 ``image_too_large`` before the library
allocates, unless the file backs it: a decode of up to ``large_bytes``
(``images.max_decode_bytes_large``) is admitted when it holds at most ``per_source_byte``
(``images.max_decode_bytes_per_source_byte``) bytes per byte of the source file. A 48 MP
photo (a 290 MB PNG decode from a file of tens of MB, a 350 MB HEIC one from 5-10 MB) is
read; a few hundred bytes that declare a 64 MP canvas are not: a bomb's ratio is in the
thousands (deflate reaches 1032:1 before PNG filtering), a photo's in the tens; what is admitted is reserved from the process's decode bound
(``images.max_decode_bytes_in_flight``, ``inflight.MediaBudget.decoding``: 503 past
it) until the rewrite ends, however it ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from .colour import needs_nclx
from .errors import ImageError

if TYPE_CHECKING:
    from PIL import Image

DEFAULT_MAX_DECODE_BYTES = 256 * 1024 * 1024
DEFAULT_MAX_DECODE_BYTES_LARGE = 512 * 1024 * 1024
DEFAULT_PER_SOURCE_BYTE = 256
BASE = 2 * 1024 * 1024  # buffers of any decode that do not grow with the canvas

STORED = {"1": 1, "L": 1, "P": 1, "I;16": 2, "I;16B": 2, "I;16L": 2, "I;16N": 2}  # else 4
# bytes per canvas pixel a decoder holds beside Pillow's image: while the image is open
KEPT = {"webp": 9.0, "avif": 3.0}
# ... and only while it decodes
TRANSIENT = {"webp": 5.0, "avif": 4.0, "heif": 5.0, "gif": 1.0, "tiff": 1.0, "jpeg": 2.0}
KEPT_ALPHA = 1.0  # libavif, libheif: the alpha plane
# per canvas pixel: the text estimate's strips and the trim's reduction; the re-encode of an
# image sent at its own size. AFTER_FIXED: what the resize to the target and its encode hold
AFTER = {"rewrite": 2.5, "convert": 2.0, "check": 0.0}
AFTER_FIXED = {"rewrite": 2 * 1024 * 1024, "convert": 0, "check": 0}
VIPS_16BIT = 2.5  # libvips' 16-bit samples on their way to 8
_DEEP = ("I;16", "I;16B", "I;16L", "I;16N", "I", "F")


def _convert(mode: str, transparency: bool, icc: bool, nclx: bool, rotate: bool) -> float:
    """Bytes per pixel of the full-size copies ``decode.to_srgb`` (and the EXIF turn) make."""
    b = 4.0 if rotate else 0.0
    m = mode
    if m in _DEEP:
        b, m = b + 1, "L"           # scaled to 8 bits a band at a time
    if m in ("P", "PA"):
        b, m = b + 4, "RGBA" if (transparency or m == "PA") else "RGB"
    elif m in ("L", "RGB") and transparency:
        b, m = b + 4, "LA" if m == "L" else "RGBA"
    if m == "RGBA" and not icc and not nclx:
        return b + 4                # composited onto a white canvas straight from the pixels
    alpha = m in ("RGBA", "RGBa", "LA", "La", "PA")
    if alpha:
        b, m = b + 5, "L" if m in ("LA", "La") else "RGB"   # the alpha band, then the colour
    if m not in ("RGB", "L", "CMYK"):
        b, m = b + 4, "RGB"
    if icc:
        b += 4
    elif nclx:
        b += 10                     # float work in bands, an RGB copy and the result
    if m != "RGB":
        b += 4
    return b + (4 if alpha else 0)


def jpeg_coefficients(im: "Image.Image", scans: int) -> int:
    """Bytes of libjpeg's whole-image coefficient buffer (progressive or multi-scan files)."""
    if not (im.info.get("progressive") or scans > 1):
        return 0
    hv = [(max(1, h), max(1, v)) for _, h, v, *_ in getattr(im, "layer", None) or []]  # (id, h, v, table)
    if not hv:
        return int(2.1 * 4 * im.size[0] * im.size[1])
    hmax, vmax = max(h for h, _ in hv), max(v for _, v in hv)
    samples = sum(h * v for h, v in hv) / (hmax * vmax)
    return int(2.1 * samples * im.size[0] * im.size[1]) + 1  # 2 bytes a coefficient, blocks padded to MCUs


def need(fmt: str, im: "Image.Image", nclx: tuple[int, int, int, int] | None = None, vips_png: bool = False,
         after: str = "check", rotate: bool = False, coefficients: int = 0, convert: bool = True) -> int:
    """Peak bytes of decoding ``im`` (an opened image of format ``fmt``, after any draft) at
    its size; ``nclx``: its colour description; ``convert`` False: it is only decoded
    (verified), not converted."""
    px = im.size[0] * im.size[1]
    if vips_png:
        stored = 1.0 if im.mode == "L" else 4.0
        deep = any(str(t.args).endswith(";16B") for t in getattr(im, "tile", None) or [])
        return int(px * (stored + (VIPS_16BIT if deep else 0.0) + AFTER[after])) + AFTER_FIXED[after] + BASE
    mode = im.mode
    stored = float(STORED.get(mode, 4))
    conv = _convert(mode, "transparency" in im.info, bool(im.info.get("icc_profile")), needs_nclx(nclx), rotate) \
        if convert else 0.0
    kept = KEPT.get(fmt, 0.0) + (KEPT_ALPHA if fmt in ("heif", "avif") and mode in ("RGBA", "LA") else 0)
    transient = TRANSIENT.get(fmt, 0.0)
    return int(px * (stored + kept + max(transient, conv + AFTER[after]))) + AFTER_FIXED[after] + coefficients + BASE


def mb(n: int) -> str:
    return f"{n / 2**20:.0f} MB"


@dataclass
class DecodeLimits:
    """What every decode of a rewrite is held to. ``reserve``/``release``: the process's
    bound (``MediaBudget.decoding``/``decoded``), callable from any thread; None: none."""

    max_bytes: int = DEFAULT_MAX_DECODE_BYTES
    reserve: Callable[[int], None] | None = None
    release: Callable[[int], None] | None = None
    large_bytes: int = DEFAULT_MAX_DECODE_BYTES_LARGE
    per_source_byte: int = DEFAULT_PER_SOURCE_BYTE

    def cap(self, source_bytes: int) -> int:
        """The most one decode of a ``source_bytes`` file may hold (0: no cap)."""
        if not self.max_bytes:
            return 0
        backed = min(self.large_bytes, self.per_source_byte * source_bytes)
        return max(self.max_bytes, backed)


class DecodeBudget:
    """The decodes of one rewrite: each ``need`` is checked against the per-image cap and
    added to what the rewrite holds from the process bound; ``close`` gives it back."""

    def __init__(self, limits: DecodeLimits | None = None, source_bytes: int = 0) -> None:
        self.limits = limits or DecodeLimits()
        self.cap = self.limits.cap(source_bytes)
        self.held = 0     # reserved from the process bound
        self.peak = 0     # the largest single need (for the error message)

    def need(self, n: int, what: str) -> None:
        cap = self.cap
        if cap and n > cap:
            keys = ("images.max_decode_bytes" if cap == self.limits.max_bytes else
                    "images.max_decode_bytes_large / max_decode_bytes_per_source_byte")
            raise ImageError(f"decoding the {what} would hold about {mb(n)}, above the limit of {mb(cap)} "
                             f"for a file of this size ({keys}); send it smaller", "image_too_large")
        if self.limits.reserve is not None:
            self.limits.reserve(n)
        self.held += n
        self.peak = max(self.peak, n)

    def close(self) -> None:
        if self.held and self.limits.release is not None:
            self.limits.release(self.held)
        self.held = 0

    def __enter__(self) -> "DecodeBudget":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
