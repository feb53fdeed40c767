"""The libvips PNG path (stages/images/vips.py) gives the pixels Pillow gives, and refuses
what Pillow refuses, with the same error codes: the hostile corpus, and PNGs whose chunks
are all well formed but whose compressed pixels are not."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

import image_corpus as C
from vlm_gateway.stages.images import vips
from vlm_gateway.stages.images.decode import ImageError, decode_opened, open_checked
from vlm_gateway.stages.images.rewrite import rewrite_bytes

pytestmark = pytest.mark.skipif(not vips.VIPS, reason="pyvips is not installed")


@pytest.fixture
def pillow_only(monkeypatch):
    def switch(on: bool) -> None:
        monkeypatch.setattr(vips, "VIPS", on)
    return switch


def _png(im: Image.Image) -> bytes:
    return C.save(im, "PNG")


@pytest.mark.parametrize("data", [C.desktop_screenshot_png(1280, 720), C.screenshot_png(1000, 700, (100, 50)),
                                  _png(Image.fromarray(C.photo_array(900, 600)).convert("L"))])
def test_plain_png_pixels_equal_pillow(data):
    op = open_checked(data, "png", 64_000_000)
    assert vips.plain_png(op.im)
    d = decode_opened(op)
    assert d.image.mode in ("RGBX", "L") and d.conversions == []
    ours = np.asarray(vips.rgb(d.image))
    theirs = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    assert ours.shape == theirs.shape and np.array_equal(ours, theirs)


def test_rewrite_same_output_size_and_close_pixels(pillow_only):
    data = C.desktop_screenshot_png(2880, 1800)
    a = rewrite_bytes(data)
    pillow_only(False)
    b = rewrite_bytes(data)
    assert (a.width, a.height, a.mime, a.trimmed) == (b.width, b.height, b.mime, b.trimmed)
    pa = np.asarray(Image.open(io.BytesIO(a.data)).convert("RGB"), dtype=np.float64)
    pb = np.asarray(Image.open(io.BytesIO(b.data)).convert("RGB"), dtype=np.float64)
    mse = np.mean((pa - pb) ** 2)
    assert 10 * np.log10(255 ** 2 / mse) > 35  # the same kernel family: only rounding differs


def test_resize_reads_the_decode_in_place_and_equals_crop_then_resize():
    data = C.screenshot_png(1000, 700, (100, 50))
    im = decode_opened(open_checked(data, "png", 64_000_000)).image
    assert im.readonly and getattr(im, "_vips_pixels", None) is not None  # the decode's buffer, no copy
    box = (37, 21, 951, 660)
    for b in (None, box):
        ours = np.asarray(vips.rgb(vips.resize(im, (400, 288), "bicubic", b)))
        copy = Image.frombytes(im.mode, im.size, im.tobytes())  # no decode buffer: the copy path
        ref = np.asarray(vips.rgb(vips.resize(copy.crop(b) if b else copy, (400, 288), "bicubic")))
        assert ours.shape == ref.shape == (288, 400, 3) and np.array_equal(ours, ref)


def test_an_image_changed_in_place_is_not_read_from_the_stale_decode_buffer():
    data = C.screenshot_png(640, 480, (100, 50))
    im = decode_opened(open_checked(data, "png", 64_000_000)).image
    im.paste((255, 0, 0, 255), (0, 0, 640, 480))  # Pillow copies a read-only image first
    out = np.asarray(vips.rgb(vips.resize(im, (320, 240), "bicubic")))
    assert (out == (255, 0, 0)).all()


def test_hostile_corpus_same_outcome_with_and_without_libvips(pillow_only):
    def outcome(data: bytes):
        try:
            r = rewrite_bytes(data)
            return ("accepted", r.width, r.height)
        except ImageError as e:
            return (e.code,)
    for name, case in C.hostile().items():
        data = case[0] if isinstance(case, tuple) else case
        pillow_only(True)
        a = outcome(data)
        pillow_only(False)
        b = outcome(data)
        assert a == b, name


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


@pytest.mark.parametrize("idat", [b"\x78\x9c" + b"\xff" * 5000,                        # not deflate
                                  zlib.compress(b"\x00" + b"\x10" * 3000)[:-40],       # cut short
                                  zlib.compress((b"\x07" + b"\x10" * 3000) * 1000)])   # filter type 7
def test_well_formed_chunks_bad_pixels_refused_alike(idat, pillow_only):
    w, h = 1000, 1000
    data = (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + _chunk(b"IDAT", idat) + _chunk(b"IEND", b""))
    codes = []
    for on in (True, False):
        pillow_only(on)
        with pytest.raises(ImageError) as e:
            rewrite_bytes(data)
        codes.append(e.value.code)
    assert codes == ["image_corrupt", "image_corrupt"]


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_pillow_images_are_read_in_place_and_resize_as_the_copy_path(mode, monkeypatch):
    """An RGB (or L) Pillow image is handed to libvips through its own memory (Pillow's Arrow
    export: RGB as four bytes a pixel) and comes back RGBX (L as L), the same pixels as the
    copy path (``tobytes``), and the padding band stays 255 (the flat-colour count reads it)."""
    rng = np.random.default_rng(3)
    im = Image.fromarray(rng.integers(0, 256, (301, 517, 3), dtype=np.uint8)).convert(mode)
    assert vips._view(im) is not None
    for target, box in (((200, 117), None), ((333, 190), (5, 9, 500, 290))):
        ours = vips.resize(im, target, "bicubic", box)
        assert ours.mode == ("RGBX" if mode == "RGB" else "L")
        with monkeypatch.context() as m:
            m.setattr(vips, "_view", lambda im: None)
            ref = vips.resize(im, target, "bicubic", box)
        assert ref.mode == mode
        assert np.array_equal(np.asarray(vips.rgb(ours)), np.asarray(vips.rgb(ref)))
        if mode == "RGB":
            pad = np.frombuffer(ours.tobytes("raw", "RGBX"), np.uint8)[3::4]
            assert (pad == 255).all()


def test_an_image_larger_than_one_pillow_block_is_copied_not_read_in_place():
    im = Image.new("RGB", (4032, 3024), (10, 20, 30))  # 48 MB: Pillow's rows are not one block
    assert vips._view(im) is None
    out = vips.rgb(vips.resize(im, (768, 576), "bicubic"))
    assert out.getextrema() == ((10, 10), (20, 20), (30, 30))
