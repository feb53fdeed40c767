"""Cheap structural scans that run before any image library parses the bytes.

Pillow walks some container structures in Python, one block at a time: JPEG fill
bytes and marker segments, PNG chunks, GIF sub-blocks, TIFF IFD chains, RLE BMP
runs. A crafted file of a few MB made of tiny blocks costs seconds of CPU there
(measured with Pillow 13 on this project's 2-core machine: 12 MB of empty PNG
chunks 4.9 s to open, 12 MB of chunks after the pixel data 2.9 s to load, 10 MB of
JPEG fill bytes 4.9 s, 10 MB of GIF comment sub-blocks 1.6 s and 470 MB, counting
the pages of a 20,000-IFD TIFF 3.7 s, 10 MB of RLE8 runs 3.9 s). These scans walk
the same structures with a hard cap on the number of blocks (cost = O(min(blocks,
cap)), a few slice operations per block), refuse degenerate or truncated files,
and return what a decoder should not have to discover by walking: the frame or
page count, the canvas a GIF's frames really need, the ISOBMFF item count (tiles
of an AVIF/HEIF grid) and its ``nclx`` colour description; the AVIF/HEIF grid layout
and coded sizes are checked by ``isobmff.py``.

Errors are ``ImageError`` (``image_corrupt``, ``image_too_large`` or
``image_too_complex``), like every other decode refusal.
"""

from __future__ import annotations

import re
import struct
import zlib
from dataclasses import dataclass

from . import isobmff
from .errors import ImageError

# Caps: far above what encoders write (noted beside each), far below what costs seconds.
MAX_JPEG_SEGMENTS = 2048  # marker segments before the first scan (a 16 MB ICC profile needs 256)
MAX_JPEG_FILL = 1024  # 0xFF fill bytes in total (Pillow reads them one per loop)
# progressive scans: libjpeg makes 10, mozjpeg about 20. Each scan costs a pass over the
# coefficients even when it carries no data (measured: 2.8 ms per empty scan at 16 MP), so
# the cap shrinks with the image: 128 up to 4 MP, then 128 * 4 MP / pixels, never below 32.
MAX_JPEG_SCANS = 128
MIN_JPEG_SCANS = 32
MAX_TIFF_TAGS = 4096  # entries of the first IFD (Pillow parses them in Python; real files have < 100)
MAX_TIFF_VALUES = 1 << 18  # numeric tag values of the first IFD, unpacked into Python tuples by Pillow
MAX_PNG_CHUNKS = 65536  # a 20 MB PNG in libpng's 8 KB IDAT chunks has 2,560
MAX_GIF_BLOCKS = 262144  # data sub-blocks: a 20 MB GIF in full 255-byte sub-blocks has 82,000
MAX_GIF_FRAMES = 10000
MAX_TIFF_PAGES = 1024
MAX_TIFF_STRIPS = 32768  # strips or tiles of the first page (Pillow makes one tile per strip)
MAX_TIFF_TILE_PIXELS = 1 << 20  # a tile larger than 4x its image must stay under this (1024x1024)
MAX_BMP_RLE_BYTES = 256 * 1024  # RLE BMPs are decoded by a Python loop (~0.4 us per byte)
MAX_ISOBMFF_ITEMS = 1000  # items of an AVIF/HEIF file (tiles of a grid): libheif's own default
MAX_ISOBMFF_BOXES = 4096

_FILL = re.compile(rb"\xff*")


@dataclass(slots=True)
class Layout:
    """What the scan learnt. ``width``/``height``: the canvas the first frame needs
    when the container says so (GIF), else None (the header or the library knows)."""

    frames: int = 1
    width: int | None = None
    height: int | None = None
    # (colour_primaries, transfer_characteristics, matrix_coefficients, full_range) of an ISOBMFF 'colr' nclx box
    nclx: tuple[int, int, int, int] | None = None
    items: int = 0
    scans: int = 1  # JPEG: scan headers (more than one: libjpeg buffers every coefficient)
    # False when the container has no EXIF (a PNG without eXIf): orientation is 1 without
    # asking Pillow, whose PNG getexif() decodes the whole image to look for a late chunk
    exif: bool = True


def _corrupt(fmt: str, what: str) -> ImageError:
    return ImageError(f"the {fmt.upper()} data is corrupt or truncated ({what})", "image_corrupt")


def _complex(fmt: str, what: str) -> ImageError:
    return ImageError(f"the {fmt.upper()} file {what}; re-save it as PNG or JPEG", "image_too_complex")


def _jpeg(data: bytes) -> Layout:
    n = len(data)
    i, segments, fill, pixels = 2, 0, 0, 0
    while True:
        if i >= n:
            raise _corrupt("jpeg", "ends before its image data")
        if data[i] != 0xFF:
            raise _corrupt("jpeg", "bytes between markers")
        j = _FILL.match(data, i + 1).end()
        fill += j - i - 1
        if fill > MAX_JPEG_FILL:
            raise _complex("jpeg", f"has more than {MAX_JPEG_FILL} fill bytes between markers")
        if j >= n:
            raise _corrupt("jpeg", "ends inside a marker")
        marker = data[j]
        i = j + 1
        if marker == 0xD8 or marker == 0x01 or 0xD0 <= marker <= 0xD7:
            continue  # markers without a length
        if marker in (0x00, 0xD9):
            raise _corrupt("jpeg", "no image data")
        if i + 2 > n:
            raise _corrupt("jpeg", "ends inside a marker")
        length = (data[i] << 8) | data[i + 1]
        if length < 2 or i + length > n:
            raise _corrupt("jpeg", "a marker segment runs past the end")
        if marker == 0xDA:
            break
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC) and length >= 7:
            pixels = max(pixels, ((data[i + 3] << 8) | data[i + 4]) * ((data[i + 5] << 8) | data[i + 6]))
        i += length
        segments += 1
        if segments > MAX_JPEG_SEGMENTS:
            raise _complex("jpeg", f"has more than {MAX_JPEG_SEGMENTS} marker segments")
    # In entropy-coded data 0xFF is always followed by 0x00 or RSTn, so every FFDA
    # from here on is a scan header (or sits in a segment: an upper bound either way).
    scans = data.count(b"\xff\xda", i - 2)
    cap = max(MIN_JPEG_SCANS, min(MAX_JPEG_SCANS, MAX_JPEG_SCANS * 4_000_000 // max(1, pixels)))
    if scans > cap:
        raise _complex("jpeg", f"has {scans} scans (more than {cap} at this size)")
    return Layout(scans=scans)


def _png(data: bytes, crc: bool) -> Layout:
    n = len(data)
    mv = memoryview(data)
    i, chunks, exif, animated, fctl = 8, 0, False, False, 0
    while True:
        if i + 8 > n:
            raise _corrupt("png", "no IEND chunk: the file is truncated")
        length = int.from_bytes(data[i:i + 4], "big")
        kind = data[i + 4:i + 8]
        end = i + 12 + length
        if length > 0x7FFFFFFF or end > n:
            raise _corrupt("png", f"the {kind.decode('latin-1')!r} chunk runs past the end")
        if crc and zlib.crc32(mv[i + 4:end - 4]) != int.from_bytes(data[end - 4:end], "big"):
            raise _corrupt("png", f"CRC mismatch in the {kind.decode('latin-1')!r} chunk")
        chunks += 1
        if kind == b"IEND":
            break
        if kind == b"acTL":
            animated = True
        elif kind == b"fcTL":
            fctl += 1
        elif kind == b"eXIf":
            exif = True
        if chunks > MAX_PNG_CHUNKS:
            raise _complex("png", f"has more than {MAX_PNG_CHUNKS} chunks")
        i = end
    # an APNG has as many frames as fcTL chunks (acTL's count is only a claim)
    return Layout(frames=max(1, fctl) if animated else 1, exif=exif)


def _gif(data: bytes, max_pixels: int) -> Layout:
    n = len(data)
    if n < 13:
        raise _corrupt("gif", "header")
    sw, sh = struct.unpack_from("<HH", data, 6)
    flags = data[10]
    i = 13 + ((3 << ((flags & 7) + 1)) if flags & 0x80 else 0)
    frames, blocks = 0, 0
    first: tuple[int, int] | None = None

    def sub_blocks(i: int) -> int:
        nonlocal blocks
        while True:
            if i >= n:
                raise _corrupt("gif", "ends inside a data block")
            size = data[i]
            i += 1 + size
            if size == 0:
                return i
            blocks += 1
            if blocks > MAX_GIF_BLOCKS:
                raise _complex("gif", f"has more than {MAX_GIF_BLOCKS} data blocks")

    while i < n:
        b = data[i]
        if b == 0x3B:  # trailer
            break
        if b == 0x21:  # extension: label, then sub-blocks
            i = sub_blocks(i + 2)
        elif b == 0x2C:  # image descriptor
            if i + 10 > n:
                raise _corrupt("gif", "ends inside an image descriptor")
            x, y, w, h = struct.unpack_from("<HHHH", data, i + 1)
            f = data[i + 9]
            i += 10 + ((3 << ((f & 7) + 1)) if f & 0x80 else 0)
            i = sub_blocks(i + 1)  # LZW minimum code size, then the data
            # Pillow grows the canvas to hold a frame placed outside the logical screen:
            # the real size is the union, whatever the header says.
            cw, ch = max(sw, x + w), max(sh, y + h)
            if cw * ch > max_pixels:
                raise ImageError(f"a GIF frame needs a {cw}x{ch} canvas = {cw * ch / 1e6:.1f} megapixels, above the "
                                 f"limit of {max_pixels / 1e6:g} megapixels", "image_too_large")
            if first is None:
                first = (cw, ch)
            frames += 1
            if frames > MAX_GIF_FRAMES:
                raise _complex("gif", f"has more than {MAX_GIF_FRAMES} frames")
        else:
            if frames:
                break  # junk after the last frame: decoders stop there too
            raise _corrupt("gif", "unknown block before the first frame")
    if first is None:
        raise _corrupt("gif", "no image frame")
    return Layout(frames=frames, width=first[0], height=first[1])


# TIFF types Pillow unpacks into tuples of Python numbers -> values per count
_TIFF_NUMERIC = {3: 1, 4: 1, 5: 2, 8: 1, 9: 1, 10: 2, 11: 1, 12: 1, 16: 1, 17: 1, 18: 1}


_TIFF_DIMS = (256, 257, 322, 323)  # ImageWidth, ImageLength, TileWidth, TileLength


def _tiff_tiles(dims: dict[int, int]) -> None:
    """libtiff allocates (and touches) one whole tile before decoding into it, whatever the
    image's size: a 64x64 image may declare 32768x32768 tiles (a 1 GB buffer from a 2 KB
    file). A tile may exceed its image (a 64x64 image in one 256x256 tile is normal), by a
    bounded amount. (Strips are safe: libtiff clamps RowsPerStrip to the image's height.)"""
    tw, th = dims.get(322, 0), dims.get(323, 0)
    if tw and th:
        w, h = dims.get(256, 0), dims.get(257, 0)
        if tw * th > max(4 * w * h, MAX_TIFF_TILE_PIXELS):
            raise _complex("tiff", f"declares {tw}x{th} tiles for a {w}x{h} image")


def _tiff(data: bytes) -> Layout:
    n = len(data)
    e = "<" if data[:2] == b"II" else ">"
    try:
        (off,) = struct.unpack_from(e + "I", data, 4)
        seen: set[int] = set()
        pages = 0
        while off:
            if off in seen:
                break  # a loop in the chain: Pillow stops there as well
            seen.add(off)
            pages += 1
            if pages > MAX_TIFF_PAGES:
                raise _complex("tiff", f"has more than {MAX_TIFF_PAGES} pages")
            (count,) = struct.unpack_from(e + "H", data, off)
            end = off + 2 + 12 * count
            if count == 0 or end + 4 > n:
                raise _corrupt("tiff", "an IFD runs past the end")
            if pages == 1:
                if count > MAX_TIFF_TAGS:
                    raise _complex("tiff", f"has {count} tags in its first IFD (more than {MAX_TIFF_TAGS})")
                values = 0
                dims: dict[int, int] = {}
                for i, (tag, typ, cnt) in enumerate(struct.iter_unpack(e + "HHI4x", data[off + 2:end])):
                    if tag in (273, 324) and cnt > MAX_TIFF_STRIPS:  # StripOffsets, TileOffsets
                        raise _complex("tiff", f"has {cnt} strips or tiles (more than {MAX_TIFF_STRIPS})")
                    if typ in _TIFF_NUMERIC:
                        values += cnt * _TIFF_NUMERIC[typ]
                    if tag in _TIFF_DIMS and cnt == 1 and typ in (3, 4):  # SHORT or LONG, held in the entry
                        (dims[tag],) = struct.unpack_from(e + ("H" if typ == 3 else "I"), data, off + 2 + 12 * i + 8)
                if values > MAX_TIFF_VALUES:
                    raise _complex("tiff", f"has {values} numeric tag values (more than {MAX_TIFF_VALUES})")
                _tiff_tiles(dims)
            (off,) = struct.unpack_from(e + "I", data, end)
    except struct.error:
        raise _corrupt("tiff", "an IFD offset points past the end") from None
    return Layout(frames=pages)


def _bmp(data: bytes) -> Layout:
    if len(data) < 34:
        raise _corrupt("bmp", "header")
    (header_size,) = struct.unpack_from("<I", data, 14)
    if header_size >= 40:
        (compression,) = struct.unpack_from("<I", data, 30)
        (offset,) = struct.unpack_from("<I", data, 10)
        if compression in (1, 2) and len(data) - offset > MAX_BMP_RLE_BYTES:
            raise _complex("bmp", f"is run-length encoded and larger than {MAX_BMP_RLE_BYTES // 1024} KB")
    return Layout()


def _webp(data: bytes) -> Layout:
    (riff,) = struct.unpack_from("<I", data, 4)
    if riff + 8 > len(data):
        raise _corrupt("webp", "the RIFF container is truncated")
    return Layout()


# -- ISOBMFF (AVIF, HEIF) ----------------------------------------------------------------

def _boxes(data: bytes, start: int, end: int, budget: list[int], fmt: str):
    """(type, payload start, box end) of the boxes in data[start:end]."""
    i = start
    while i + 8 <= end:
        budget[0] -= 1
        if budget[0] < 0:
            raise _complex(fmt, f"has more than {MAX_ISOBMFF_BOXES} boxes")
        size, kind = struct.unpack_from(">I4s", data, i)
        head = 8
        if size == 1:
            if i + 16 > end:
                raise _corrupt(fmt, "a box header is truncated")
            (size,) = struct.unpack_from(">Q", data, i + 8)
            head = 16
        elif size == 0:
            size = end - i
        if size < head or i + size > end:
            raise _corrupt(fmt, f"the {kind.decode('latin-1')!r} box runs past the end")
        yield kind, i + head, i + size
        i += size


def _isobmff(data: bytes, fmt: str, max_pixels: int) -> Layout:
    budget = [MAX_ISOBMFF_BOXES]
    layout = Layout()
    meta = False
    children: list[tuple[bytes, int, int]] = []  # the meta box's
    props: list[tuple[bytes, int, int]] = []  # ipco's, in order (ipma names them by index)
    try:
        for kind, p, end in _boxes(data, 0, len(data), budget, fmt):
            if kind != b"meta" or meta:
                continue
            meta = True
            for k2, p2, e2 in _boxes(data, p + 4, end, budget, fmt):  # meta is a full box
                children.append((k2, p2, e2))
                if k2 == b"iinf":
                    version = data[p2]
                    layout.items = (struct.unpack_from(">H", data, p2 + 4)[0] if version == 0
                                    else struct.unpack_from(">I", data, p2 + 4)[0])
                elif k2 == b"iprp":
                    for k3, p3, e3 in _boxes(data, p2, e2, budget, fmt):
                        if k3 != b"ipco":
                            continue
                        for k4, p4, e4 in _boxes(data, p3, e3, budget, fmt):
                            props.append((k4, p4, e4))
                            if k4 == b"colr" and data[p4:p4 + 4] == b"nclx" and e4 - p4 >= 11 and layout.nclx is None:
                                prim, trc, mat = struct.unpack_from(">HHH", data, p4 + 4)
                                layout.nclx = (prim, trc, mat, data[p4 + 10] >> 7)
    except struct.error:
        raise _corrupt(fmt, "a box is truncated") from None
    if not meta and fmt == "heif":
        raise _corrupt(fmt, "no meta box")
    if layout.items > MAX_ISOBMFF_ITEMS:
        raise _complex(fmt, f"has {layout.items} items (tiles); the limit is {MAX_ISOBMFF_ITEMS}")
    isobmff.check(data, children, props, fmt, max_pixels)  # grids, tiles and coded sizes
    return layout


def scan(data: bytes, fmt: str, max_pixels: int, crc: bool = True) -> Layout:
    """Walk the container of ``data`` (format ``fmt`` from ``decode.sniff``) within the caps."""
    if fmt == "jpeg":
        return _jpeg(data)
    if fmt == "png":
        return _png(data, crc)
    if fmt == "gif":
        return _gif(data, max_pixels)
    if fmt == "tiff":
        return _tiff(data)
    if fmt == "bmp":
        return _bmp(data)
    if fmt == "webp":
        return _webp(data)
    if fmt in ("avif", "heif"):
        return _isobmff(data, fmt, max_pixels)
    return Layout()
