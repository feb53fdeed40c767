"""Two different byte strings with one XXH3 hash (64 and 128 bit, unseeded).

XXH3 accumulates each 8-byte word ``v`` of a stripe as ``acc[i^1] += v`` and
``acc[i] += lo32(v ^ s) * hi32(v ^ s)`` (``s`` the word of the public default
secret for that stripe and lane). A word whose low half equals the secret's makes
the product 0, so within one 1 KiB block two such words in the same lane of two
stripes can swap their high halves without changing any accumulator: the hash
stays, the bytes differ. This is why the gateway's content identity is
cryptographic.
"""

from __future__ import annotations

import io
import struct

from PIL import Image

# First 152 bytes of XXH3's published default secret (kSecret); stripe n, lane i
# uses the 8 bytes at 8 * (n + i).
K_SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364"
    "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49")
STRIPES = 12  # stripes 0..11 of a block: their words lie within K_SECRET


def twins(data: bytes, start: int, end: int) -> tuple[bytes, bytes]:
    """Two variants of ``data`` (length > 240) that differ in every full 1 KiB block
    inside [start, end) (never the last block) and share their XXH3 hashes: in
    stripe pairs (0,1), (2,3)... one variant puts 0xFF high halves first, the other
    0x00 first."""
    a, b = bytearray(data), bytearray(data)
    last_block = (len(data) - 1) // 1024  # the blocks before it are accumulated whole
    for blk in range(-(-start // 1024), min(end // 1024, last_block)):
        for s in range(0, STRIPES, 2):
            for lane in range(8):
                for stripe, hi_a, hi_b in ((s, 0xFFFFFFFF, 0), (s + 1, 0, 0xFFFFFFFF)):
                    off = blk * 1024 + stripe * 64 + lane * 8
                    k = 8 * (stripe + lane)
                    lo = struct.unpack_from("<I", K_SECRET, k)[0]
                    a[off:off + 8] = struct.pack("<II", lo, hi_a)
                    b[off:off + 8] = struct.pack("<II", lo, hi_b)
    return bytes(a), bytes(b)


def bmp_twins(width: int = 1280, height: int = 960) -> tuple[bytes, bytes]:
    """Two uncompressed BMPs with different pixels (complementary light/dark bands
    over most of the picture) and the same XXH3-128."""
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (128, 128, 128)).save(buf, "BMP")
    data = buf.getvalue()
    return twins(data, 1024, len(data))
