"""Distinct images at almost no CPU cost, so a load generator can send an image never
sent before with every request, for as long as a cell runs, without competing with the
gateway for the machine's cores.

- JPEG: quantisation steps 3-10 (zigzag) of each table go up by 0 or 1 after the bits of
  the variant number: every variant decodes to slightly other pixels from the same
  entropy-coded data, at the same decode cost. No bytes are re-encoded.
- PNG: the image is deflated once up to its last rows (a full flush), and each variant
  deflates only those rows with a block of a colour of its own: other pixels, the same
  decode cost.

Both keep the size, the format and the decode work of the base image, so the gateway's
rewrite, its tokens and the engine's work are those of the base, while neither the
gateway's caches nor the engine's multimodal/prefix caches can serve one from another.
"""

from __future__ import annotations

import struct
import zlib
from typing import Callable

PNG_SIG = b"\x89PNG\r\n\x1a\n"


def _segments(data: bytes):
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            return
        marker = data[i + 1]
        if marker == 0xDA:  # start of scan: entropy-coded data follows
            return
        (length,) = struct.unpack_from(">H", data, i + 2)
        yield marker, i + 4, i + 2 + length
        i += 2 + length


def jpeg_variants(data: bytes) -> Callable[[int], bytes]:
    """``make(i)`` -> the JPEG with quantisation steps shifted by the digits of ``i``."""
    slots = []  # byte offsets of 8-bit quantisation values to vary
    for marker, start, end in _segments(data):
        if marker != 0xDB:
            continue
        j = start
        while j < end:
            pq = data[j] >> 4
            if pq != 0:
                raise ValueError("16-bit quantisation tables are not varied")
            slots += list(range(j + 1 + 3, j + 1 + 11))  # AC steps 3-10 in zigzag order: +0 or +1
            j += 65
    if len(slots) < 3:
        raise ValueError("no quantisation table found")
    base = bytearray(data)

    def make(i: int) -> bytes:
        out = bytearray(base)
        n = i + 1
        for s in slots:
            n, d = divmod(n, 2)
            out[s] = min(255, base[s] + d)
        if n:
            raise ValueError(f"variant {i} is beyond the {2 ** len(slots) - 1} this image has")
        return bytes(out)

    return make


def _chunks(data: bytes):
    i = 8
    while i < len(data):
        (n,) = struct.unpack_from(">I", data, i)
        kind = data[i + 4:i + 8]
        yield kind, data[i + 8:i + 8 + n]
        i += 12 + n


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def png_variants(data: bytes, level: int = 6, tail_rows: int = 16) -> Callable[[int], bytes]:
    """``make(i)`` -> the PNG with its last rows stamped with ``i`` (8-bit RGB/RGBA/L)."""
    chunks = list(_chunks(data))
    ihdr = next(b for k, b in chunks if k == b"IHDR")
    w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", ihdr)
    if depth != 8 or interlace or ctype not in (0, 2, 6):
        raise ValueError("only 8-bit, non-interlaced grey/RGB/RGBA PNGs are varied")
    bpp = {0: 1, 2: 3, 6: 4}[ctype]
    stride = 1 + w * bpp
    raw = zlib.decompress(b"".join(b for k, b in chunks if k == b"IDAT"))
    cut = (h - tail_rows) * stride
    comp = zlib.compressobj(level)
    head = comp.compress(raw[:cut]) + comp.flush(zlib.Z_FULL_FLUSH)
    # the last rows as plain pixels (filter None), so a stamp changes only its own pixels
    import io
    from PIL import Image
    im = Image.open(io.BytesIO(data))
    px = im.crop((0, h - tail_rows, w, h)).tobytes()
    tail = bytearray(b"".join(b"\x00" + px[r * w * bpp:(r + 1) * w * bpp] for r in range(tail_rows)))
    before = b"".join(_chunk(k, b) for k, b in chunks if k not in (b"IDAT", b"IEND"))
    mid = (w // 2) * bpp + 1

    def make(i: int) -> bytes:
        t = bytearray(tail)
        n = i + 1
        pixel = bytes(((n * 37) % 256, (n * 101 + n // 256) % 256, (n * 7 + n // 65536) % 256, 255)[:bpp])
        stamp = pixel * min(64, w // 2)
        for r in range(tail_rows):
            t[r * stride + mid:r * stride + mid + len(stamp)] = stamp
        c = comp.copy()
        idat = head + c.compress(bytes(t)) + c.flush()
        return PNG_SIG + before + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")

    return make


def variants(data: bytes) -> Callable[[int], bytes]:
    return jpeg_variants(data) if data[:3] == b"\xff\xd8\xff" else png_variants(data)
