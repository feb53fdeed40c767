"""The image stage end to end: real gateway processes in front of the simulator
in echo mode; assertions on what the engine actually received."""

from __future__ import annotations

import base64
import http.server
import io
import threading

import httpx
import numpy as np
import openai
import pytest
from PIL import Image

from conftest import SIM_MODEL
import image_corpus as C

BIG = C.photo_jpeg(1920, 1080)
SMALL = C.photo_jpeg(500, 300)


def uri(data: bytes, mime: str = "image/jpeg") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def image_part(url: str, detail: str | None = None) -> dict:
    iu = {"url": url}
    if detail:
        iu["detail"] = detail
    return {"type": "image_url", "image_url": iu}


def chat(gw, parts: list[dict], headers: dict | None = None) -> httpx.Response:
    body = {"model": SIM_MODEL, "max_tokens": 4,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "describe"}, *parts]}]}
    return httpx.post(gw.base_url + "/chat/completions", json=body, headers=headers or {}, timeout=30)


def received_images(sim) -> list[str]:
    body = sim.sim_requests()[-1]
    return [p["image_url"]["url"] for m in body["messages"] if isinstance(m.get("content"), list)
            for p in m["content"] if p.get("type") == "image_url"]


def decoded(url: str) -> Image.Image:
    assert url.startswith("data:image/")
    return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        if self.path == "/big.jpg":
            self.send_response(200)
            self.send_header("content-type", "application/octet-stream")
            self.send_header("content-length", str(len(BIG)))
            self.end_headers()
            self.wfile.write(BIG)
        elif self.path == "/to-private":
            self.send_response(302)
            self.send_header("location", "http://169.254.169.254/latest/meta-data")
            self.end_headers()
        else:
            self.send_response(404)
            self.end_headers()

    def log_message(self, *a):
        pass


@pytest.fixture(scope="module")
def image_server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


@pytest.fixture(scope="module")
def env(module_servers):
    sim = module_servers.sim()
    # the local image server is exempt from the private-address guard as an internal store
    gw = module_servers.gateway({"images": {"allow_networks": ["127.0.0.1/32"],
                                            "models": {"qwen2-style": {"grid_factor": 28}}}}, backends=[sim])
    return sim, gw


def test_rewrite_and_passthrough_seen_by_engine(env):
    sim, gw = env
    small_url = uri(SMALL)
    r = chat(gw, [image_part(uri(BIG)), image_part(small_url)])
    assert r.status_code == 200, r.text
    assert r.headers["x-vlm-gateway-visual-tokens"] == f"before={2040 + 144};after={336 + 144}"
    big_sent, small_sent = received_images(sim)
    im = decoded(big_sent)
    assert im.size == (768, 448) and im.format == "JPEG"
    assert small_sent == small_url  # pass-through: the original string, byte for byte


def test_same_image_same_bytes_and_l1_hit(env):
    sim, gw = env
    src = uri(C.photo_jpeg(1600, 1200, seed=9))
    chat(gw, [image_part(src)])
    first = received_images(sim)[0]
    metrics_before = httpx.get(gw.url + "/metrics").text
    chat(gw, [image_part(src)])
    assert received_images(sim)[0] == first
    hits = [ln for ln in httpx.get(gw.url + "/metrics").text.splitlines()
            if ln.startswith('vlm_gateway_cache_hits_total{level="l1"}')]
    before = [ln for ln in metrics_before.splitlines() if ln.startswith('vlm_gateway_cache_hits_total{level="l1"}')]
    assert float(hits[0].split()[-1]) >= float(before[0].split()[-1]) + 1 if before else hits


def test_policy_header_and_detail(env):
    sim, gw = env
    src = uri(BIG)
    r = chat(gw, [image_part(src)], headers={"x-vlm-gateway-image-policy": "off"})
    assert r.status_code == 200 and received_images(sim) == [src]
    assert r.headers["x-vlm-gateway-visual-tokens"] == "before=2040;after=2040"
    chat(gw, [image_part(src)], headers={"x-vlm-gateway-image-policy": "448"})
    assert max(decoded(received_images(sim)[0]).size) <= 448
    chat(gw, [image_part(src, detail="low")])
    assert max(decoded(received_images(sim)[0]).size) <= 448
    chat(gw, [image_part(src, detail="high")])
    assert decoded(received_images(sim)[0]).size == (1280, 704)
    r = chat(gw, [image_part(src)], headers={"x-vlm-gateway-image-policy": "huge"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_image_policy"


@pytest.mark.parametrize("data,code", [
    (uri(BIG[: len(BIG) // 2]), "image_corrupt"),
    (uri(C.SVG, "image/svg+xml"), "unsupported_image_format"),
    (uri(C.bomb_png(), "image/png"), "image_too_large"),
    (uri(b""), "image_empty"),
    (uri(C.TEXT_AS_IMAGE, "image/png"), "unsupported_image_format"),
    ("data:image/png;base64,!!!!", "invalid_image_base64"),
    ("ftp://example.com/a.png", "invalid_image_url"),
])
def test_bad_images_are_400_naming_the_part(env, data, code):
    sim, gw = env
    n = len(sim.sim_requests())
    r = chat(gw, [image_part(uri(SMALL)), image_part(data)])
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == code
    assert err["param"] == "messages[0].content[2].image_url"
    assert len(sim.sim_requests()) == n  # nothing reached the engine


def test_url_fetched_and_rewritten(env, image_server):
    sim, gw = env
    r = chat(gw, [image_part(image_server + "/big.jpg")])
    assert r.status_code == 200, r.text
    assert decoded(received_images(sim)[0]).size == (768, 448)
    assert r.headers["x-vlm-gateway-visual-tokens"] == "before=2040;after=336"
    r = chat(gw, [image_part(image_server + "/to-private")])
    assert r.status_code == 400 and r.json()["error"]["code"] == "image_url_private_address"


def test_openai_sdk_client(env):
    sim, gw = env
    client = openai.OpenAI(base_url=gw.base_url, api_key="x")
    raw = client.chat.completions.with_raw_response.create(
        model=SIM_MODEL, max_tokens=4,
        messages=[{"role": "user", "content": [{"type": "text", "text": "hi"},
                                               {"type": "image_url", "image_url": {"url": uri(BIG)}}]}])
    assert raw.headers["x-vlm-gateway-visual-tokens"] == "before=2040;after=336"
    assert raw.parse().choices[0].message.content
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=SIM_MODEL, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": uri(C.SVG, "image/svg+xml")}}]}])
    assert e.value.body["param"] == "messages[0].content[0].image_url"


def test_guard_on_and_backend_cap(servers, image_server):
    sim = servers.sim()
    gw = servers.gateway({
        "profiles": {"small-gpu": {"base": "h200", "image_max_long_side": 512, "image_max_pixels": 64_000_000}},
        "backends": [{"url": sim.base_url, "name": "small", "engine": "sim", "profile": "small-gpu"}],
    })
    r = chat(gw, [image_part(image_server + "/big.jpg")])
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "image_url_private_address" and err["param"] == "messages[0].content[1].image_url"
    before = rewrites(gw)
    r = chat(gw, [image_part(uri(BIG))])
    assert r.status_code == 200, r.text
    assert max(decoded(received_images(sim)[0]).size) <= 512
    assert r.headers["x-vlm-gateway-visual-tokens"].startswith("before=2040;after=")
    # the only backend caps at 512: the image is decoded and rewritten once, already capped
    assert rewrites(gw) - before == 1


def rewrites(gw) -> float:
    text = httpx.get(gw.url + "/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("vlm_gateway_image_rewrite_seconds_count"))


def test_backends_with_different_caps_each_get_their_own(servers):
    small, big = servers.sim(), servers.sim()
    gw = servers.gateway({
        "profiles": {"cap-512": {"base": "h200", "image_max_long_side": 512},
                     "cap-1024": {"base": "h200", "image_max_long_side": 1024}},
        "routing": {"policy": "round_robin"},
        "backends": [{"url": small.base_url, "name": "small", "engine": "sim", "profile": "cap-512"},
                     {"url": big.base_url, "name": "big", "engine": "sim", "profile": "cap-1024"}],
    })
    for _ in range(2):
        r = chat(gw, [image_part(uri(BIG))])
        assert r.status_code == 200, r.text
    assert max(decoded(received_images(small)[0]).size) <= 512
    assert 512 < max(decoded(received_images(big)[0]).size) <= 1024


# -- formats phones and browsers send, through the OpenAI SDK ------------------------------

from vlm_gateway.stages.images import decode as D  # noqa: E402

CONVERTED = "x-vlm-gateway-image-converted"
_heif = pytest.mark.skipif(not D.HEIF, reason="pillow-heif (the 'heif' extra) is not installed")


def sdk_chat(gw, urls: list[str]):
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    content = [{"type": "text", "text": "describe"}] + [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return client.chat.completions.with_raw_response.create(
        model=SIM_MODEL, max_tokens=4, messages=[{"role": "user", "content": content}])


@pytest.mark.parametrize("name,make,mime,size,expect", [
    ("avif", lambda: C.avif(1600, 1200), "image/avif", (768, 576), "format:avif"),
    pytest.param("heic", lambda: C.heic(1600, 1200), "image/heic", (768, 576), "format:heif", marks=_heif),
    ("avif-small", lambda: C.avif(600, 400), "image/avif", (600, 400), "format:avif"),
    pytest.param("heic-small", lambda: C.heic(600, 400), "image/heic", (600, 400), "format:heif", marks=_heif),
    pytest.param("heic-10bit", lambda: C.heic_10bit(640, 480), "image/heic", (640, 480), "10-bit", marks=_heif),
    ("gif-animated", lambda: C.frames("GIF"), "image/gif", (640, 480), "frames:first-of-3"),
    ("apng", lambda: C.frames("PNG"), "image/png", (640, 480), "frames:first-of-3"),
    ("webp-animated", lambda: C.frames("WEBP"), "image/webp", (640, 480), "frames:first-of-3"),
    ("avif-animated", lambda: C.frames("AVIF"), "image/avif", (640, 480), "frames:first-of-3"),
    ("tiff", lambda: C.tiff(600, 400), "image/tiff", (600, 400), "format:tiff"),
    ("bmp", lambda: C.bmp(600, 400), "image/bmp", (600, 400), "format:bmp"),
    ("cmyk-jpeg", lambda: C.cmyk_jpeg(600, 400), "image/jpeg", (600, 400), "mode:CMYK"),
    ("exif-rotated", lambda: C.exif_rotated_jpeg(600, 400), "image/jpeg", (400, 600), "orientation:6"),
    ("png-16bit", lambda: C.png16_gray(600, 400), "image/png", (600, 400), "16-bit"),
    ("png-transparent", lambda: C.rgba_png(), "image/png", (600, 400), "alpha:white"),
])
def test_each_format_reaches_the_engine_as_jpeg_or_png(env, name, make, mime, size, expect):
    sim, gw = env
    raw = sdk_chat(gw, [uri(make(), mime)])
    assert raw.parse().choices[0].message.content
    sent = decoded(received_images(sim)[0])
    assert sent.format in ("JPEG", "PNG") and sent.size == size, (name, sent.format, sent.size)
    note = raw.headers[CONVERTED]
    assert note.startswith("messages[0].content[1].image_url=") and expect in note, note


def test_animation_rule_is_never_silent(env):
    sim, gw = env
    raw = sdk_chat(gw, [uri(SMALL), uri(C.frames("GIF", colours=((250, 0, 0), (0, 0, 250))), "image/gif")])
    assert raw.headers[CONVERTED] == "messages[0].content[2].image_url=frames:first-of-2"
    first = np.asarray(decoded(received_images(sim)[1]).convert("RGB")).astype(int)[100, 100]
    assert first[0] > 200 and first[2] < 40
    plain = sdk_chat(gw, [uri(SMALL)])
    assert CONVERTED not in plain.headers  # nothing converted: no header


def test_display_p3_image_arrives_with_the_srgb_values_a_viewer_shows(env):
    """A Display-P3-tagged PNG of a saturated red: the engine must get the sRGB numbers
    a colour-managed viewer displays (computed here with numpy from the published
    primaries), not the raw P3 numbers stored in the file."""
    sim, gw = env
    srgb = (250, 10, 10)
    raw_p3 = C.p3_encode(srgb)
    data = C.p3_tagged("PNG", srgb, 512, 384)
    assert Image.open(io.BytesIO(data)).convert("RGB").getpixel((5, 5)) == raw_p3
    raw = sdk_chat(gw, [uri(data, "image/png")])
    assert "icc:Display P3" in raw.headers[CONVERTED]
    got = np.asarray(decoded(received_images(sim)[0]).convert("RGB")).astype(int)
    assert np.abs(got - np.array(srgb)).max() <= 3, got[0, 0]
    assert np.abs(got[0, 0] - np.array(raw_p3)).max() > 20


def test_srgb_tagged_and_plain_small_images_still_pass_byte_for_byte(env):
    sim, gw = env
    urls = [uri(C.srgb_tagged_png(), "image/png"), uri(C.rgba_png(opaque=True), "image/png"), uri(SMALL)]
    raw = sdk_chat(gw, urls)
    assert received_images(sim) == urls
    assert CONVERTED not in raw.headers
    raw = sdk_chat(gw, urls)  # the second time from the verified memo
    assert received_images(sim) == urls


_HOSTILE = C.hostile()


@pytest.mark.parametrize("name", sorted(_HOSTILE))
def test_hostile_images_are_400_and_never_reach_the_engine(env, name):
    sim, gw = env
    data, codes = _HOSTILE[name]
    n = len(sim.sim_requests())
    r = chat(gw, [image_part(uri(SMALL)), image_part(uri(data, "application/octet-stream"))])
    assert r.status_code == 400, (name, r.text[:300])
    err = r.json()["error"]
    assert err["code"] in codes and err["param"] == "messages[0].content[2].image_url", (name, err)
    assert len(sim.sim_requests()) == n


@pytest.mark.parametrize("cut", [0.5, 0.75])
def test_half_a_base64_string_is_a_gateway_400(env, cut):
    sim, gw = env
    n = len(sim.sim_requests())
    b64 = base64.b64encode(C.screenshot_png(600, 400, (40, 20))).decode()
    r = chat(gw, [image_part("data:image/png;base64," + b64[: int(len(b64) * cut)])])
    assert r.status_code == 400
    assert r.json()["error"]["code"] in ("image_corrupt", "invalid_image_base64")
    assert len(sim.sim_requests()) == n


def test_playground_shows_conversions_and_runs_the_same_guards(env):
    sim, gw = env
    d = httpx.post(gw.url + "/ui/api/rewrite", json={"image": uri(C.avif(600, 400), "image/avif")}, timeout=30).json()
    assert d["rewritten"] is True and d["conversions"] == ["format:avif"]
    assert decoded(d["image"]).format in ("JPEG", "PNG")
    # the playground's own size probe goes through the structural caps too (no bare Image.open)
    r = httpx.post(gw.url + "/ui/api/rewrite", json={"image": uri(C.png_many_chunks(), "image/png")}, timeout=30)
    assert r.status_code == 400 and "chunks" in r.json()["error"]["message"]
