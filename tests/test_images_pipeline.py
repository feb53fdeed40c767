"""Decode / trim / resize / encode on a generated corpus, quality and determinism."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from vlm_gateway.stages.images import Policy, rewrite_bytes
import image_corpus as C
from vlm_gateway.stages.images.decode import ImageError, decode, probe
from image_quality import lanczos_reference, psnr
from vlm_gateway.stages.images.source import decode_data_uri
from vlm_gateway.stages.images.trim import content_box
from vlm_gateway.vision_tokens import visual_tokens

P = Policy()


def out_image(r) -> Image.Image:
    return Image.open(io.BytesIO(r.data))


def test_baseline_jpeg_1080p_to_token_grid():
    r = rewrite_bytes(C.photo_jpeg(1920, 1080))
    assert (r.width, r.height) == (768, 448)
    assert r.tokens_before == 2040 and r.tokens_after == 336
    assert r.mime == "image/jpeg" and r.url.startswith("data:image/jpeg;base64,")
    assert out_image(r).size == (768, 448) and out_image(r).mode == "RGB"


@pytest.mark.parametrize("w,h,progressive", [(1920, 1080, False), (1920, 1080, True), (1280, 720, False),
                                             (4032, 3024, False)])
def test_psnr_against_float64_lanczos_reference(w, h, progressive):
    src = C.photo_jpeg(w, h, progressive=progressive)
    r = rewrite_bytes(src)
    assert max(r.width, r.height) <= 768 and r.width % 32 == 0 and r.height % 32 == 0
    full = np.asarray(Image.open(io.BytesIO(src)).convert("RGB"))
    ref = lanczos_reference(full, r.width, r.height)
    assert psnr(np.asarray(out_image(r).convert("RGB")), ref) >= 31.0


def test_deterministic_output():
    src = C.photo_jpeg(1920, 1080)
    a, b = rewrite_bytes(src), rewrite_bytes(src)
    assert a.data == b.data and a.url == b.url
    s = C.screenshot_png()
    assert rewrite_bytes(s).data == rewrite_bytes(s).data


def test_the_trims_reduction_is_the_resizes_when_their_factor_is_the_same(monkeypatch):
    """A 1080p photo under the default budget: the box reduction made for the border search
    is the one the resize starts from (one full-size reduction, not two), and the output is
    what a resize from the full decode gives (the PSNR test above holds it to the reference)."""
    src = C.photo_jpeg(1920, 1080)
    calls = []
    real = Image.Image.reduce

    def whole(im, factor, box=None, **k):  # reductions of the whole image (not of its corner blocks)
        if box is None:
            calls.append(im.size)
        return real(im, factor, box, **k)
    monkeypatch.setattr(Image.Image, "reduce", whole)
    r = rewrite_bytes(src)
    assert (r.width, r.height) == (768, 448) and calls == [(1920, 1080)]
    monkeypatch.setattr(Image.Image, "reduce", real)
    full = np.asarray(Image.open(io.BytesIO(src)).convert("RGB"))
    assert psnr(np.asarray(out_image(r).convert("RGB")), lanczos_reference(full, r.width, r.height)) >= 31.0


def test_no_border_to_find_costs_no_reduction(monkeypatch):
    """A screenshot whose corners differ (menu bar, sidebar) has no uniform border: the border
    search reads four corner blocks, and nothing is reduced that the resize does not need."""
    calls = []
    real = Image.Image.reduce

    def whole(im, factor, box=None, **k):
        if box is None:
            calls.append(im.size)
        return real(im, factor, box, **k)
    monkeypatch.setattr(Image.Image, "reduce", whole)
    r = rewrite_bytes(C.desktop_screenshot_png(1920, 1080))  # its text needs every pixel: sent as it is
    assert r.passthrough and not r.trimmed and calls == []
    r = rewrite_bytes(C.desktop_screenshot_png(1920, 1080), Policy(budget="fixed"))  # 768: one reduction, the resize's
    assert (r.width, r.height) == (768, 448) and not r.trimmed and calls == [(1920, 1080)]


@pytest.mark.parametrize("mode", ["RGB", "RGBX", "L"])
def test_the_corner_check_is_the_reduced_images_own(mode):
    """``uniform_corners(im, k)`` says what ``content_box(im.reduce(k))`` finds at its corners,
    for every size (partial edge blocks) and factor, bordered or not."""
    from vlm_gateway.stages.images.trim import content_box, uniform_corners
    rng = np.random.default_rng(7)
    for i in range(120):
        w, h = int(rng.integers(6, 400)), int(rng.integers(6, 400))
        a = np.full((h, w, 3), 240, np.uint8)
        if i % 3:  # content inside a border, sometimes touching a corner block
            y0, x0 = int(rng.integers(0, h // 2)), int(rng.integers(0, w // 2))
            a[y0:y0 + int(rng.integers(1, h - y0 + 1)), x0:x0 + int(rng.integers(1, w - x0 + 1))] = \
                rng.integers(0, 256, 3, dtype=np.uint8)
        a = np.clip(a.astype(int) + rng.integers(-6, 7, a.shape), 0, 255).astype(np.uint8)
        im = Image.fromarray(a).convert(mode) if mode != "L" else Image.fromarray(a[..., 0])
        for k in (1, 2, 3, 5):
            if k > min(w, h) // 3:
                continue
            small = im.reduce(k) if k >= 2 else im
            small = small.convert("RGB") if small.mode != "RGB" else small
            if not uniform_corners(im, k, 8):
                assert content_box(small, 8, 2) is None
            else:
                c = [small.getpixel(p) for p in ((0, 0), (small.width - 1, 0), (0, small.height - 1),
                                                  (small.width - 1, small.height - 1))]
                assert all(max(abs(x - y) for x, y in zip(p, c[0])) <= 8 for p in c)


def test_small_image_passes_through_untouched():
    src = C.photo_jpeg(500, 300)
    r = rewrite_bytes(src)
    assert r.passthrough and r.url is None and r.data is src
    assert r.tokens_before == r.tokens_after == 144


def test_policy_off_and_budgets():
    src = C.photo_jpeg(1920, 1080)
    assert rewrite_bytes(src, Policy(enabled=False)).passthrough
    r = rewrite_bytes(src, Policy(max_long_side=448))
    assert max(r.width, r.height) <= 448
    r = rewrite_bytes(src, Policy(max_long_side=1280))
    assert (r.width, r.height) == (1280, 704)
    # Qwen2.5-VL grid
    r = rewrite_bytes(src, Policy(grid_factor=28))
    assert r.width % 28 == 0 and r.height % 28 == 0 and max(r.width, r.height) <= 768
    assert r.tokens_after == visual_tokens(r.width, r.height, 28)


def test_screenshot_margins_trimmed_and_flat_output_lossless():
    r = rewrite_bytes(C.screenshot_png())
    assert r.trimmed
    # content 1200x900 of the 1920x1080 frame; its small text (Pillow's bitmap font) needs more
    # than 768: the legible budget's long side, above the fixed rule, aspect of the content kept
    assert r.budget.cls == "text" and r.budget.reason == "legible" and 768 < r.budget.long_side < 1200
    assert r.width == r.budget.long_side and abs(r.width / r.height - 1200 / 900) < 0.1
    im = np.asarray(out_image(r).convert("RGB"))
    assert (im[0] != 255).any()  # the window border reaches the top edge: no white margin left
    # the fixed rule: the content to 768
    f = rewrite_bytes(C.screenshot_png(), Policy(budget="fixed"))
    assert f.trimmed and f.width == 768 and abs(f.width / f.height - 1200 / 900) < 0.1


def test_letterbox_trimmed_content_kept():
    r = rewrite_bytes(C.letterboxed_jpeg())
    assert r.trimmed
    assert abs(r.width / r.height - 1920 / 800) < 0.1
    im = np.asarray(out_image(r).convert("L")).astype(int)
    assert im[2].mean() > 40 and im[-3].mean() > 40  # no black bar left


def test_trim_refuses_non_uniform_border():
    a = C.photo_array(800, 600)
    assert content_box(Image.fromarray(a), 8) is None
    # white margin only on the left: corners disagree -> no trim
    b = np.full((600, 800, 3), 255, np.uint8)
    b[:, 200:] = 30
    assert content_box(Image.fromarray(b), 8) is None


def test_trim_never_cuts_a_faint_single_pixel():
    a = np.full((600, 800, 3), 255, np.uint8)
    a[100:500, 100:700] = 0
    a[590, 795] = (230, 255, 255)  # content differing by 25 > tolerance, near the corner
    assert content_box(Image.fromarray(a), 8) == (100, 100, 796, 591)


def test_exif_rotation_applied():
    r = rewrite_bytes(C.exif_rotated_jpeg(1600, 1000, orientation=6))
    assert r.height > r.width  # displayed portrait
    im = np.asarray(out_image(r).convert("RGB")).astype(int)
    # orientation 6 = rotate 90 cw for display: stored left (red) ends on top
    top, bottom = im[: r.height // 4].mean(axis=(0, 1)), im[-r.height // 4:].mean(axis=(0, 1))
    assert top[0] > 150 and top[2] < 80
    assert bottom[2] > 150 and bottom[0] < 80


def test_cmyk_converted_to_rgb():
    r = rewrite_bytes(C.cmyk_jpeg(rgb=(200, 60, 30)))
    px = np.asarray(out_image(r).convert("RGB")).astype(int).reshape(-1, 3).mean(axis=0)
    assert np.abs(px - (200, 60, 30)).max() < 12


def test_flat_chart_goes_out_as_the_same_jpeg_as_everything_else():
    """Flat content used to go out as PNG (Pillow zlib level 1: 5-15x the JPEG's encode and
    2-4x its decode in the engine, at no OCR gain: docs/benchmarks/images.md); now JPEG 4:2:0."""
    im = Image.new("RGB", (1600, 1000), (255, 255, 255))
    from PIL import ImageDraw
    d = ImageDraw.Draw(im)
    for i, c in enumerate([(200, 40, 40), (40, 160, 40), (40, 40, 200), (230, 180, 0)]):
        d.rectangle([100 + i * 350, 900 - 180 * (i + 1), 350 + i * 350, 900], fill=c)
    d.rectangle([0, 0, 1599, 999], outline=(0, 0, 0), width=4)
    r = rewrite_bytes(C.save(im, "PNG"), Policy(trim_borders=False))
    assert r.mime == "image/jpeg" and r.url.startswith("data:image/jpeg;base64,")
    out = Image.open(io.BytesIO(r.data))
    assert out.format == "JPEG" and [c[1:3] for c in out.layer] == [(2, 2), (1, 1), (1, 1)]  # 4:2:0
    ref = np.asarray(im.resize((r.width, r.height), Image.Resampling.BICUBIC)).astype(float)
    assert psnr(np.asarray(out.convert("RGB")), ref) >= 30.0


def test_palette_transparency_composited_on_white():
    r = rewrite_bytes(C.palette_png_transparent(), Policy(trim_borders=False))
    im = np.asarray(out_image(r).convert("RGB")).astype(int)
    # corners white (transparent), centre green
    assert (im[0, 0] > 245).all()
    c = im[im.shape[0] // 2, im.shape[1] // 2]
    assert c[1] > 140 and c[0] < 30


def test_palette_transparency_trimmed_square():
    r = rewrite_bytes(C.palette_png_transparent())
    assert r.trimmed  # white composite -> uniform border around the green square


def test_16bit_gray_scaled_not_clipped():
    src = C.png16_gray()
    im, _ = decode(src, "png")
    a = np.asarray(im).astype(int)
    assert im.mode == "RGB"
    assert a[:, 0].max() < 5 and a[:, -1].min() > 250 and 100 < a[:, a.shape[1] // 2, 0].mean() < 155


@pytest.mark.parametrize("make,fmt", [(C.gray_jpeg, "jpeg"), (C.webp, "webp"), (C.bmp, "bmp"), (C.tiff, "tiff")])
def test_other_formats(make, fmt):
    src = make()
    assert probe(src, 64_000_000).format == fmt
    r = rewrite_bytes(src)
    assert max(r.width, r.height) == 768 and out_image(r).mode == "RGB"


def test_animated_gif_first_frame():
    r = rewrite_bytes(C.animated_gif())
    px = np.asarray(out_image(r).convert("RGB")).astype(int)[10, 10]
    assert px[0] > 200 and px[1] < 40 and px[2] < 40


@pytest.mark.parametrize("data,code", [
    (b"", "image_empty"),
    (C.TEXT_AS_IMAGE, "unsupported_image_format"),
    (C.SVG, "unsupported_image_format"),
    (C.bomb_png(), "image_too_large"),
])
def test_hostile_inputs_refused_at_probe(data, code):
    with pytest.raises(ImageError) as e:
        rewrite_bytes(data)
    assert e.value.code == code


def test_bomb_is_cheap():
    import time
    bomb = C.bomb_png(30000)
    assert len(bomb) < 10_000
    t0 = time.perf_counter()
    with pytest.raises(ImageError):
        rewrite_bytes(bomb)
    assert time.perf_counter() - t0 < 0.05


def test_truncated_jpeg_refused():
    src = C.photo_jpeg(1920, 1080)
    with pytest.raises(ImageError) as e:
        rewrite_bytes(src[: len(src) // 2])
    assert e.value.code == "image_corrupt"


def test_base64_with_newlines():
    import base64
    src = C.photo_jpeg(600, 400)
    b64 = base64.encodebytes(src).decode()  # 76-char lines
    assert "\n" in b64
    assert decode_data_uri("data:image/jpeg;base64," + b64) == src
    with pytest.raises(ImageError) as e:
        decode_data_uri("data:image/jpeg;base64,@@@not base64@@@")
    assert e.value.code == "invalid_image_base64"


def test_header_probe_matches_pillow():
    for src in (C.photo_jpeg(1921, 1079), C.photo_jpeg(1000, 700, progressive=True), C.screenshot_png(1000, 600),
                C.webp(900, 500), C.animated_gif(640, 480), C.bmp(333, 222), C.tiff(321, 123),
                C.save(Image.new("RGB", (801, 401)), "WEBP", lossless=True)):
        h = probe(src, 64_000_000)
        assert (h.width, h.height) == Image.open(io.BytesIO(src)).size


# -- hostile corpus under hard bounds (one forked child per case: RLIMIT_AS, RLIMIT_CPU) --

def _bounded(*args: str) -> list[dict]:
    import json
    import os
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, os.path.join(here, "bounded.py"), *args], capture_output=True,
                         text=True, timeout=240, env={**os.environ, "PYTHONPATH": os.path.dirname(here)})
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_hostile_corpus_refused_within_time_and_memory_bounds():
    """Every hostile case is refused with its code; each child spends < 0.5 s of CPU and
    grows < 64 MB (before the fixes: 1.2 GB for a 29-byte GIF, 2-5 s for chunk floods)."""
    results = _bounded("--as-mb", "768", "--cpu-s", "5")
    assert len(results) >= 30
    for r in results:
        assert r["result"] in r["expected"], r
        assert r["cpu_s"] < 0.5, r
        assert r["rss_growth_mb"] < 64, r


def test_bounds_harness_sees_a_real_allocation():
    """The harness measures: a legitimate 48 MP PNG decode shows its memory, and a tight
    address-space limit turns it into a refusal instead of a crash. In a fresh interpreter:
    a test process's freed-but-resident heap would absorb the child's allocation."""
    [ok] = _bounded("--control", "--as-mb", "1024", "--cpu-s", "10", "--max-decode-mb", "0")
    assert ok["result"] == "accepted" and ok["rss_growth_mb"] > 100, ok
    [tight] = _bounded("--control", "--as-mb", "64", "--cpu-s", "10", "--max-decode-mb", "0")
    assert tight["result"] == "image_too_large", tight
    # and the memory cap refuses it before the decode allocates: nothing grows
    [capped] = _bounded("--control", "--as-mb", "1024", "--cpu-s", "10", "--max-decode-mb", "256")
    assert capped["result"] == "image_too_large" and "images.max_decode_bytes" in capped["message"], capped
    assert capped["rss_growth_mb"] < 16 and capped["estimate_mb"] == 0, capped


@pytest.mark.parametrize("data", [C.gif_canvas_bomb(), C.gif_small_canvas_bomb()])
def test_gif_frame_outside_the_screen_is_measured_by_its_real_canvas(data):
    # the header declares a tiny image: within any budget, so it would have been forwarded
    assert probe(data, 64_000_000).width <= 16
    with pytest.raises(ImageError) as e:
        rewrite_bytes(data)
    assert e.value.code == "image_too_large" and "canvas" in str(e.value)


def test_gif_canvas_growth_within_the_limit_is_rewritten_to_its_real_size():
    # 16x16 screen, a frame at (1999, 999): the real image is 2000x1000 and gets the budget
    data = C._gif((16, 16), (1999, 999, 1, 1))
    r = rewrite_bytes(data)
    assert (r.source_width, r.source_height) == (2000, 1000)
    assert max(r.width, r.height) <= 768 and not r.passthrough


def test_pillow_backstop_is_on():
    from vlm_gateway.stages.images import decode as D
    assert Image.MAX_IMAGE_PIXELS is not None and Image.MAX_IMAGE_PIXELS >= 64_000_000
    D.ensure_backstop(200_000_000)
    assert Image.MAX_IMAGE_PIXELS >= 200_000_000


def test_tiff_pages_counted_without_walking_the_chain_quadratically():
    import time
    data = C.tiff_ifd_chain(1000)  # within the page cap: accepted, first page, counted
    t0 = time.process_time()
    r = rewrite_bytes(data)
    assert time.process_time() - t0 < 0.5
    assert "frames:first-of-1000" in r.conversions
    r = rewrite_bytes(C.tiff_ifd_loop())  # a loop ends the chain, as in Pillow
    assert "frames:first-of-2" in r.conversions


@pytest.mark.parametrize("name,data", [
    ("png", C.screenshot_png(600, 400, (40, 20))), ("jpeg", C.photo_jpeg(600, 400)), ("webp", C.webp(600, 400)),
    ("gif", C.save(Image.new("P", (300, 200), 3), "GIF")),
])
def test_small_images_are_verified_before_passing_through(name, data):
    r = rewrite_bytes(data)
    assert r.passthrough and r.data is data  # valid: byte for byte
    for cut in (0.3, 0.6, 0.95):
        with pytest.raises(ImageError) as e:
            rewrite_bytes(data[: int(len(data) * cut)])
        assert e.value.code == "image_corrupt", (name, cut)


def test_corrupted_gif_pixel_data_is_caught():
    """GIF blocks have no checksum: flipping the LZW bytes keeps every block intact, so only
    a decode finds it."""
    im = Image.fromarray(np.random.default_rng(2).integers(0, 255, (100, 150)).astype(np.uint8)).convert("P")
    b = io.BytesIO()
    im.save(b, "GIF")
    good = b.getvalue()
    assert rewrite_bytes(good).passthrough
    d = bytearray(good)
    i = d.index(0x2C, 13 + 3 * 2 ** ((d[10] & 7) + 1) if d[10] & 0x80 else 13)  # image descriptor
    j = i + 10 + 1 + (3 * 2 ** ((d[i + 9] & 7) + 1) if d[i + 9] & 0x80 else 0)  # LZW data sub-blocks
    while d[j]:
        for k in range(j + 1, j + 1 + d[j]):
            d[k] ^= 0xA5
        j += d[j] + 1
    with pytest.raises(ImageError) as e:
        rewrite_bytes(bytes(d))
    assert e.value.code == "image_corrupt"


def test_corrupted_png_chunk_caught_by_its_crc():
    data = bytearray(C.screenshot_png(600, 400, (40, 20)))
    data[len(data) // 2] ^= 0x55
    with pytest.raises(ImageError) as e:
        rewrite_bytes(bytes(data))
    assert e.value.code == "image_corrupt" and "CRC" in str(e.value)


def test_what_is_sent_carries_no_metadata_of_the_source():
    """No ICC profile (LittleCMS's sRGB profile of a converted image holds its creation time:
    the same source gave other bytes in another process), no JPEG comment, no EXIF."""
    p3 = rewrite_bytes(C.p3_tagged("png"))
    assert not p3.passthrough and "icc_profile" not in Image.open(io.BytesIO(p3.data)).info
    src = C.save(Image.fromarray(C.photo_array(1600, 1200)), "JPEG", quality=90, comment=b"client note",
                 exif=Image.Exif().tobytes())
    r = rewrite_bytes(src)
    out = Image.open(io.BytesIO(r.data))
    assert not r.passthrough and "comment" not in out.info and "exif" not in out.info
    rot = rewrite_bytes(C.exif_rotated_jpeg())
    assert not set(Image.open(io.BytesIO(rot.data)).info) & {"icc_profile", "comment", "exif"}


@pytest.mark.parametrize("src,policy", [
    (C.desktop_screenshot_png(1920, 1080), Policy().capped(1280)),   # libvips resize from the full decode
    (C.photo_jpeg(1920, 1080), Policy(max_long_side=1568, budget="client")),  # Pillow decode, read in place
    (C.screenshot_png(), Policy()),                                   # trimmed
    (C.desktop_screenshot_png(2880, 1800), Policy()),                 # estimate in bands of a big image
])
def test_the_bytes_do_not_depend_on_the_threads_a_job_was_granted(src, policy):
    """More threads per image (spare cores) split the work, never the result: the L2 prefix
    caches need the same bytes for the same source, however busy the machine was."""
    from vlm_gateway.stages.images import spare
    outs = set()
    try:
        for n in (1, 2, 4, 3):
            spare.set_granted(n)
            r = rewrite_bytes(src, policy)
            assert not r.passthrough
            outs.add((r.data, r.width, r.height, r.budget))
    finally:
        spare.set_granted(1)
    assert len(outs) == 1


def test_the_estimates_bands_do_not_wait_for_busy_helpers():
    """A band no helper has started is made by the job's own thread: with every helper busy
    the estimate still completes at once, with the same answer."""
    import threading

    from vlm_gateway.stages.images import spare
    from vlm_gateway.stages.images.legibility import estimate
    from vlm_gateway.stages.images.rewrite import estimate_in_bands
    im = C.desktop_screenshot(2880, 1800)
    gate = threading.Event()
    pool = spare.helpers(4)
    blockers = [pool.submit(gate.wait, 30) for _ in range(pool._max_workers)]
    try:
        assert estimate_in_bands(im, 1.0, None, 4) == estimate(im, 1.0)
    finally:
        gate.set()
    assert all(b.result() for b in blockers)
