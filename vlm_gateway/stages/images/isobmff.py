"""What decoding the primary image of an AVIF/HEIF file asks for, read from its item
boxes before libavif or libheif sees them (called by ``structure.scan``).

A HEIF/AVIF image is an item: a coded picture (``av01``, ``hvc1``, ...) with an ``ispe``
property giving its size, or a derived one. A ``grid`` places rows x columns coded tiles
on an output canvas; an ``iovl`` overlays items on a canvas. The libraries decode every
tile at the size its bitstream codes and allocate the canvas the descriptor declares, so
a 41 KB file naming 900 tiles of 1448x1448 for a 7680x7680 canvas costs 1.9 gigapixels
of decoding (18 s of CPU, measured with libheif 1.23). The rules, for the primary item
and the items that are auxiliary to it (alpha), each a 400:

- a grid's canvas and every coded item within ``max_pixels`` (``image_too_large``);
- a grid names rows x columns tiles, all with one ``ispe`` size, that cover its canvas
  and no more than one tile beyond it in either direction: (columns - 1) x tile width <
  canvas width <= columns x tile width, and the same for rows (HEIF, ISO/IEC 23008-12
  6.6.2.3; libavif refuses other layouts already), and all its tiles together at most
  ``TILE_PIXELS_FACTOR`` x ``max_pixels`` (``image_corrupt`` / ``image_too_large``);
- an AV1 item codes no larger frame than its ``ispe`` declares (the sequence header's
  maximum frame size; libavif decodes the coded size, libheif already refuses it).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from .errors import ImageError

TILE_PIXELS_FACTOR = 2  # all tiles of a grid together, in units of the pixel limit
CODED = {b"av01", b"hvc1", b"hev1", b"avc1", b"j2k1", b"jpeg", b"vvc1", b"unci"}


def _corrupt(fmt: str, what: str) -> ImageError:
    return ImageError(f"the {fmt.upper()} data is corrupt or truncated ({what})", "image_corrupt")


@dataclass
class Items:
    primary: int = 0
    types: dict[int, bytes] = field(default_factory=dict)
    refs: dict[bytes, dict[int, list[int]]] = field(default_factory=dict)  # kind -> from -> to
    props: dict[int, list[int]] = field(default_factory=dict)  # item -> property indices (1-based)
    locations: dict[int, tuple[int, list[tuple[int, int]]]] = field(default_factory=dict)  # method, extents
    idat: tuple[int, int] = (0, 0)


def _children(data: bytes, start: int, end: int):
    """(type, payload start, end) of plain 32-bit boxes (``structure._boxes`` bounded them)."""
    i = start
    while i + 8 <= end:
        size, kind = struct.unpack_from(">I4s", data, i)
        if size < 8 or i + size > end:
            return
        yield kind, i + 8, i + size
        i += size


def _uint(data: bytes, i: int, n: int) -> int:
    return int.from_bytes(data[i:i + n], "big") if n else 0


def _iloc(data: bytes, p: int, e: int, items: Items) -> None:
    version = data[p]
    off_size, len_size = data[p + 4] >> 4, data[p + 4] & 15
    base_size = data[p + 5] >> 4
    idx_size = data[p + 5] & 15 if version in (1, 2) else 0
    i = p + 6
    count = _uint(data, i, 2 if version < 2 else 4)
    i += 2 if version < 2 else 4
    for _ in range(count):
        if i >= e:
            raise struct.error
        item = _uint(data, i, 2 if version < 2 else 4)
        i += 2 if version < 2 else 4
        method = 0
        if version in (1, 2):
            method = _uint(data, i, 2) & 15
            i += 2
        i += 2  # data reference index
        base = _uint(data, i, base_size)
        i += base_size
        n = _uint(data, i, 2)
        i += 2
        extents = []
        for _ in range(min(n, 64)):
            i += idx_size
            off = _uint(data, i, off_size)
            i += off_size
            ln = _uint(data, i, len_size)
            i += len_size
            extents.append((base + off, ln))
        items.locations[item] = (method, extents)


def read_items(data: bytes, meta: list[tuple[bytes, int, int]]) -> Items:
    """The item boxes of a ``meta`` box (its children: (type, payload start, end))."""
    items = Items()
    for kind, p, e in meta:
        if kind == b"pitm":
            items.primary = _uint(data, p + 4, 2 if data[p] == 0 else 4)
        elif kind == b"iinf":
            start = p + (6 if data[p] == 0 else 8)
            for k, q, f in _children(data, start, e):
                if k == b"infe" and data[q] >= 2:
                    n = 2 if data[q] == 2 else 4
                    items.types[_uint(data, q + 4, n)] = data[q + 4 + n + 2:q + 4 + n + 6]
        elif kind == b"iref":
            n = 2 if data[p] == 0 else 4
            for k, q, f in _children(data, p + 4, e):
                src = _uint(data, q, n)
                count = _uint(data, q + n, 2)
                to = [_uint(data, q + n + 2 + j * n, n) for j in range(count) if q + n + 2 + (j + 1) * n <= f]
                items.refs.setdefault(k, {}).setdefault(src, []).extend(to)
        elif kind == b"iprp":
            for k, q, f in _children(data, p, e):
                if k != b"ipma":
                    continue
                version, flags = data[q], _uint(data, q + 1, 3)
                count = _uint(data, q + 4, 4)
                i = q + 8
                for _ in range(count):
                    if i >= f:
                        break
                    n = 2 if version < 1 else 4
                    item = _uint(data, i, n)
                    i += n
                    assoc = data[i]
                    i += 1
                    wide = flags & 1
                    idx = []
                    for _ in range(assoc):
                        v = _uint(data, i, 2 if wide else 1)
                        i += 2 if wide else 1
                        idx.append(v & (0x7FFF if wide else 0x7F))
                    items.props.setdefault(item, []).extend(idx)
        elif kind == b"iloc":
            _iloc(data, p, e, items)
        elif kind == b"idat":
            items.idat = (p, e)
    return items


def _item_bytes(data: bytes, items: Items, item: int, limit: int = 1 << 16) -> bytes:
    """The first ``limit`` bytes of an item's data (its extents, in the file or in idat)."""
    method, extents = items.locations.get(item, (0, []))
    out = b""
    for off, ln in extents:
        if method == 1:
            base, end = items.idat
            off += base
        elif method != 0:
            return b""
        out += data[off:off + (ln or len(data))]
        if len(out) >= limit:
            break
    return out[:limit]


class _Bits:
    def __init__(self, b: bytes) -> None:
        self.b, self.i = b, 0

    def f(self, n: int) -> int:
        v = 0
        for _ in range(n):
            if self.i >= 8 * len(self.b):
                raise struct.error
            v = (v << 1) | ((self.b[self.i >> 3] >> (7 - (self.i & 7))) & 1)
            self.i += 1
        return v

    def uvlc(self) -> int:
        zeros = 0
        while not self.f(1):
            zeros += 1
            if zeros >= 32:
                return (1 << 32) - 1
        return self.f(zeros) + (1 << zeros) - 1


def _leb128(b: bytes, i: int) -> tuple[int, int]:
    v = 0
    for j in range(8):
        byte = b[i + j]
        v |= (byte & 0x7F) << (7 * j)
        if not byte & 0x80:
            return v, i + j + 1
    raise struct.error


def av1_max_frame(obus: bytes) -> tuple[int, int] | None:
    """(max frame width, height) from the first sequence header OBU in ``obus``, or None."""
    i = 0
    while i < len(obus):
        header = obus[i]
        kind, ext, has_size = (header >> 3) & 15, (header >> 2) & 1, (header >> 1) & 1
        i += 1 + ext
        if not has_size:
            size = len(obus) - i
        else:
            size, i = _leb128(obus, i)
        if kind == 1:
            return _sequence_header(obus[i:i + size])
        i += size
    return None


def _sequence_header(b: bytes) -> tuple[int, int]:
    r = _Bits(b)
    r.f(3)  # seq_profile
    r.f(1)  # still_picture
    if r.f(1):  # reduced_still_picture_header
        r.f(5)
    else:
        decoder_model = False
        buffer_delay_bits = 0
        if r.f(1):  # timing_info_present_flag
            r.f(32), r.f(32)
            if r.f(1):
                r.uvlc()
            decoder_model = bool(r.f(1))
            if decoder_model:
                buffer_delay_bits = r.f(5) + 1
                r.f(32), r.f(5), r.f(5)
        initial_delay = r.f(1)
        for _ in range(r.f(5) + 1):
            r.f(12)
            if r.f(5) > 7:
                r.f(1)
            if decoder_model and r.f(1):
                r.f(buffer_delay_bits), r.f(buffer_delay_bits), r.f(1)
            if initial_delay and r.f(1):
                r.f(4)
    wb, hb = r.f(4) + 1, r.f(4) + 1
    return r.f(wb) + 1, r.f(hb) + 1


def _ispe(data: bytes, props: list[tuple[bytes, int, int]], items: Items, item: int) -> tuple[int, int] | None:
    for idx in items.props.get(item, []):
        if 1 <= idx <= len(props) and props[idx - 1][0] == b"ispe":
            _, p, _ = props[idx - 1]
            return struct.unpack_from(">II", data, p + 4)
    return None


def _av1_config(data: bytes, props: list[tuple[bytes, int, int]], items: Items, item: int) -> bytes:
    for idx in items.props.get(item, []):
        if 1 <= idx <= len(props) and props[idx - 1][0] == b"av1C":
            _, p, e = props[idx - 1]
            return data[p + 4:e]  # configOBUs after the 4-byte header
    return b""


def check(data: bytes, meta: list[tuple[bytes, int, int]], props: list[tuple[bytes, int, int]], fmt: str,
          max_pixels: int) -> None:
    """Apply the module's rules to the primary item of the file (``meta``: the meta box's
    children, ``props``: the ipco properties in order)."""
    try:
        items = read_items(data, meta)
        if not items.primary:
            return
        aux = [src for src, to in items.refs.get(b"auxl", {}).items() if items.primary in to]
        for item in [items.primary, *aux]:
            _item(data, props, items, item, fmt, max_pixels, depth=0)
    except (struct.error, IndexError):
        raise _corrupt(fmt, "an item box is truncated") from None


def _too_large(fmt: str, what: str, w: int, h: int, max_pixels: int) -> ImageError:
    return ImageError(f"the {fmt.upper()} {what} is {w}x{h} = {w * h / 1e6:.1f} megapixels, above the limit of "
                      f"{max_pixels / 1e6:g} megapixels", "image_too_large")


def _item(data: bytes, props, items: Items, item: int, fmt: str, max_pixels: int, depth: int) -> int:
    """Pixels decoding ``item`` costs, after checking it (module docstring)."""
    kind = items.types.get(item, b"")
    if depth > 2:
        raise _corrupt(fmt, "derived images nest too deep")
    if kind == b"grid":
        return _grid(data, props, items, item, fmt, max_pixels, depth)
    if kind == b"iovl":
        raw = _item_bytes(data, items, item, 64)
        wide = raw[1] & 1
        n = 4 if wide else 2
        w, h = _uint(raw, 10, n), _uint(raw, 10 + n, n)
        if w * h > max_pixels:
            raise _too_large(fmt, "overlay canvas", w, h, max_pixels)
        return sum(_item(data, props, items, ref, fmt, max_pixels, depth + 1)
                   for ref in items.refs.get(b"dimg", {}).get(item, []))
    size = _ispe(data, props, items, item)
    if size is None:
        return 0  # the library refuses an item without a size
    w, h = size
    if w * h > max_pixels:
        raise _too_large(fmt, "image item", w, h, max_pixels)
    if kind == b"av01":
        coded = av1_max_frame(_av1_config(data, props, items, item)) or av1_max_frame(_item_bytes(data, items, item))
        if coded is not None and (coded[0] > w or coded[1] > h):
            raise _corrupt(fmt, f"an AV1 item codes frames of up to {coded[0]}x{coded[1]} for the {w}x{h} "
                                "its container declares")
    return w * h


def _grid(data: bytes, props, items: Items, item: int, fmt: str, max_pixels: int, depth: int) -> int:
    raw = _item_bytes(data, items, item, 64)
    if len(raw) < 8:
        raise _corrupt(fmt, "a grid without its descriptor")
    wide = raw[1] & 1
    rows, cols = raw[2] + 1, raw[3] + 1
    n = 4 if wide else 2
    w, h = _uint(raw, 4, n), _uint(raw, 4 + n, n)
    if w * h > max_pixels:
        raise _too_large(fmt, "grid canvas", w, h, max_pixels)
    tiles = items.refs.get(b"dimg", {}).get(item, [])
    if len(tiles) != rows * cols:
        raise _corrupt(fmt, f"a {cols}x{rows} grid names {len(tiles)} tiles")
    sizes = {_ispe(data, props, items, t) for t in tiles}
    if len(sizes) != 1 or None in sizes:
        raise _corrupt(fmt, "the tiles of a grid differ in size")
    (tw, th), = sizes
    if not ((cols - 1) * tw < w <= cols * tw and (rows - 1) * th < h <= rows * th):
        raise _corrupt(fmt, f"{cols}x{rows} tiles of {tw}x{th} do not tile the {w}x{h} canvas of the grid")
    total = 0
    seen: dict[tuple, int] = {}  # tiles sharing one location and size are checked once
    for t in tiles:
        key = (str(items.locations.get(t)), items.types.get(t), tuple(items.props.get(t, ())))
        if key not in seen:
            seen[key] = _item(data, props, items, t, fmt, max_pixels, depth + 1)
        total += seen[key]
        if total > TILE_PIXELS_FACTOR * max_pixels:
            raise ImageError(f"the {fmt.upper()} grid's {len(tiles)} tiles hold more than "
                             f"{TILE_PIXELS_FACTOR * max_pixels / 1e6:g} megapixels", "image_too_large")
    return total
