"""Formats phones and browsers send (AVIF, HEIC/HEIF, animations, wide-gamut and
deep colour), written by the libraries that write them (Pillow, pillow-heif): what
is decoded, what is converted even within budget, and what the engine gets."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from vlm_gateway.stages.images import Policy, rewrite_bytes
import image_corpus as C
from vlm_gateway.stages.images import decode as D
from vlm_gateway.stages.images.colour import PRIMARIES, srgb_decode, srgb_encode, to_srgb_matrix
from vlm_gateway.stages.images.decode import ImageError, probe, sniff

ENGINE_MIMES = {"image/jpeg", "image/png"}
heif_only = pytest.mark.skipif(not D.HEIF, reason="pillow-heif (the 'heif' extra) is not installed")


def out_image(r) -> Image.Image:
    im = Image.open(io.BytesIO(r.data))
    assert im.format in ("JPEG", "PNG")
    return im.convert("RGB")


def centre(r) -> np.ndarray:
    im = out_image(r)
    return np.asarray(im).astype(int)[im.height // 2, im.width // 2]


def test_pillow_reads_avif_natively():
    from PIL import features
    assert features.check("avif")


@pytest.mark.parametrize("make,fmt", [(C.avif, "avif"), pytest.param(C.heic, "heif", marks=heif_only)])
def test_avif_heic_decoded_and_always_reencoded(make, fmt):
    big = make(1600, 1200)
    assert sniff(big) == fmt and (probe(big, 64_000_000).width, probe(big, 64_000_000).height) == (1600, 1200)
    r = rewrite_bytes(big)
    assert (r.width, r.height) == (768, 576) and r.mime in ENGINE_MIMES
    assert f"format:{fmt}" in r.conversions
    # within the budget too: engines cannot all read these formats, so never passed through
    small = make(600, 400)
    r = rewrite_bytes(small)
    assert not r.passthrough and r.mime in ENGINE_MIMES and (r.width, r.height) == (600, 400)
    ref = C.photo_array(600, 400).astype(float)
    assert np.abs(np.asarray(out_image(r)).astype(float) - ref).mean() < 12  # the same picture


@heif_only
def test_heic_10bit_is_converted_to_8bit_keeping_the_ramp():
    r = rewrite_bytes(C.heic_10bit(640, 480))
    assert {"format:heif", "10-bit"} <= set(r.conversions)
    a = np.asarray(out_image(r)).astype(int)
    assert a[:, 5, 0].mean() < 15 and a[:, -5, 0].mean() > 240  # red ramps 0 -> 255 left to right
    assert np.all(np.diff(a[240, ::32, 0]) >= -2)  # monotonic, no wrap-around or clipping


@pytest.mark.parametrize("fmt", ["GIF", "PNG", "WEBP", "AVIF"])
def test_animations_send_their_first_frame_and_say_so(fmt):
    data = C.frames(fmt, 640, 480)
    for policy in (Policy(), Policy(max_long_side=448)):  # within and over budget
        r = rewrite_bytes(data, policy)
        assert not r.passthrough and "frames:first-of-3" in r.conversions
        px = centre(r)
        assert px[0] > 200 and px[1] < 40 and px[2] < 40  # the first frame is red


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "TIFF", "AVIF", pytest.param("HEIF", marks=heif_only)])
def test_display_p3_converted_to_the_srgb_a_viewer_shows(fmt):
    srgb = (250, 10, 10)
    raw = C.p3_encode(srgb)
    assert max(abs(a - b) for a, b in zip(raw, srgb)) > 20  # raw numbers differ visibly
    r = rewrite_bytes(C.p3_tagged(fmt, srgb))
    assert any(c.startswith("icc:") for c in r.conversions)
    assert np.abs(centre(r) - srgb).max() <= 6, (centre(r), srgb, raw)


def test_srgb_tagged_image_passes_through_unchanged():
    data = C.srgb_tagged_png()
    r = rewrite_bytes(data)
    assert r.passthrough and r.data is data and r.conversions == ()


def test_avif_nclx_display_p3_without_icc_is_converted():
    src = C.avif(400, 300, quality=95)
    p3 = C.with_nclx(src, primaries=12)
    assert D.open_checked(p3, "avif", 64_000_000).nclx[0] == 12
    plain, conv = rewrite_bytes(src), rewrite_bytes(p3)
    assert "nclx:Display-P3" in conv.conversions and "nclx:Display-P3" not in plain.conversions
    a = np.asarray(out_image(plain)).astype(float) / 255
    want = np.clip(srgb_decode(a) @ to_srgb_matrix(PRIMARIES[12]).T, 0, 1)
    got = np.asarray(out_image(conv)).astype(float) / 255
    assert np.abs(srgb_encode(want) - got).mean() * 255 < 3


def test_avif_pq_hdr_is_tone_mapped_not_shown_as_raw_numbers():
    # a flat PQ code value for 203 cd/m2 (SDR reference white): raw it reads as mid-grey
    pq_white = 0.5807  # PQ(203 / 10000)
    v = int(round(pq_white * 255))
    src = C.save(Image.new("RGB", (320, 240), (v, v, v)), "AVIF", quality=100)
    hdr = C.with_nclx(src, primaries=9, transfer=16)
    r = rewrite_bytes(hdr)
    assert "nclx:BT.2020/PQ" in r.conversions
    px = centre(r)
    assert px.min() > 220  # reference white shows near white (the soft knee keeps it just below)
    assert abs(int(px[0]) - int(px[2])) < 8  # grey stays grey


def test_transparency_composited_on_white_opaque_alpha_passes():
    r = rewrite_bytes(C.rgba_png())
    assert r.conversions == ("alpha:white",)
    a = np.asarray(out_image(r)).astype(int)
    assert (a[5, 5] > 250).all() and (a[46, 300] < 10).all()  # background white, bars black
    opaque = C.rgba_png(opaque=True)
    r = rewrite_bytes(opaque)
    assert r.passthrough and r.data is opaque


def test_cmyk_orientation_and_16bit_converted_within_budget():
    r = rewrite_bytes(C.cmyk_jpeg(600, 400, rgb=(200, 60, 30)))
    assert "mode:CMYK" in r.conversions and np.abs(centre(r) - (200, 60, 30)).max() < 12
    r = rewrite_bytes(C.exif_rotated_jpeg(600, 400, orientation=6))
    assert r.conversions == ("orientation:6",) and (r.width, r.height) == (400, 600)
    r = rewrite_bytes(C.png16_gray(600, 400))
    assert r.conversions == ("16-bit",)
    a = np.asarray(out_image(r)).astype(int)
    assert a[:, 0].max() < 5 and a[:, -1].min() > 250
    r = rewrite_bytes(C.tiff16_gray())
    assert {"format:tiff", "16-bit"} <= set(r.conversions)


def test_48bit_rgb_png_passes_through():
    # Pillow (every engine's loader) reads the high bytes: what a viewer shows at 8 bits
    data = C.png16_rgb()
    r = rewrite_bytes(data)
    assert r.passthrough and r.data is data


@pytest.mark.parametrize("data,named", [
    (b"\xff\x0a" + b"\0" * 64, "JPEG XL"),
    (b"\x00\x00\x00\x0cjP  \r\n\x87\n" + b"\0" * 64, "JPEG 2000"),
    (b"%PDF-1.7\n" + b"\0" * 64, "PDF"),
    (b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00mp42isom" + b"\0" * 64, "video"),
    (C.SVG, "SVG"),
    (b"8BPS" + b"\0" * 64, "PSD"),
])
def test_unreadable_formats_are_named_with_what_to_send(data, named):
    with pytest.raises(ImageError) as e:
        rewrite_bytes(data)
    msg = str(e.value)
    assert e.value.code == "unsupported_image_format"
    assert named in msg and ("PNG" in msg and "JPEG" in msg)


def test_accepted_list_names_the_modern_formats():
    assert "AVIF" in D.accepted()
    if D.HEIF:
        assert "HEIC" in D.accepted()


@pytest.mark.parametrize("codec", ["avif", pytest.param("heif", marks=heif_only)])
def test_small_grid_decodes_large_grid_refused(codec):
    r = rewrite_bytes(C.isobmff_grid(codec, 3, 2, 64))
    assert (r.width, r.height) == (192, 128) and f"format:{codec}" in r.conversions
    with pytest.raises(ImageError) as e:
        rewrite_bytes(C.isobmff_grid(codec, 40, 40, 16))
    assert e.value.code == "image_too_complex"


@pytest.mark.parametrize("codec", ["avif", pytest.param("heif", marks=heif_only)])
def test_declared_size_above_the_limit_refused_before_decoding(codec):
    small = C.avif(64, 64) if codec == "avif" else C.heic(64, 64)
    with pytest.raises(ImageError) as e:
        rewrite_bytes(C.with_ispe(small, 20000, 20000))
    assert e.value.code in ("image_too_large", "image_corrupt")
    with pytest.raises(ImageError) as e:
        rewrite_bytes(small, max_source_pixels=64 * 63)
    assert e.value.code == "image_too_large"


@heif_only
def test_multi_image_heif_sends_its_primary_image():
    ims = [Image.new("RGB", (320, 240), c) for c in ((250, 0, 0), (0, 0, 250))]
    data = C.save(ims[0], "HEIF", save_all=True, append_images=ims[1:], primary_index=1, quality=90)
    r = rewrite_bytes(data)
    assert "images:primary-of-2" in r.conversions
    px = centre(r)
    assert px[2] > 200 and px[0] < 40  # the primary (blue), not the first (red)


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP", "AVIF", pytest.param("HEIF", marks=heif_only)])
def test_orientation_applied_once_in_every_format(fmt):
    """Stored 600x400 (left red, right blue) with EXIF orientation 6: upright 400x600 with red
    on top, whether the library applies the rotation (libheif: irot) or the gateway does."""
    a = np.zeros((400, 600, 3), np.uint8)
    a[:, :300] = (220, 20, 20)
    a[:, 300:] = (20, 20, 220)
    exif = Image.Exif()
    exif[0x0112] = 6
    im = Image.fromarray(a)
    data = (C.heic(image=im, exif=exif.tobytes()) if fmt == "HEIF"
            else C.save(im, fmt, exif=exif.tobytes(), **({} if fmt == "PNG" else {"quality": 90})))
    r = rewrite_bytes(data)
    assert (r.width, r.height) == (400, 600)
    o = np.asarray(out_image(r)).astype(int)
    assert o[5, 200, 0] > 200 and o[-5, 200, 2] > 200


def _halves(r) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(out_image(r)).astype(int)
    return a[a.shape[0] // 2, a.shape[1] // 4], a[a.shape[0] // 2, 3 * a.shape[1] // 4]


@pytest.mark.parametrize("kind", C.BIT_DEPTHS)
def test_every_bit_depth_is_rewritten_as_a_viewer_shows_it(kind):
    """#32 class 8: a valid 2000x1500 16-bit RGB PNG was refused as corrupt (libvips reads
    16-bit samples, the size check took them for a mismatch). Every depth, over the
    budget and within it, arrives with the colours a viewer shows (on white where there
    is transparency)."""
    data, left, right = C.bit_depth(kind, 2000, 1500)
    r = rewrite_bytes(data)
    assert (r.source_width, r.source_height) == (2000, 1500) and (r.width, r.height) == (768, 576), r
    got_left, got_right = _halves(r)
    assert np.abs(got_left - left).max() <= 3 and np.abs(got_right - right).max() <= 3, (got_left, got_right)
    small, left, right = C.bit_depth(kind, 600, 400)
    r = rewrite_bytes(small)
    assert (r.width, r.height) == (600, 400) and (r.passthrough or r.mime in ENGINE_MIMES)
    got_left, got_right = _halves(r)
    assert np.abs(got_left - left).max() <= 3 and np.abs(got_right - right).max() <= 3, (got_left, got_right)


def test_16bit_rgb_png_takes_the_libvips_decode_with_pillows_pixels():
    from vlm_gateway.stages.images import vips
    if not vips.VIPS:
        pytest.skip("libvips is not installed")
    data, _, _ = C.bit_depth("png16_rgb", 640, 480)
    im = Image.open(io.BytesIO(data))
    assert vips.plain_png(im)
    got = vips.rgb(vips.decode_png(data, im.size))
    assert np.array_equal(np.asarray(got), np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))
