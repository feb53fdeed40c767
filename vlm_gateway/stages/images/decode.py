"""Safe decode: format from magic bytes, size from the header, then the real size
after opening, then a full decode to upright 8-bit sRGB.

Order of checks for every image (each step refuses with an ``ImageError``):
1. ``sniff``: the format from magic bytes, never from a header or a file name;
   unreadable formats are named, with what to send instead.
2. ``probe``: the size the header declares, against ``max_source_pixels`` and the
   200:1 aspect cap, before anything else is parsed.
3. ``open_checked``: a structural scan within hard caps (``structure.py``), then
   the library opens the file and the size it *really* has (a GIF frame placed
   outside the logical screen grows the canvas; a JPEG may carry a second SOF) is
   checked again. Pillow's own bomb check stays on as a backstop
   (``Image.MAX_IMAGE_PIXELS`` is never below Pillow's default or below the
   configured limit).
4. ``verify``/``decode_opened``: the memory the decode will hold (``memory.need``:
   the canvas, mode, format and conversions) against the image's ``DecodeBudget``
   (per-image cap, process bound) before the library allocates; then the pixels,
   decoded (JPEG within budget: entropy decode at 1/8 scale, which reads every scan),
   and the real size and memory checked again before any conversion copies them.
   What an engine would read differently from what a viewer shows is converted
   (``Decoded.conversions``):
   formats engines cannot all read (AVIF, HEIF, TIFF, BMP), animation (first
   frame), EXIF orientation, colour profiles and nclx colour to sRGB, CMYK,
   16-bit and float samples, and alpha that is not fully opaque (composited onto
   white, the page colour a viewer shows).
"""

from __future__ import annotations

import io
import re
import struct
import warnings
from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageOps, PngImagePlugin, features

from ...core.errors import GatewayError
from . import colour, memory, structure, vips
from .errors import ImageError
from .memory import DecodeBudget

try:  # HEIC/HEIF: optional extra (the heif extra: pip install '.[heif]')
    import pillow_heif

    # one decode thread per job: the bounded pool is what spends the cores
    pillow_heif.register_heif_opener(thumbnails=False, depth_images=False, aux_images=False, decode_threads=1)
    HEIF = True
except ImportError:  # pragma: no cover - depends on the install
    HEIF = False

AVIF = bool(features.check("avif"))
if AVIF:
    from PIL import AvifImagePlugin

    AvifImagePlugin.DEFAULT_MAX_THREADS = 1  # as for HEIF: the pool spends the cores

# Pillow's bomb check stays on beneath ours (ours is exact and runs first; Pillow's
# raises at 2x its limit). ``ensure_backstop`` raises it to a configured limit above it.
PILLOW_MAX_PIXELS = Image.MAX_IMAGE_PIXELS or int(1024 * 1024 * 1024 // 4 // 3)
Image.MAX_IMAGE_PIXELS = PILLOW_MAX_PIXELS
warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)
# Pillow's warnings about odd files (corrupt EXIF, malformed MPO, palette transparency) would
# print once per hostile request; the outcome is in the response and the metrics instead.
warnings.filterwarnings("ignore", module=r"PIL\.")

# PNG text chunks (tEXt/zTXt/iTXt) are never used; Pillow would inflate up to 64 MB of them
# per image (1 MB each). 4 MB keeps every real file and bounds the rest.
PngImagePlugin.MAX_TEXT_MEMORY = 4 * 1024 * 1024

# Only the allow-listed decoders are ever tried (also keeps Image.open from probing others).
FORMATS = {"jpeg": "JPEG", "png": "PNG", "webp": "WEBP", "gif": "GIF", "bmp": "BMP", "tiff": "TIFF",
           "avif": "AVIF", "heif": "HEIF"}
MIME = {"jpeg": "image/jpeg", "png": "image/png", "webp": "image/webp", "gif": "image/gif",
        "bmp": "image/bmp", "tiff": "image/tiff", "avif": "image/avif", "heif": "image/heif"}
# Formats that always go out re-encoded: not every engine's loader reads them.
ALWAYS_CONVERT = ("avif", "heif", "tiff", "bmp")
SEND_INSTEAD = "send PNG, JPEG or WebP"
HEIF_BRANDS = {b"heic", b"heix", b"hevc", b"hevx", b"heim", b"heis", b"hevm", b"hevs", b"mif1", b"msf1", b"mif2"}
VIDEO_BRANDS = {b"isom", b"iso2", b"mp41", b"mp42", b"qt  ", b"M4V ", b"M4A ", b"3gp4", b"3gp5", b"3g2a", b"avc1",
                b"dash", b"mp71"}


def accepted() -> str:
    fmts = ["PNG", "JPEG", "WebP", "GIF"] + (["AVIF"] if AVIF else []) + (["HEIC/HEIF"] if HEIF else [])
    return ", ".join(fmts + ["BMP"]) + " or TIFF"


def _unsupported(what: str) -> ImageError:
    return ImageError(f"{what} images are not supported; {SEND_INSTEAD} (accepted: {accepted()})",
                      "unsupported_image_format")


def _ftyp_brands(data: bytes) -> set[bytes]:
    size = int.from_bytes(data[:4], "big")
    end = min(len(data), size if 16 <= size <= 4096 else 16)
    return {data[8:12]} | {data[i:i + 4] for i in range(16, end - 3, 4)}


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
    if h[4:8] == b"ftyp":
        brands = _ftyp_brands(data)
        if brands & {b"avif", b"avis"}:
            if not AVIF:
                raise _unsupported("AVIF (this gateway's Pillow was built without AVIF)")
            return "avif"
        if brands & HEIF_BRANDS:
            if not HEIF:
                raise _unsupported("HEIC/HEIF (this gateway was installed without its 'heif' extra: "
                                   "pip install -e '.[heif]' in its checkout)")
            return "heif"
        if brands & VIDEO_BRANDS:
            raise ImageError(f"this is an MP4/QuickTime video, not an image; send a frame as PNG or JPEG "
                             f"(accepted: {accepted()})", "unsupported_image_format")
        raise _unsupported(f"ISO media ({data[8:12].decode('latin-1')!r} brand)")
    if h[:4] in (b"II+\x00", b"MM\x00+"):
        raise _unsupported("BigTIFF")
    if h[:2] == b"\xff\x0a" or h[:12] == b"\x00\x00\x00\x0cJXL \r\n\x87\n":
        raise _unsupported("JPEG XL")
    if h[:12] == b"\x00\x00\x00\x0cjP  \r\n\x87\n" or h[:4] == b"\xff\x4f\xff\x51":
        raise _unsupported("JPEG 2000")
    if h[:5] == b"%PDF-":
        raise ImageError(f"PDF documents are not images; {SEND_INSTEAD} of each page (accepted: {accepted()})",
                         "unsupported_image_format")
    if h[:4] == b"8BPS":
        raise _unsupported("Photoshop (PSD)")
    if h[:4] in (b"\x00\x00\x01\x00", b"\x00\x00\x02\x00"):
        raise _unsupported("ICO/CUR icon")
    head = data[:512].lstrip().lower()
    if head.startswith((b"<?xml", b"<svg")) or b"<svg" in head:
        raise _unsupported("SVG (vector)")
    raise ImageError(f"the data is not a supported image (accepted: {accepted()})", "unsupported_image_format")


_FILL = re.compile(rb"\xff+")


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    i, n, segments = 2, len(data), 0
    while i + 9 < n and segments < structure.MAX_JPEG_SEGMENTS:
        if data[i] != 0xFF:
            return None
        i = _FILL.match(data, i).end() - 1  # fill bytes: any number, skipped at C speed
        if i + 9 >= n:
            return None
        marker = data[i + 1]
        segments += 1
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
    """The size the header declares (trusted only to refuse early; ``open_checked`` has the last word)."""
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
    return None  # tiff, avif, heif and odd layouts: ask the library


@dataclass(slots=True)
class Header:
    format: str
    width: int
    height: int


def check_size(fmt: str, w: int, h: int, max_pixels: int, what: str = "image") -> None:
    if w <= 0 or h <= 0:
        raise ImageError(f"the {fmt.upper()} header declares an empty image ({w}x{h})", "image_corrupt")
    if w * h > max_pixels:
        raise ImageError(f"the {what} is {w}x{h} = {w * h / 1e6:.1f} megapixels, above the limit of "
                         f"{max_pixels / 1e6:g} megapixels", "image_too_large")
    if max(w, h) / min(w, h) > 200:
        raise ImageError(f"the image aspect ratio {w}x{h} is above 200:1", "image_aspect_ratio")


def ensure_backstop(max_pixels: int) -> None:
    """Pillow's own bomb check never below the limit the gateway enforces (or Pillow's default)."""
    if (Image.MAX_IMAGE_PIXELS or 0) < max_pixels:
        Image.MAX_IMAGE_PIXELS = max(PILLOW_MAX_PIXELS, max_pixels)


def _open(data: bytes, fmt: str) -> Image.Image:
    try:
        return Image.open(io.BytesIO(data), formats=[FORMATS[fmt]])
    except Image.DecompressionBombError:
        raise ImageError("the image is too large to decode", "image_too_large") from None
    except Exception:  # noqa: BLE001 - any library failure on hostile bytes is a corrupt image
        raise ImageError(f"the {fmt.upper()} data is corrupt or truncated", "image_corrupt") from None


def probe(data: bytes, max_pixels: int) -> Header:
    """Format and declared size from the first bytes; refuses declared bombs."""
    fmt = sniff(data)
    size = _header_size(data, fmt)
    if size is None:
        structure.scan(data, fmt, max_pixels, crc=False)  # caps before the library walks anything
        ensure_backstop(max_pixels)
        size = _open(data, fmt).size
    w, h = size
    check_size(fmt, w, h, max_pixels)
    return Header(fmt, w, h)


@dataclass(slots=True)
class Opened:
    """A file the library has opened (header parsed, no pixels yet), sizes checked."""

    im: Image.Image
    format: str
    frames: int = 1
    nclx: tuple[int, int, int, int] | None = None
    exif: bool = True
    max_pixels: int = 64_000_000
    data: bytes = b""  # the file itself (a decoder other than Pillow's may read it)
    budget: DecodeBudget = field(default_factory=DecodeBudget)  # the rewrite's decode memory
    scans: int = 1  # JPEG scans (memory.jpeg_coefficients)

    @property
    def size(self) -> tuple[int, int]:
        return self.im.size


def open_checked(data: bytes, fmt: str, max_pixels: int, budget: DecodeBudget | None = None) -> Opened:
    """Structural scan, open, and the real size checked (see the module docstring).
    ``budget``: what the decodes of this image may hold (``memory.DecodeBudget``)."""
    layout = structure.scan(data, fmt, max_pixels)
    ensure_backstop(max_pixels)
    im = _open(data, fmt)
    check_size(fmt, *im.size, max_pixels)
    frames = layout.frames
    if fmt in ("webp", "avif", "heif"):  # counted by the C demuxers while opening
        frames = int(getattr(im, "n_frames", 1) or 1)
    nclx = layout.nclx
    p = im.info.get("nclx_profile")
    if isinstance(p, dict):  # pillow-heif: the primary image's own description
        nclx = (int(p.get("color_primaries", 2)), int(p.get("transfer_characteristics", 2)),
                int(p.get("matrix_coefficients", 2)), int(p.get("full_range_flag", 1)))
    return Opened(im, fmt, max(1, frames), nclx, layout.exif, max_pixels, data,
                  budget if budget is not None else DecodeBudget(source_bytes=len(data)), layout.scans)


_TRANSPOSED = (5, 6, 7, 8)  # EXIF orientations that swap width and height


def orientation(im: Image.Image, has_exif: bool = True) -> int:
    if not has_exif:
        return 1
    try:
        return int(im.getexif().get(0x0112, 1) or 1)
    except Exception:  # noqa: BLE001 - unreadable EXIF: shown as stored by viewers too
        return 1


def oriented_size(im: Image.Image) -> tuple[int, int]:
    w, h = im.size
    return (h, w) if orientation(im) in _TRANSPOSED else (w, h)


_DEEP = ("I;16", "I;16B", "I;16L", "I;16N", "I", "F")
_ALPHA = ("RGBA", "RGBa", "LA", "La", "PA")
_TOKEN = re.compile(r"[^A-Za-z0-9 ._+/-]")


def _label(s: str) -> str:
    """Safe in a response header: printable ASCII, no separators, short."""
    return _TOKEN.sub("", s)[:40].strip() or "ICC"


_BAND = 256  # rows converted at a time: the temporaries stay a band, not the image


def _bands(im: Image.Image):
    for y in range(0, im.height, _BAND):
        yield y, np.asarray(im.crop((0, y, im.width, min(im.height, y + _BAND))))


def _to_8bit(im: Image.Image) -> Image.Image:
    """16/32-bit integer or float samples -> 8-bit L, scaled (Pillow's convert would clip at 255),
    a band of rows at a time (whole-image numpy temporaries held ~14 bytes a pixel)."""
    mode = im.mode
    out = np.empty((im.height, im.width), np.uint8)
    if mode == "F":
        peak = max((float(np.nanmax(b, initial=0)) for _, b in _bands(im)), default=0.0)
        scale = 255.0 if peak <= 1.0 else 1.0
        for y, b in _bands(im):
            out[y:y + len(b)] = np.clip(np.nan_to_num(b) * scale + 0.5, 0, 255).astype(np.uint8)
        return Image.fromarray(out)
    top = 65535 if mode.startswith("I;16") else (
        65535 if max((int(b.astype(np.uint32).max(initial=0)) for _, b in _bands(im)), default=0) > 255 else 255)
    for y, b in _bands(im):
        a = b.astype(np.uint32)
        out[y:y + len(b)] = np.clip((a * 255 + top // 2) // top if top != 255 else a, 0, 255).astype(np.uint8)
    return Image.fromarray(out)


def _icc_mode(im: Image.Image) -> str:
    m = im.mode
    return {"RGBA": "RGB", "RGBa": "RGB", "P": "RGB", "PA": "RGB", "LA": "L", "La": "L", "1": "L"}.get(
        m, "L" if m in _DEEP else m)


def colour_reason(im: Image.Image, nclx) -> str | None:
    """A description when the pixels are not sRGB as engines would read them (no pixels needed)."""
    icc = im.info.get("icc_profile")
    if icc:
        t, desc = colour.icc_transform(icc, _icc_mode(im))
        if t is not None:
            return "icc:" + _label(desc)
        if desc:
            return None  # sRGB in effect: an nclx box beside it is not consulted
    if colour.needs_nclx(nclx) and _icc_mode(im) in ("RGB", "L"):
        return colour.describe_nclx(nclx)
    return None


def static_reasons(op: Opened) -> list[str]:
    """Why the original bytes cannot go to the engine, known without decoding pixels."""
    im = op.im
    reasons = []
    if op.format in ALWAYS_CONVERT:
        reasons.append("format:" + op.format)
    if op.frames > 1:  # HEIF: several top-level images; the primary one is what viewers show
        reasons.append(f"images:primary-of-{op.frames}" if op.format == "heif" else f"frames:first-of-{op.frames}")
    o = orientation(im, op.exif)
    if o != 1:
        reasons.append(f"orientation:{o}")
    depth = im.info.get("bit_depth")  # pillow-heif: 10/12-bit samples, delivered as 8-bit
    if isinstance(depth, int) and depth > 8:
        reasons.append(f"{depth}-bit")
    if im.mode in _DEEP:
        reasons.append("16-bit" if im.mode.startswith("I;16") else f"mode:{im.mode}")
    elif im.mode not in ("RGB", "L", "P", "1") + _ALPHA:
        reasons.append(f"mode:{im.mode}")  # CMYK, YCbCr, LAB, HSV
    c = colour_reason(im, op.nclx)
    if c:
        reasons.append(c)
    return reasons


def to_srgb(im: Image.Image, icc: bytes | None, nclx) -> tuple[Image.Image, list[str]]:
    """Any loaded image -> 8-bit sRGB RGB, and what was converted (colour, alpha)."""
    conv: list[str] = []
    if im.mode in _DEEP:
        im = _to_8bit(im)
    if im.mode in ("P", "PA"):
        im = im.convert("RGBA" if ("transparency" in im.info or im.mode == "PA") else "RGB")
    elif im.mode in ("L", "RGB") and "transparency" in im.info:
        im = im.convert("LA" if im.mode == "L" else "RGBA")
    alpha = None
    if im.mode == "RGBA" and not icc and not colour.needs_nclx(nclx):
        # nothing to convert beneath the alpha: composited straight from the RGBA pixels (the
        # same numbers as through an RGB copy and a separate alpha band, 5 bytes a pixel less)
        if im.getextrema()[3][0] < 255:
            white = Image.new("RGB", im.size, (255, 255, 255))
            white.paste(im, None, im)
            return white, ["alpha:white"]
        return im.convert("RGB"), conv
    if im.mode in _ALPHA:
        alpha = im.getchannel("A") if im.mode in ("RGBA", "LA") else im.convert("RGBA").getchannel("A")
        im = im.convert("L" if im.mode in ("LA", "La") else "RGB")
    if im.mode not in ("RGB", "L", "CMYK"):
        im = im.convert("L" if im.mode == "1" else "RGB")
    converted = False
    if icc:
        out, desc = colour.icc_to_srgb(im, icc)
        if desc is not None:
            im, converted = out, True
            conv.append("icc:" + _label(desc))
    if not converted and colour.needs_nclx(nclx) and im.mode in ("RGB", "L"):
        im = colour.nclx_to_srgb(im, nclx)
        conv.append(colour.describe_nclx(nclx))
    if im.mode != "RGB":
        im = im.convert("RGB")  # L; CMYK without a profile: Pillow's naive formula
    if alpha is not None and alpha.getextrema()[0] < 255:
        # Image.composite(im, white, alpha), without the copy of white it makes
        white = Image.new("RGB", im.size, (255, 255, 255))
        white.paste(im, None, alpha)
        im = white
        conv.append("alpha:white")
    return im, conv


@dataclass(slots=True)
class Decoded:
    image: Image.Image  # RGB, upright, sRGB (RGBX or L from the libvips PNG path: vips.rgb())
    scale: float = 1.0  # source px per decoded px (JPEG DCT scaling)
    conversions: list[str] = field(default_factory=list)
    frames: int = 1


def _guard(fmt: str, fn):
    try:
        return fn()
    except (ImageError, GatewayError):  # a refusal, or the process's media bound (503)
        raise
    except (MemoryError, Image.DecompressionBombError):
        raise ImageError("the image is too large to decode", "image_too_large") from None
    except Exception as e:  # noqa: BLE001 - any library failure on hostile bytes is a corrupt image
        raise ImageError(f"the {fmt.upper()} data is corrupt or truncated ({str(e)[:80]})",
                         "image_corrupt") from None


def _what(op: Opened, im: Image.Image) -> str:
    return f"{im.width}x{im.height} {op.format.upper()} image"


def _plain(im: Image.Image) -> bool:
    """Sent as it came once verified (``verify``): nothing to convert."""
    return im.mode in ("RGB", "L", "1", "P") and "transparency" not in im.info


def _loaded(op: Opened, im: Image.Image, held: int, after: str, rotate: bool, verifying: bool = False) -> None:
    """After ``im.load()``: the real size against the pixel limit, and the memory need of
    what was really decoded (some decoders, HEIF, settle the size only now), before any
    conversion copies it."""
    check_size(op.format, *im.size, op.max_pixels)
    plain = verifying and _plain(im)
    now = memory.need(op.format, im, op.nclx, after="check" if plain else after, rotate=rotate, convert=not plain)
    if now > held:
        op.budget.need(now - held, _what(op, im))


def decode_opened(op: Opened, draft_size: tuple[int, int] | None = None,
                  reasons: list[str] | None = None, after: str = "rewrite") -> Decoded:
    """First frame, decoded, upright, sRGB. ``draft_size`` (as stored, before EXIF
    rotation) lets JPEG decode with DCT scaling to no less than that size. Its memory is
    counted first (``memory.need``, ``after``: what follows at the decoded size)."""
    def run() -> Decoded:
        im = op.im
        if op.frames > 1 and op.format != "heif":
            im.seek(0)  # the first frame: the documented rule for animations and pages
        why = static_reasons(op) if reasons is None else list(reasons)
        icc = im.info.get("icc_profile")
        orient = orientation(im, op.exif)
        stored_w = im.width
        what = _what(op, im)
        coefficients = memory.jpeg_coefficients(im, op.scans) if op.format == "jpeg" else 0
        if draft_size is not None and op.format == "jpeg":
            im.draft(None, draft_size)
        if op.format == "png" and not why and orient == 1 and op.data and vips.plain_png(im):
            # libspng: faster, and scales over threads; plain sRGB pixels, nothing to convert
            op.budget.need(memory.need(op.format, im, op.nclx, vips_png=True, after=after), what)
            return Decoded(vips.decode_png(op.data, im.size), 1.0, [], op.frames)
        held = memory.need(op.format, im, op.nclx, after=after, rotate=orient != 1, coefficients=coefficients)
        op.budget.need(held, what)
        im.load()
        _loaded(op, im, held, after, orient != 1)
        scale = stored_w / im.width
        if orient != 1:
            im = ImageOps.exif_transpose(im)
        rgb, conv = to_srgb(im, icc, op.nclx)
        return Decoded(rgb, scale, why + [c for c in conv if c not in why], op.frames)
    return _guard(op.format, run)


def verify(op: Opened) -> Decoded | None:
    """Decode an image that is within budget. None: it is valid and engines read it as
    a viewer shows it, so the original bytes may go. Otherwise the converted image."""
    reasons = static_reasons(op)
    if reasons:
        return decode_opened(op, reasons=reasons, after="convert")
    im = op.im

    def run() -> Decoded | None:
        if op.format == "jpeg":  # every scan entropy-decoded, IDCT at 1/8: the cheap full check
            coefficients, what = memory.jpeg_coefficients(im, op.scans), _what(op, im)
            im.draft(None, (max(1, im.width // 8), max(1, im.height // 8)))
            op.budget.need(memory.need(op.format, im, op.nclx, coefficients=coefficients), what)
            im.load()
            return None
        if op.format == "png" and im.mode in ("RGB", "L", "P", "1") and "transparency" not in im.info:
            # the capped scan already checked every PNG chunk's CRC and IEND: truncation and
            # corruption are caught without inflating (see docs/benchmarks/images.md). A GIF's
            # blocks carry no checksum, so a GIF is decoded (LZW is cheap at these sizes).
            return None
        # what is sent as it came is only decoded; the rest is converted at its own size
        plain = _plain(im)
        held = memory.need(op.format, im, op.nclx, after="check" if plain else "convert", convert=not plain)
        op.budget.need(held, _what(op, im))
        im.load()
        _loaded(op, im, held, "convert", False, verifying=True)
        if im.mode in ("RGB", "L", "1") and "transparency" not in im.info:
            return None
        if im.mode == "P" and "transparency" not in im.info:
            return None
        rgb, conv = to_srgb(im, im.info.get("icc_profile"), op.nclx)
        return Decoded(rgb, 1.0, conv, op.frames) if conv else None
    return _guard(op.format, run)


def decode(data: bytes, fmt: str, draft_size: tuple[int, int] | None = None,
           max_pixels: int = 64_000_000) -> tuple[Image.Image, float]:
    """Full decode to RGB, upright, sRGB, and the scale the decode applied."""
    d = decode_opened(open_checked(data, fmt, max_pixels), draft_size)
    return vips.rgb(d.image), d.scale


def open_image(data: bytes, fmt: str) -> Image.Image:
    return _open(data, fmt)
