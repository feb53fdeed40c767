"""Synthetic test images (generated, nothing downloaded): photographic-like
JPEGs, screenshots with margins, every mode/format the decoder must handle and
the hostile cases it must refuse. Used by the tests and the benchmark."""

from __future__ import annotations

import functools
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


# -- modern formats, colour, animation ---------------------------------------------------

def avif(w: int = 1200, h: int = 800, quality: int = 80, **kw) -> bytes:
    """AVIF written by Pillow's own libavif support."""
    return save(Image.fromarray(photo_array(w, h)), "AVIF", quality=quality, **kw)


def heic(w: int = 1200, h: int = 800, quality: int = 80, image: Image.Image | None = None, **kw) -> bytes:
    """HEIC written by pillow-heif (libheif + x265)."""
    import pillow_heif  # noqa: F401 - registers the HEIF writer
    from pillow_heif import register_heif_opener
    register_heif_opener()
    return save(image if image is not None else Image.fromarray(photo_array(w, h)), "HEIF", quality=quality, **kw)


def heic_10bit(w: int = 640, h: int = 480) -> bytes:
    """A 10-bit HEIC from 16-bit samples (pillow-heif keeps 10 bits): a smooth ramp."""
    import pillow_heif
    a = np.zeros((h, w, 3), np.uint16)
    a[..., 0] = np.linspace(0, 65535, w, dtype=np.uint16)[None, :]
    a[..., 1] = np.linspace(0, 65535, h, dtype=np.uint16)[:, None]
    a[..., 2] = 30000
    hf = pillow_heif.from_bytes(mode="RGB;16", size=(w, h), data=a.tobytes())
    buf = io.BytesIO()
    hf.save(buf, quality=90)
    return buf.getvalue()


def frames(fmt: str, w: int = 640, h: int = 480, colours=((250, 0, 0), (0, 250, 0), (0, 0, 250)), **kw) -> bytes:
    """An animation in ``fmt`` (GIF, PNG = APNG, WEBP, AVIF): one flat colour per frame."""
    ims = [Image.new("RGB", (w, h), c) for c in colours]
    return save(ims[0], fmt, save_all=True, append_images=ims[1:], duration=100, loop=0, **kw)


def rgba_png(w: int = 600, h: int = 400, opaque: bool = False) -> bytes:
    """Black text-like bars on a transparent background (engines that drop alpha see black on black)."""
    im = Image.new("RGBA", (w, h), (0, 0, 0, 255 if opaque else 0))
    d = ImageDraw.Draw(im)
    for y in range(40, h - 40, 40):
        d.rectangle([40, y, w - 40, y + 12], fill=(0, 0, 0, 255) if not opaque else (255, 255, 255, 255))
    return save(im, "PNG")


def png16_rgb(w: int = 400, h: int = 300, rgb16=(60000, 20000, 5000)) -> bytes:
    """A 48-bit RGB PNG (Pillow cannot write one: IHDR bit depth 16, colour type 2, filter 0)."""
    row = b"\x00" + struct.pack(">HHH", *rgb16) * w
    return _png_chunks(struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0), zlib.compress(row * h))


def tiff16_gray(w: int = 500, h: int = 300) -> bytes:
    return save(Image.fromarray(np.tile(np.linspace(0, 65535, w, dtype=np.uint16), (h, 1))), "TIFF")


def _png_chunks(ihdr: bytes, idat: bytes, extra: bytes = b"") -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + extra + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def display_p3_icc() -> bytes:
    from vlm_gateway.stages.images.colour import PRIMARIES, icc_profile
    return icc_profile(PRIMARIES[12], description="Display P3 (generated)")


def p3_encode(srgb: tuple[int, int, int]) -> tuple[int, int, int]:
    """The Display P3 code values of an sRGB colour (numpy math, independent of LittleCMS)."""
    from vlm_gateway.stages.images.colour import PRIMARIES, srgb_decode, srgb_encode, to_srgb_matrix
    lin = srgb_decode(np.array(srgb, np.float64) / 255)
    p3 = np.linalg.inv(to_srgb_matrix(PRIMARIES[12])) @ lin
    return tuple(int(v) for v in np.rint(srgb_encode(p3) * 255))


def p3_tagged(fmt: str, srgb: tuple[int, int, int] = (250, 10, 10), w: int = 640, h: int = 480) -> bytes:
    """A flat image whose pixels are the Display P3 code values of ``srgb``, tagged Display P3:
    a colour-managed viewer shows ``srgb``; an engine reading raw numbers sees something else."""
    im = Image.new("RGB", (w, h), p3_encode(srgb))
    icc = display_p3_icc()
    if fmt == "HEIF":
        return heic(image=im, icc_profile=icc, quality=95)
    kw = {"quality": 95} if fmt in ("JPEG", "AVIF", "WEBP") else {}
    return save(im, fmt, icc_profile=icc, **kw)


def srgb_tagged_png(w: int = 400, h: int = 300) -> bytes:
    """Tagged with an sRGB profile: sRGB in effect, so it passes through untouched."""
    from PIL import ImageCms
    icc = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    return save(Image.fromarray(photo_array(w, h)), "PNG", icc_profile=icc)


def with_nclx(data: bytes, primaries: int | None = None, transfer: int | None = None) -> bytes:
    """The same AVIF/HEIF with its ``colr nclx`` box rewritten (pixels unchanged)."""
    i = data.index(b"colrnclx") + 8
    out = bytearray(data)
    if primaries is not None:
        out[i:i + 2] = struct.pack(">H", primaries)
    if transfer is not None:
        out[i + 2:i + 4] = struct.pack(">H", transfer)
    return bytes(out)


# -- ISOBMFF (AVIF/HEIF) crafting for the hostile corpus ---------------------------------

def _box(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", 8 + len(payload)) + kind + payload


def _full(kind: bytes, version: int, payload: bytes, flags: int = 0) -> bytes:
    return _box(kind, bytes([version]) + flags.to_bytes(3, "big") + payload)


def _children(data: bytes, start: int, end: int):
    i = start
    while i + 8 <= end:
        size, kind = struct.unpack_from(">I4s", data, i)
        head = 8
        if size == 1:
            (size,) = struct.unpack_from(">Q", data, i + 8)
            head = 16
        elif size == 0:
            size = end - i
        yield kind, i, i + head, i + size
        i += size


def _find(data: bytes, path: list[bytes], start: int = 0, end: int | None = None):
    end = len(data) if end is None else end
    for kind, at, p, e in _children(data, start, end):
        if kind == path[0]:
            if len(path) == 1:
                return at, p, e
            inner = p + 4 if kind in (b"meta", b"iinf", b"iref") else p
            return _find(data, path[1:], inner, e)
    raise KeyError(path)


def _primary_tile(data: bytes) -> tuple[bytes, bytes]:
    """(codec configuration box, coded bytes) of the primary item of a single-image file."""
    at, p, e = _find(data, [b"meta", b"iprp", b"ipco"])
    config = None
    for kind, a2, p2, e2 in _children(data, p, e):
        if kind in (b"av1C", b"hvcC"):
            config = data[a2:e2]
    _, p, e = _find(data, [b"meta", b"pitm"])
    primary = struct.unpack_from(">H", data, p + 4)[0]
    _, p, e = _find(data, [b"meta", b"iloc"])
    version = data[p]
    off_size, len_size = data[p + 4] >> 4, data[p + 4] & 15
    base_size, idx_size = data[p + 5] >> 4, (data[p + 5] & 15) if version in (1, 2) else 0
    count_fmt = ">H" if version < 2 else ">I"
    (count,) = struct.unpack_from(count_fmt, data, p + 6)
    i = p + 6 + struct.calcsize(count_fmt)

    def read(n: int) -> int:
        nonlocal i
        v = int.from_bytes(data[i:i + n], "big") if n else 0
        i += n
        return v
    for _ in range(count):
        item = read(2 if version < 2 else 4)
        if version in (1, 2):
            read(2)  # construction method
        read(2)  # data reference index
        base = read(base_size)
        extents = read(2)
        chunks = []
        for _ in range(extents):
            read(idx_size)
            off, ln = read(off_size), read(len_size)
            chunks.append(data[base + off:base + off + ln])
        if item == primary:
            assert config is not None
            return config, b"".join(chunks)
    raise KeyError("primary item")


def isobmff_grid(codec: str, cols: int, rows: int, tile: int = 64, canvas: tuple[int, int] | None = None,
                 coded: int | None = None) -> bytes:
    """A grid image of cols x rows tiles (AVIF: av01, HEIF: hvc1) whose tiles all point at one
    coded tile written by the library: a few KB that ask for cols*rows decodes. ``canvas``:
    the output size the grid declares (default: what the tiles cover); ``coded``: the size
    the tile's bitstream really codes (default: ``tile``, what its ``ispe`` declares)."""
    src = _flat_tile(codec, coded or tile)
    cw, ch = canvas or (cols * tile, rows * tile)
    config, coded = _primary_tile(src)
    n = cols * rows
    item_type = b"av01" if codec == "avif" else b"hvc1"
    brands = [b"avif", b"mif1", b"miaf"] if codec == "avif" else [b"heic", b"mif1", b"miaf"]
    ftyp = _box(b"ftyp", brands[0] + b"\0\0\0\0" + b"".join(brands))
    grid_desc = struct.pack(">BBBBHH", 0, 0, rows - 1, cols - 1, cw, ch)
    ids = list(range(2, n + 2))
    hdlr = _full(b"hdlr", 0, b"\0\0\0\0pict" + b"\0" * 12 + b"\0")
    pitm = _full(b"pitm", 0, struct.pack(">H", 1))
    infe = [_full(b"infe", 2, struct.pack(">HH4s", i, 0, t) + b"\0", flags=hidden)
            for i, t, hidden in [(1, b"grid", 0)] + [(i, item_type, 1) for i in ids]]  # tiles are hidden items
    iinf = _full(b"iinf", 0, struct.pack(">H", n + 1) + b"".join(infe))
    iref = _full(b"iref", 0, _box(b"dimg", struct.pack(">HH", 1, n) + b"".join(struct.pack(">H", i) for i in ids)))
    ispe = lambda w, h: _full(b"ispe", 0, struct.pack(">II", w, h))  # noqa: E731
    ipco = _box(b"ipco", ispe(cw, ch) + ispe(tile, tile) + config)
    ipma = _full(b"ipma", 0, struct.pack(">I", n + 1) + struct.pack(">HBB", 1, 1, 1)
                 + b"".join(struct.pack(">HBBB", i, 2, 2, 0x83) for i in ids))
    iprp = _box(b"iprp", ipco + ipma)
    idat = _box(b"idat", grid_desc)

    def iloc(mdat_payload: int) -> bytes:
        body = struct.pack(">BBH", 0x44, 0x00, n + 1)
        body += struct.pack(">HHHHII", 1, 1, 0, 1, 0, len(grid_desc))  # construction method 1: idat
        for i in ids:
            body += struct.pack(">HHHHII", i, 0, 0, 1, mdat_payload, len(coded))
        return _full(b"iloc", 1, body)

    def meta(mdat_payload: int) -> bytes:
        return _full(b"meta", 0, hdlr + pitm + iloc(mdat_payload) + iinf + iref + iprp + idat)
    head = len(ftyp) + len(meta(0)) + 8
    return ftyp + meta(head) + _box(b"mdat", coded)


def _flat_tile(codec: str, tile: int) -> bytes:
    if tile <= 256:
        return avif(tile, tile, quality=60) if codec == "avif" else heic(tile, tile, quality=60)
    return flat_avif(tile) if codec == "avif" else heic(image=Image.new("RGB", (tile, tile), (90, 120, 150)),
                                                        quality=30)


def flat_avif(side: int) -> bytes:
    """A flat side x side AVIF (fast to encode at any size)."""
    return save(Image.new("RGB", (side, side), (90, 120, 150)), "AVIF", quality=30, speed=10)


def with_ispe(data: bytes, w: int, h: int) -> bytes:
    """The same AVIF/HEIF declaring another size in every ``ispe`` box (pixels unchanged)."""
    out = bytearray(data)
    i = out.find(b"ispe")
    while i >= 0:
        out[i + 8:i + 16] = struct.pack(">II", w, h)
        i = out.find(b"ispe", i + 4)
    return bytes(out)


# -- hostile corpus: each entry must be refused quickly, within bounded memory ------------

def _gif(screen: tuple[int, int], frame_box: tuple[int, int, int, int], extensions: bytes = b"") -> bytes:
    x, y, w, h = frame_box
    return (b"GIF89a" + struct.pack("<HHBBB", *screen, 0, 0, 0) + extensions
            + b"," + struct.pack("<HHHHB", x, y, w, h, 0) + b"\x02\x02\x44\x01\x00;")


def gif_canvas_bomb(offset: int = 30000) -> bytes:
    """29 bytes: a 1x1 logical screen and a 1x1 frame placed at (offset, offset)."""
    return _gif((1, 1), (offset, offset, 1, 1))


def gif_small_canvas_bomb() -> bytes:
    """A 16x16 screen whose frame needs 9000x9000: within every budget by its header."""
    return _gif((16, 16), (8999, 8999, 1, 1))


def gif_comment_blocks(n: int = 2_000_000) -> bytes:
    return _gif((1, 1), (0, 0, 1, 1), b"!\xfe" + b"\x01a" * n + b"\x00")


def png_many_chunks(n: int = 500_000, after_idat: bool = False) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    junk = chunk(b"teXt" if not after_idat else b"abCd", b"") * n
    ihdr = struct.pack(">IIBBBBB", 8, 8, 8, 0, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 9 * 8)
    return _png_chunks(ihdr, idat, b"") if n == 0 else (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + (b"" if after_idat else junk) + chunk(b"IDAT", idat)
        + (junk if after_idat else b"") + chunk(b"IEND", b""))


def jpeg_fill_bytes(n: int = 5_000_000) -> bytes:
    j = save(Image.new("RGB", (8, 8)), "JPEG")
    return j[:2] + b"\xff" * n + j[2:]


def jpeg_second_sof(w: int = 60000, h: int = 60000) -> bytes:
    """A small JPEG with a second frame header declaring a huge size before the scan."""
    j = save(Image.new("RGB", (64, 64), (10, 20, 30)), "JPEG")
    i = j.index(b"\xff\xc0")
    length = struct.unpack_from(">H", j, i + 2)[0]
    sof = bytearray(j[i:i + 2 + length])
    sof[5:9] = struct.pack(">HH", h, w)
    return j[:i + 2 + length] + bytes(sof) + j[i + 2 + length:]


def jpeg_many_scans(n: int = 2000) -> bytes:
    """A progressive JPEG whose last scan is repeated ``n`` times (each scan is a pass over the image)."""
    j = save(Image.fromarray(photo_array(128, 128)), "JPEG", progressive=True, quality=80)
    last = j.rindex(b"\xff\xda")
    return j[:last] + j[last:-2] * n + b"\xff\xd9"


def tiff_ifd_chain(n: int = 20000) -> bytes:
    out = bytearray(b"II*\x00" + struct.pack("<I", 8))
    entries = [(256, 1), (257, 1), (258, 8), (259, 1), (262, 1), (273, 0), (277, 1), (278, 1), (279, 1)]
    size = 2 + 12 * len(entries) + 4
    for i in range(n):
        nxt = len(out) + size if i < n - 1 else 0
        out += struct.pack("<H", len(entries))
        for tag, val in entries:
            out += struct.pack("<HHII", tag, 4, 1, val) if tag in (273, 279) else struct.pack("<HHIHxx", tag, 3, 1, val)
        out += struct.pack("<I", nxt)
    return bytes(out)


def tiff_tag_flood(values: int = 2_000_000) -> bytes:
    """One small page whose first IFD carries an unknown tag of ``values`` SHORTs."""
    t = bytearray(tiff_ifd_chain(1))
    count = struct.unpack_from("<H", t, 8)[0]
    extra = struct.pack("<HHII", 65000, 3, values, len(t) + 12)
    t[8:10] = struct.pack("<H", count + 1)
    t = t[:10 + 12 * count] + extra + t[10 + 12 * count:]
    return bytes(t) + b"\0" * (2 * values)


def tiff_huge_tiles(tile: int = 32768, w: int = 64, h: int = 64) -> bytes:
    """A small deflate TIFF whose one tile is declared ``tile`` x ``tile``: libtiff allocates
    and zeroes the whole tile (1 GB at 32768) before it finds the data short."""
    payload = zlib.compress(b"\x00" * 4096)
    entries = [(256, 4, w), (257, 4, h), (258, 3, 8), (259, 3, 8), (262, 3, 1), (277, 3, 1),
               (322, 4, tile), (323, 4, tile), (324, 4, 0), (325, 4, len(payload))]
    data_off = 8 + 2 + 12 * len(entries) + 4
    out = b"II*\x00" + struct.pack("<I", 8) + struct.pack("<H", len(entries))
    for tag, typ, val in entries:
        val = data_off if tag == 324 else val
        out += struct.pack("<HHI", tag, typ, 1) + (struct.pack("<HH", val, 0) if typ == 3 else struct.pack("<I", val))
    return out + struct.pack("<I", 0) + payload


def jpeg_empty_scans(n: int = 200, side: int = 1024) -> bytes:
    """A progressive JPEG followed by ``n`` scan headers without data: each costs a pass."""
    j = save(Image.fromarray(photo_array(side, side)), "JPEG", progressive=True, quality=80)
    first = j.index(b"\xff\xda")
    hdr = j[first:first + 2 + int.from_bytes(j[first + 2:first + 4], "big")]
    return j[:-2] + hdr * n + b"\xff\xd9"


def tiff_ifd_loop() -> bytes:
    """Two IFDs pointing at each other."""
    t = bytearray(tiff_ifd_chain(2))
    size = 2 + 12 * 9 + 4
    struct.pack_into("<I", t, 8 + 2 * size - 4, 8)
    return bytes(t)


def bmp_rle(n: int = 2_000_000, w: int = 4000, h: int = 4000) -> bytes:
    data = b"\x01\x07" * n + b"\x00\x01"
    pal = b"\x00\x00\x00\x00" * 256
    off = 14 + 40 + len(pal)
    return (b"BM" + struct.pack("<IHHI", off + len(data), 0, 0, off)
            + struct.pack("<IiiHHIIiiII", 40, w, h, 1, 8, 1, len(data), 0, 0, 256, 0) + pal + data)


def webp_huge_canvas() -> bytes:
    """A small lossy WebP wrapped in a VP8X header declaring a 16384x16384 canvas."""
    w = save(Image.new("RGB", (16, 16), (1, 2, 3)), "WEBP")
    vp8 = w[12:]
    vp8x = b"VP8X" + struct.pack("<I", 10) + b"\0\0\0\0" + (16383).to_bytes(3, "little") * 2
    body = b"WEBP" + vp8x + vp8
    return b"RIFF" + struct.pack("<I", len(body)) + body


def truncated(data: bytes, keep: float = 0.5) -> bytes:
    return data[:max(16, int(len(data) * keep))]


@functools.lru_cache(maxsize=None)
def hostile() -> dict[str, tuple[bytes, set[str]]]:
    """name -> (bytes, acceptable error codes). Each must be refused, fast, in bounded memory."""
    from vlm_gateway.stages.images.decode import HEIF
    corrupt, large, cplx = {"image_corrupt"}, {"image_too_large"}, {"image_too_complex"}
    cases: dict[str, tuple[bytes, set[str]]] = {
        "png_bomb": (bomb_png(), large),
        "gif_canvas_bomb": (gif_canvas_bomb(), large),
        "gif_small_canvas_bomb": (gif_small_canvas_bomb(), large),
        "gif_comment_blocks": (gif_comment_blocks(), cplx),
        "png_many_chunks": (png_many_chunks(), cplx),
        "png_many_chunks_after_idat": (png_many_chunks(after_idat=True), cplx),
        "jpeg_fill_bytes": (jpeg_fill_bytes(), cplx),
        "jpeg_second_sof": (jpeg_second_sof(), large | corrupt),
        "jpeg_second_sof_100mp": (jpeg_second_sof(10000, 10000), large | corrupt),
        "jpeg_many_scans": (jpeg_many_scans(), cplx),
        "tiff_ifd_chain": (tiff_ifd_chain(), cplx),
        "tiff_tag_flood": (tiff_tag_flood(), cplx),
        "tiff_huge_tiles": (tiff_huge_tiles(), cplx),
        "jpeg_empty_scans": (jpeg_empty_scans(), cplx),
        "bmp_rle": (bmp_rle(), cplx),
        "webp_huge_canvas": (webp_huge_canvas(), large),
        "avif_huge_ispe": (with_ispe(avif(64, 64), 60000, 60000), large | corrupt),
        "avif_grid_4096_tiles": (isobmff_grid("avif", 64, 64), cplx),
        # within the pixel limit, but the decode would hold several bytes per canvas pixel (#32)
        "png_rgba_64mp": (rgba_png_big(), large),
        "apng_64mp_canvas_tiny_frames": (apng_big_canvas(), large),
        "gif_64mp_canvas_tiny_frame": (gif_big_canvas(), large),
        "gif_36mp_canvas_tiny_frames": (gif_big_canvas(6000, 6000, 200), large),
        "webp_animated_64mp_canvas_1x1": (webp_animated_canvas(), large),
        "webp_animated_64mp_canvas_2000_frames": (webp_animated_canvas(frames=2000), large),
        "webp_animated_25mp_canvas": (webp_animated_canvas(5000, 5000), large),
        "jpeg_multiscan_64mp": (flat_jpeg(8000, 8000, 3), large),
        "jpeg_multiscan_grey_repeated_scans": (flat_jpeg(8000, 8000, 1, scans=3), large | corrupt),
        # grids whose tiles do not tile their canvas, and coded frames larger than declared
        "avif_grid_900_tiles_of_1448_on_7680": (isobmff_grid("avif", 30, 30, 1448, canvas=(7680, 7680)), corrupt),
        "avif_grid_tiles_beyond_a_small_canvas": (isobmff_grid("avif", 30, 30, 1448, canvas=(1920, 1920)),
                                                  corrupt),
        "avif_codes_more_than_its_ispe": (with_ispe(flat_avif(4000), 64, 64), corrupt),
        "avif_grid_tiles_code_more_than_their_ispe": (isobmff_grid("avif", 8, 8, 64, coded=1024), corrupt),
    }
    if HEIF:
        cases["heic_huge_ispe"] = (with_ispe(heic(64, 64), 60000, 60000), large | corrupt)
        cases["heic_grid_4096_tiles"] = (isobmff_grid("heif", 64, 64), cplx)
        cases["heic_grid_900_tiles_of_1448_on_7680"] = (isobmff_grid("heif", 30, 30, 1448, canvas=(7680, 7680)),
                                                        corrupt)
        cases["heic_grid_900_tiles_of_2048_on_7680"] = (isobmff_grid("heif", 30, 30, 2048, canvas=(7680, 7680)),
                                                        corrupt)
        cases["heic_grid_tiles_beyond_a_small_canvas"] = (isobmff_grid("heif", 20, 20, 1448, canvas=(2000, 2000)),
                                                          corrupt)
        cases["heic_grid_64mp_canvas"] = (isobmff_grid("heif", 16, 16, 500), large)
    small = {"png": screenshot_png(600, 400, (40, 20)), "jpeg": photo_jpeg(600, 400), "gif": animated_gif(300, 200),
             "webp": webp(600, 400), "bmp": bmp(300, 200), "tiff": tiff(300, 200), "avif": avif(320, 240)}
    if HEIF:
        small["heic"] = heic(320, 240)
    for name, data in small.items():
        for keep in (0.5, 0.9):
            cases[f"{name}_truncated_{int(keep * 100)}"] = (truncated(data, keep), corrupt)
    return cases


def desktop_screenshot(w: int = 1920, h: int = 1080, seed: int = 5) -> Image.Image:
    """A full-screen screenshot as people send them: menu bar, sidebar, anti-aliased text
    (DejaVu Sans 13-15 px at 1x, scaled with the width), a photo panel and a gradient
    banner; no uniform border. PNG compresses it like a real one (inflate is the cost)."""
    from PIL import ImageFont
    rng = np.random.default_rng(seed)
    k = w / 1920
    im = Image.new("RGB", (w, h), (250, 250, 252))
    d = ImageDraw.Draw(im)
    d.rectangle([0, 0, w, int(28 * k)], fill=(236, 236, 240))
    side = int(260 * k)
    d.rectangle([0, int(28 * k), side, h], fill=(228, 231, 236))
    ramp = np.linspace(0, 1, w - side, dtype=np.float32)[None, :, None]
    banner = (np.array([40, 90, 170], np.float32) * (1 - ramp) + np.array([120, 60, 160], np.float32) * ramp)
    im.paste(Image.fromarray(np.repeat(banner, int(90 * k), 0).astype(np.uint8)), (side, int(28 * k)))
    pw, ph = int(560 * k), int(360 * k)
    im.paste(Image.fromarray(photo_array(pw, ph, seed)), (w - pw - int(40 * k), int(150 * k)))
    try:
        fonts = [ImageFont.truetype("DejaVuSans.ttf", int(s * k)) for s in (13, 14, 15)]
    except OSError:  # pragma: no cover - the font is a test dependency
        fonts = [ImageFont.load_default()]
    words = ["invoice", "total", "region", "revenue", "owner", "status", "pending", "shipped", "Q3", "note",
             "account", "balance", "due", "2026-11-30", "EUR", "1,204.50", "settings", "profile"]
    y = int(50 * k)
    while y < h - int(20 * k):
        d.text((int(16 * k), y), " ".join(rng.choice(words, 2)), font=fonts[0], fill=(40, 40, 50))
        y += int(26 * k)
    y = int(140 * k)
    while y < h - int(24 * k):
        f = fonts[int(rng.integers(0, len(fonts)))]
        x = side + int(30 * k)
        limit = w - pw - int(70 * k) if y < int(530 * k) else w - int(40 * k)
        line = " ".join(rng.choice(words, int(rng.integers(4, 14))))
        d.text((x, y), line[: max(8, (limit - x) // max(1, int(8 * k)))], font=f, fill=(25, 25, 35))
        y += int(22 * k)
    return im


def desktop_screenshot_png(w: int = 1920, h: int = 1080, seed: int = 5) -> bytes:
    return save(desktop_screenshot(w, h, seed), "PNG")


def flat_jpeg(w: int, h: int, components: int = 1, scans: int = 1) -> bytes:
    """A real baseline JPEG of any size, written without holding its pixels: Huffman
    tables of one 1-bit code each (DC difference 0, end of block), so every 8x8 block is
    two zero bits (16000x16000 grey: 1 MB). ``components`` 3: one non-interleaved scan per
    component (a multi-scan file, for which libjpeg buffers every coefficient of the
    image); ``scans`` > 1 repeats the (last) scan."""
    def seg(marker: int, body: bytes) -> bytes:
        return bytes([0xFF, marker]) + struct.pack(">H", len(body) + 2) + body
    blocks = ((w + 7) // 8) * ((h + 7) // 8)
    data = b"\x00" * ((blocks * 2 + 7) // 8)
    ids = range(1, components + 1)
    sof = struct.pack(">BHHB", 8, h, w, components) + b"".join(bytes([i, 0x11, 0]) for i in ids)
    body = [seg(0xDA, bytes([1, i, 0x00, 0x00, 0x3F, 0x00])) + data for i in ids]
    body += body[-1:] * (scans - 1)
    return (b"\xff\xd8" + seg(0xDB, b"\x00" + b"\x01" * 64) + seg(0xC0, sof)
            + seg(0xC4, b"\x00" + b"\x01" + b"\x00" * 15 + b"\x00")   # DC table 0: one code, symbol 0
            + seg(0xC4, b"\x10" + b"\x01" + b"\x00" * 15 + b"\x00")   # AC table 0: one code, EOB
            + b"".join(body) + b"\xff\xd9")


# -- canvases within the pixel limit whose decode holds several bytes per canvas pixel -----

def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _rows_deflated(row: bytes, h: int) -> bytes:
    z = zlib.compressobj(1)
    return b"".join(z.compress(row) for _ in range(h)) + z.flush()


def rgba_png_big(w: int = 8000, h: int = 8000) -> bytes:
    """A real w x h RGBA PNG with varying transparency (64 MP: 1.3 MB; rows repeat)."""
    x = np.arange(w)
    px = np.stack([x % 256, (x // 3) % 256, (x // 7) % 256, (x * 255 // max(1, w - 1))], -1).astype(np.uint8)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 6, 0, 0, 0))
            + _chunk(b"IDAT", _rows_deflated(b"\x00" + px.tobytes(), h)) + _chunk(b"IEND", b""))


def apng_big_canvas(w: int = 8000, h: int = 8000, frames: int = 50) -> bytes:
    """An APNG whose w x h default image (transparent, so converted) is followed by
    ``frames`` 1x1 frames: the first frame is the whole canvas."""
    def fctl(seq: int, fw: int, fh: int) -> bytes:
        return _chunk(b"fcTL", struct.pack(">IIIIIHHBB", seq, fw, fh, 0, 0, 1, 10, 0, 0))
    out = [b"\x89PNG\r\n\x1a\n", _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 6, 0, 0, 0)),
           _chunk(b"acTL", struct.pack(">II", frames + 1, 0)), fctl(0, w, h),
           _chunk(b"IDAT", _rows_deflated(b"\x00" + b"\x10\x20\x30\x80" * w, h))]
    seq = 1
    for _ in range(frames):
        out.append(fctl(seq, 1, 1))
        out.append(_chunk(b"fdAT", struct.pack(">I", seq + 1) + zlib.compress(b"\x00\x01\x02\x03\x04")))
        seq += 2
    return b"".join(out + [_chunk(b"IEND", b"")])


def gif_big_canvas(w: int = 8000, h: int = 8000, frames: int = 1) -> bytes:
    """A GIF whose w x h logical screen holds only 1x1 frames."""
    one = b"," + struct.pack("<HHHHB", 0, 0, 1, 1, 0) + b"\x02\x02\x44\x01\x00"
    return b"GIF89a" + struct.pack("<HHBBB", w, h, 0, 0, 0) + one * frames + b";"


def webp_animated_canvas(w: int = 8000, h: int = 8000, frames: int = 1) -> bytes:
    """An animated WebP (VP8X + ANIM) of a w x h canvas and ``frames`` 1x1 lossless frames:
    92 bytes for one frame."""
    tiny = save(Image.new("RGBA", (1, 1), (200, 10, 10, 255)), "WEBP", lossless=True)
    vp8l = tiny[12:]  # the VP8L chunk, header included

    def chunk(kind: bytes, body: bytes) -> bytes:
        return kind + struct.pack("<I", len(body)) + body + (b"\0" if len(body) % 2 else b"")
    anmf = chunk(b"ANMF", b"\0" * 6 + (0).to_bytes(3, "little") * 2 + (100).to_bytes(3, "little") + b"\x00" + vp8l)
    body = (b"WEBP" + chunk(b"VP8X", bytes([0x12]) + b"\0\0\0" + (w - 1).to_bytes(3, "little")
                            + (h - 1).to_bytes(3, "little"))
            + chunk(b"ANIM", b"\xff\xff\xff\xff\x00\x00") + anmf * frames)
    return b"RIFF" + struct.pack("<I", len(body)) + body


def memory_corpus(w: int = 2400, h: int = 1600) -> list[tuple[str, bytes, bool]]:
    """Valid images of every format, mode and conversion the decoder has a path for, large
    enough (3.8 MP) that what grows with the canvas dominates what a decode holds: the
    measurements of ``memory.need`` are checked on them (tests/test_images_memory.py).
    (name, bytes, whether sending it at its own size converts it: worth measuring too)."""
    import pillow_heif
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([x * 255 // w, y * 255 // h, (x + y) % 256], -1).astype(np.uint8)
    rgb[::37] = 0
    im = Image.fromarray(rgb)
    rgba = Image.fromarray(np.dstack([rgb, (x * 255 // w).astype(np.uint8)]))
    p = im.convert("P")
    p3 = display_p3_icc()
    rot6 = (b"Exif\x00\x00MM\x00*\x00\x00\x00\x08\x00\x01"  # one IFD entry: Orientation = 6
            b"\x01\x12\x00\x03\x00\x00\x00\x01\x00\x06\x00\x00\x00\x00\x00\x00")
    a16 = np.zeros((h, w, 3), np.uint16)
    a16[..., 0], a16[..., 1] = x * 65535 // w, y * 65535 // h
    heic10 = io.BytesIO()
    pillow_heif.from_bytes(mode="RGB;16", size=(w, h), data=a16.tobytes()).save(heic10, quality=50)
    grey16 = Image.fromarray((x * 65535 // w).astype(np.uint16))
    same = {"jpeg", "jpeg_grey", "jpeg_progressive", "png_rgb", "png_grey", "png_palette", "png16_rgb", "gif"}
    images = {
        "jpeg": save(im, "JPEG", quality=85),
        "jpeg_progressive": save(im, "JPEG", quality=85, progressive=True),
        "jpeg_progressive_444": save(im, "JPEG", quality=85, progressive=True, subsampling=0),
        "jpeg_grey": save(im.convert("L"), "JPEG", quality=85),
        "jpeg_cmyk": save(im.convert("CMYK"), "JPEG", quality=85),
        "jpeg_p3": save(im, "JPEG", quality=85, icc_profile=p3),
        "jpeg_rotated": save(im, "JPEG", quality=85, exif=rot6),
        "jpeg_multiscan": flat_jpeg(w, h, 3),
        "png_rgb": save(im, "PNG", compress_level=1),
        "png_grey": save(im.convert("L"), "PNG", compress_level=1),
        "png_rgba": save(rgba, "PNG", compress_level=1),
        "png_la": save(rgba.convert("LA"), "PNG", compress_level=1),
        "png_palette": save(p, "PNG", compress_level=1),
        "png_palette_transparent": save(p, "PNG", transparency=0, compress_level=1),
        "png16_rgb": png16_rgb(w, h),
        "png16_grey": save(grey16, "PNG", compress_level=1),
        "apng": save(im, "PNG", save_all=True, append_images=[im.point(lambda v: 255 - v)], compress_level=1),
        "gif": save(p, "GIF"),
        "gif_transparent": save(p, "GIF", transparency=0),
        "webp": save(im, "WEBP", quality=80, method=0),
        "webp_alpha": save(rgba, "WEBP", quality=80, method=0),
        "webp_animated": save(im, "WEBP", save_all=True, append_images=[im.point(lambda v: 255 - v)], quality=50,
                              method=0),
        "tiff": save(im, "TIFF"),
        "tiff_grey16": save(grey16, "TIFF"),
        "bmp": save(im, "BMP"),
        "bmp_rgba": save(rgba, "BMP"),
        "avif": save(im, "AVIF", quality=50, speed=10),
        "avif_444": save(im, "AVIF", quality=50, speed=10, subsampling="4:4:4"),
        "avif_alpha": save(rgba, "AVIF", quality=50, speed=10),
        "heic": heic(image=im, quality=50),
        "heic_p3": heic(image=im, quality=50, icc_profile=p3),
        "heic_alpha": heic(image=rgba, quality=50),
        "heic_10bit": heic10.getvalue(),
    }
    return [(name, data, name not in same) for name, data in images.items()]


# -- every bit depth: two halves of known colour (#32, class 8) ------------------------------------

def _over_white(rgb, alpha: float) -> tuple[int, int, int]:
    return tuple(round(c * alpha + 255 * (1 - alpha)) for c in rgb)


def _pack(values: np.ndarray, bits: int) -> bytes:
    """A row of ``bits``-bit samples, packed most significant first, padded to a byte."""
    per = 8 // bits
    v = np.zeros(-(-len(values) // per) * per, np.uint8)
    v[:len(values)] = values
    v = v.reshape(-1, per)
    out = np.zeros(len(v), np.uint8)
    for j in range(per):
        out |= (v[:, j] << (8 - bits * (j + 1))).astype(np.uint8)
    return out.tobytes()


def _tiff16(w: int, h: int, samples: np.ndarray, photometric: int, extra: int = 0) -> bytes:
    """An uncompressed 16-bit TIFF (one strip, little-endian) of ``samples`` (h x w x spp)."""
    spp = samples.shape[2]
    data = samples.astype("<u2").tobytes()
    tags = [(256, 4, 1, w), (257, 4, 1, h), (258, 3, spp, 16), (259, 3, 1, 1), (262, 3, 1, photometric),
            (273, 4, 1, 0), (277, 3, 1, spp), (278, 4, 1, h), (279, 4, 1, len(data))]
    if extra:
        tags.append((338, 3, 1, extra))  # ExtraSamples: 2 = unassociated alpha
    ifd = 8
    bps = ifd + 2 + 12 * len(tags) + 4
    strip = bps + (2 * spp if spp > 2 else 0)
    out = b"II*\x00" + struct.pack("<IH", ifd, len(tags))
    for tag, typ, count, value in tags:
        if tag == 258 and spp > 2:
            out += struct.pack("<HHII", tag, typ, count, bps)
        elif tag == 258:
            out += struct.pack("<HHI", tag, typ, count) + struct.pack("<HH", *([16] * count + [0])[:2])
        elif tag == 273:
            out += struct.pack("<HHII", tag, typ, count, strip)
        elif typ == 3:
            out += struct.pack("<HHIHH", tag, typ, count, value, 0)
        else:
            out += struct.pack("<HHII", tag, typ, count, value)
    out += struct.pack("<I", 0) + (struct.pack(f"<{spp}H", *[16] * spp) if spp > 2 else b"")
    return out + data


def bit_depth(kind: str, w: int = 2000, h: int = 1500) -> tuple[bytes, tuple, tuple]:
    """(image, left half's colour, right half's colour as a viewer shows them on white) for
    ``kind`` in BIT_DEPTHS: PNG of 16-bit RGB, RGBA, grey and grey+alpha, 1/2/4-bit
    palette and grey; 16-bit TIFF of RGB, RGBA and grey."""
    half = w // 2
    if kind.startswith("tiff"):
        spp = {"tiff16_rgb": 3, "tiff16_rgba": 4, "tiff16_grey": 1}[kind]
        left, right = [(60000, 20000, 5000, 65535), (1000, 40000, 65535, 32768)][0][:spp], \
            [(60000, 20000, 5000, 65535), (1000, 40000, 65535, 32768)][1][:spp]
        if spp == 1:
            left, right = (40000,), (10000,)
        a = np.zeros((h, w, spp), np.uint16)
        a[:, :half], a[:, half:] = left, right
        data = _tiff16(w, h, a, 1 if spp == 1 else 2, extra=2 if spp == 4 else 0)
    else:
        bits, ctype = {"png16_rgb": (16, 2), "png16_rgba": (16, 6), "png16_grey": (16, 0),
                       "png16_grey_alpha": (16, 4), "png1_palette": (1, 3), "png2_palette": (2, 3),
                       "png4_palette": (4, 3), "png1_grey": (1, 0), "png2_grey": (2, 0),
                       "png4_grey": (4, 0)}[kind]
        extra = b""
        if bits == 16:
            left = {2: (60000, 20000, 5000), 6: (60000, 20000, 5000, 65535), 0: (40000,), 4: (40000, 65535)}[ctype]
            right = {2: (1000, 40000, 65535), 6: (1000, 40000, 65535, 32768), 0: (10000,), 4: (10000, 32768)}[ctype]
            row = struct.pack(f">{len(left)}H", *left) * half + struct.pack(f">{len(right)}H", *right) * (w - half)
        else:
            top = (1 << bits) - 1
            lv, rv = (0, top) if ctype == 3 else (top, top // 3 if bits > 1 else 0)
            row = _pack(np.array([lv] * half + [rv] * (w - half), np.uint8), bits)
            if ctype == 3:
                palette = [(20 + 12 * i, 200 - 10 * i, (60 * i) % 256) for i in range(top + 1)]
                extra = _chunk(b"PLTE", bytes(c for p in palette for c in p))
                left, right = palette[lv], palette[rv]
            else:
                left, right = (lv * 255 // top,), (rv * 255 // top,)
        data = _png_chunks(struct.pack(">IIBBBBB", w, h, bits, ctype, 0, 0, 0),
                           _rows_deflated(b"\x00" + row, h), extra)

    def shown(c):
        if max(c) > 255:  # 16-bit samples
            c = tuple(v / 257 for v in c)
        if len(c) in (2, 4):
            return _over_white(c[:-1] * (3 if len(c) == 2 else 1), c[-1] / 255)
        return tuple(round(v) for v in (c * 3 if len(c) == 1 else c))
    return data, shown(left), shown(right)


BIT_DEPTHS = ("png16_rgb", "png16_rgba", "png16_grey", "png16_grey_alpha", "png1_palette", "png2_palette",
              "png4_palette", "png1_grey", "png2_grey", "png4_grey", "tiff16_rgb", "tiff16_rgba", "tiff16_grey")
