"""libvips for the two steps where it is measured faster than Pillow (docs/benchmarks/images.md):
PNG decode (libspng, GIL released: 2880x1800 screenshot 27 ms vs Pillow 42 ms on one core,
and Pillow's chunked PNG decode does not scale over threads) and the final filter of a
downscale (vips reduce, Catmull-Rom "cubic" = Pillow's BICUBIC family, 1.8 ms vs 4.7 ms for
960x540 -> 768x448). Everything else (checks, colour, trim, encode) stays in Pillow.

Only plain PNGs take the libvips decode: RGB or grey as Pillow opens them (8-bit, 1/2/4-bit
grey, and 16-bit RGB, whose samples Pillow and this path both reduce to their high byte),
no transparency, no colour profile, nothing ``decode.static_reasons`` would convert; the
structural scan (chunk CRCs, IEND, caps) and the size checks have already run on the
bytes. Anything else, or libvips missing, goes the Pillow way.

No copies between the two: libvips reads a Pillow image's own memory (Pillow exports it
through the Arrow C data interface: RGB as four bytes a pixel, the layout libvips then
reads as RGBX; a copy only for an image whose rows are not in one block, above Pillow's
16 MB block size), and hands its result back as a Pillow view of libvips' buffer. A
1920x1080 JPEG decode resized to 1568x896: 20 ms with the copies, 6 ms without
(docs/benchmarks/images.md). The threads libvips may use for one operation are set per
call (``threads``): the image stage gives one job more of them while cores are idle.
"""

from __future__ import annotations

import ctypes
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
    if v.format == "ushort" and v.bands == 3:
        v = v.cast("uchar", shift=True)  # 16-bit RGB: the high byte, as Pillow's RGB;16B unpacker keeps
    if (v.width, v.height) != size or v.format != "uchar" or v.bands not in (1, 3):
        raise ValueError(f"libvips read {v.width}x{v.height}x{v.bands} {v.format}, the header says {size}")
    mode = "L" if v.bands == 1 else "RGBX"
    buf = (v if v.bands == 1 else v.bandjoin(255)).write_to_memory()
    im = Image.frombuffer(mode, size, buf, "raw", mode, 0, 1)
    im._vips_pixels = buf  # noqa: SLF001 - resize() reads them back without a copy (_pixels)
    return im


class _ArrowArray(ctypes.Structure):
    pass


# the Arrow C data interface's ArrowArray (arrow.apache.org/docs/format/CDataInterface.html)
_ArrowArray._fields_ = [("length", ctypes.c_int64), ("null_count", ctypes.c_int64), ("offset", ctypes.c_int64),
                        ("n_buffers", ctypes.c_int64), ("n_children", ctypes.c_int64),
                        ("buffers", ctypes.POINTER(ctypes.c_void_p)),
                        ("children", ctypes.POINTER(ctypes.POINTER(_ArrowArray))), ("dictionary", ctypes.c_void_p),
                        ("release", ctypes.c_void_p), ("private_data", ctypes.c_void_p)]
_capsule = ctypes.pythonapi.PyCapsule_GetPointer
_capsule.restype = ctypes.c_void_p
_capsule.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _view(im: Image.Image):
    """(``im``'s own pixel memory as a buffer, what keeps it alive) or None. RGB, RGBX and L
    only: Pillow exports RGB as 4-byte pixels (fixed-size lists of 4 uint8), L as uint8."""
    export = getattr(im, "__arrow_c_array__", None)
    if export is None or im.mode not in ("RGB", "RGBX", "L"):
        return None
    try:
        schema, array = export()  # raises when the rows are not in one block
    except (ValueError, OSError):
        return None
    a = _ArrowArray.from_address(_capsule(array, b"arrow_array"))
    if a.n_children == 1:
        a = a.children[0].contents
    if a.n_buffers != 2 or a.offset != 0 or not a.buffers[1]:
        return None
    n = im.width * im.height * (1 if im.mode == "L" else 4)
    if a.length != n:
        return None
    return (ctypes.c_uint8 * n).from_address(a.buffers[1]), (im, schema, array)


def _pixels(im: Image.Image):
    """(``im``'s pixels for libvips, bands, what must stay alive while libvips reads them):
    the libvips decode's own buffer while the image is still the read-only view of it
    (Pillow copies on any in-place change and clears ``readonly``), else Pillow's own memory
    (``_view``), else a copy."""
    buf = getattr(im, "_vips_pixels", None)
    if buf is not None and im.readonly:
        return buf, BANDS[im.mode], None
    v = _view(im)
    if v is not None:
        return v[0], 1 if im.mode == "L" else 4, v[1]
    return im.tobytes(), BANDS[im.mode], None


def rgb(im: Image.Image) -> Image.Image:
    return im.convert("RGB") if im.mode in ("RGBX", "L") else im


BANDS = {"RGB": 3, "L": 1, "RGBX": 4}
MODES = {1: "L", 3: "RGB", 4: "RGBX"}


def threads(n: int) -> None:
    """Threads libvips may use for the operations started from now on (all of this process:
    libvips has one setting; the image stage sets it before each job's libvips work)."""
    if VIPS and n != pyvips.vips_lib.vips_concurrency_get():
        pyvips.vips_lib.vips_concurrency_set(max(1, n))


def resize(im: Image.Image, target: tuple[int, int], resample: str,
           box: tuple[int, int, int, int] | None = None) -> Image.Image:
    """``im`` (RGB, L, or RGBX as ``decode_png`` gives it; ``box``: only that part) resized to
    exactly ``target`` with libvips' reduce, read where it lies (``_pixels``). An RGB image
    comes back RGBX (Pillow's layout for RGB with the padding band libvips resized along:
    no copy; ``rgb()`` drops it, and the JPEG encoder reads RGBX as it is)."""
    buf, bands, keep = _pixels(im)
    v = pyvips.Image.new_from_memory(buf, im.width, im.height, bands, "uchar")
    if box is not None:
        v = v.crop(box[0], box[1], box[2] - box[0], box[3] - box[1])
    v = v.resize(target[0] / v.width, vscale=target[1] / v.height, kernel=KERNELS.get(resample, "cubic"))
    if (v.width, v.height) != target:  # rounding of the scale: never off by more than a pixel
        v = v.crop(0, 0, min(v.width, target[0]), min(v.height, target[1])).gravity(
            "north-west", target[0], target[1], extend="copy")
    out = v.write_to_memory()
    del keep  # libvips has read the source: its memory may go
    mode = MODES[bands]
    return Image.frombuffer(mode, target, out, "raw", mode, 0, 1)
