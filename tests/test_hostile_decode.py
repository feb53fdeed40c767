"""Files that make a decoder allocate what they declare (#32, class 1), against a running
gateway over HTTP: every case of the image and video corpora of such files
(``image_corpus.hostile()``, ``video_corpus.hostile_tables()``) is refused with its own
4xx on /v1/chat/completions (data: URIs; with the rewrite switched off by the policy
headers too) and on the /ui playground, nothing reaches the engine, and the gateway
process's peak RSS (VmHWM, from /proc) grows less than 200 MB over all of them. Before
the fixes single cases cost it 0.25 to 1.5 GB. Also: a decode's memory is reserved from
the process bound (503, given back), and valid images of every bit depth (class 8) reach
the engine as they look."""

from __future__ import annotations

import base64
import io
import os

import httpx
import numpy as np
import pytest
from PIL import Image

from conftest import SIM_MODEL, until
import image_corpus as C

av = pytest.importorskip("av")
import video_corpus as V  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")

# the image corpus's cases of this class: sizes within the pixel limit, decodes far above 200 MB,
# grids and coded frames that ask for more than they declare
IMAGE_CASES = [name for name in C.hostile() if name.startswith((
    "png_rgba_64mp", "apng_", "gif_64mp", "gif_36mp", "webp_animated_", "jpeg_multiscan", "avif_grid_", "avif_codes",
    "heic_grid_"))]
# with the rewrite off an image is only verified, at its own size: an opaque one-frame GIF in its
# palette (2 bytes a canvas pixel, within images.max_decode_bytes), then sent as it came; an
# animation's first frame is converted at its own size, within the cap too (checked apart below)
VERIFIED_WHEN_OFF = {"gif_64mp_canvas_tiny_frame"}
CONVERTED_WHEN_OFF = {"gif_36mp_canvas_tiny_frames"}


def _hwm_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


def _uri(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def chat(gw, part: dict, headers: dict | None = None) -> httpx.Response:
    body = {"model": SIM_MODEL, "max_tokens": 2,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}, part]}]}
    return httpx.post(gw.base_url + "/chat/completions", json=body, headers=headers or {}, timeout=60)


def in_flight(gw, what: str = "media") -> float:
    for line in httpx.get(gw.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(f"vlm_gateway_{what}_bytes_in_flight "):
            return float(line.split()[1])
    raise AssertionError(f"no vlm_gateway_{what}_bytes_in_flight gauge")


@pytest.fixture(scope="module")
def env(module_servers):
    sim = module_servers.sim()
    gw = module_servers.gateway({"images": {"pool_workers": 1}, "video": {"pool_workers": 1}}, backends=[sim])
    return sim, gw


def _warm(gw) -> None:
    """The decoders' plugins, pool threads and arenas, before the peak is read."""
    for part in ({"type": "image_url", "image_url": {"url": _uri(C.photo_jpeg(1600, 1200), "image/jpeg")}},
                 {"type": "image_url", "image_url": {"url": _uri(C.avif(600, 400), "image/avif")}},
                 {"type": "image_url", "image_url": {"url": _uri(C.rgba_png(900, 600), "image/png")}},
                 {"type": "video_url", "video_url": {"url": _uri(V.motion_clip(1, 160, 120, 15), "video/mp4")}}):
        assert chat(gw, part).status_code == 200


def test_every_case_is_a_4xx_in_bounded_memory_on_every_route(env):
    sim, gw = env
    _warm(gw)
    n = len(sim.sim_requests())
    hwm0 = _hwm_mb(gw.proc.pid)
    images, videos = C.hostile(), V.hostile_tables()
    for name in IMAGE_CASES:
        data, codes = images[name]
        part = {"type": "image_url", "image_url": {"url": _uri(data, "application/octet-stream")}}
        for headers in ({}, {"x-vlm-gateway-image-policy": "off"}):
            if headers and name in VERIFIED_WHEN_OFF | CONVERTED_WHEN_OFF:
                continue
            r = chat(gw, part, headers)
            assert r.status_code == 400, (name, headers, r.text[:300])
            err = r.json()["error"]
            assert err["code"] in codes and err["param"] == "messages[0].content[1].image_url", (name, err)
        r = httpx.post(gw.url + "/ui/api/rewrite", json={"image": _uri(data, "image/png")}, timeout=60)
        assert r.status_code == 400, (name, r.text[:300])
        err = r.json()["error"]
        # the playground's own header probe names the structural refusals invalid_image
        assert err["code"] in codes | {"invalid_image"} and err["param"] == "image", (name, err)
    for name, (data, codes) in videos.items():
        part = {"type": "video_url", "video_url": {"url": _uri(data, "video/mp4")}}
        r = chat(gw, part)
        assert r.status_code == 400, (name, r.text[:300])
        err = r.json()["error"]
        assert err["code"] in codes and err["param"] == "messages[0].content[1].video_url", (name, err)
        r = httpx.post(gw.url + "/ui/api/rewrite-video", json={"video": _uri(data, "video/mp4")}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["code"] in codes, (name, r.text[:300])
        if "too_many_frames" in "".join(codes) or name.startswith("mp4_8192"):
            # what the container declares is refused also when the rewrite is off (the frames
            # inside a stream are the rewrite's to decode)
            r = chat(gw, part, {"x-vlm-gateway-video-policy": "off"})
            assert r.status_code == 400 and r.json()["error"]["code"] in codes, (name, r.text[:300])
    grew = _hwm_mb(gw.proc.pid) - hwm0
    assert grew < 200, f"the gateway's peak RSS grew {grew:.0f} MB over the hostile cases"
    assert len(sim.sim_requests()) == n
    # what the rewrite off admits is sent, and holds no more than the memory cap while checked
    for name in sorted(VERIFIED_WHEN_OFF | CONVERTED_WHEN_OFF):
        part = {"type": "image_url", "image_url": {"url": _uri(images[name][0], "image/gif")}}
        r = chat(gw, part, {"x-vlm-gateway-image-policy": "off"})
        assert r.status_code == 200, (name, r.text[:300])
        conv = r.headers.get("x-vlm-gateway-image-converted", "")
        assert ("frames:first-of" in conv) == (name in CONVERTED_WHEN_OFF), (name, conv)
    grew = _hwm_mb(gw.proc.pid) - hwm0
    assert grew < 256 + 20, f"the gateway's peak RSS grew {grew:.0f} MB, above images.max_decode_bytes"
    assert len(sim.sim_requests()) == n + len(VERIFIED_WHEN_OFF | CONVERTED_WHEN_OFF)
    assert until(lambda: in_flight(gw) == 0 and in_flight(gw, "decode") == 0)


def test_a_decode_is_reserved_from_the_process_bound_and_given_back(module_servers):
    """What decodes hold is bounded per process too: an image whose decode needs more than
    is left is a 503 to retry, not a process that grows; its reservation is given back."""
    sim = module_servers.sim()
    gw = module_servers.gateway({"images": {"max_decode_bytes_in_flight": 24 * 2**20}}, backends=[sim])
    big = C.rgba_png(2000, 1500)  # 0.1 MB of PNG, about 40 MB to decode and composite
    r = chat(gw, {"type": "image_url", "image_url": {"url": _uri(big, "image/png")}})
    assert r.status_code == 503, r.text
    err = r.json()["error"]
    assert err["code"] == "decode_bytes_in_flight" and r.headers["retry-after"] == "1"
    assert "images.max_decode_bytes_in_flight" in err["message"]
    assert err["param"] == "messages[0].content[1].image_url"
    assert until(lambda: in_flight(gw, "decode") == 0 and in_flight(gw) == 0)
    r = chat(gw, {"type": "image_url", "image_url": {"url": _uri(C.rgba_png(900, 600), "image/png")}})
    assert r.status_code == 200, r.text
    assert until(lambda: in_flight(gw, "decode") == 0)


@pytest.mark.parametrize("kind", ["png16_rgb", "png16_grey_alpha", "png4_palette", "png2_grey", "tiff16_rgb"])
def test_every_bit_depth_reaches_the_engine_as_it_looks(env, kind):
    """#32 class 8: the 2000x1500 48-bit PNG was a 400 image_corrupt."""
    sim, gw = env
    data, left, right = C.bit_depth(kind, 2000, 1500)
    r = chat(gw, {"type": "image_url", "image_url": {"url": _uri(data, "image/png")}})
    assert r.status_code == 200, r.text
    body = sim.sim_requests()[-1]
    [url] = [p["image_url"]["url"] for m in body["messages"] if isinstance(m.get("content"), list)
             for p in m["content"] if p.get("type") == "image_url"]
    sent = np.asarray(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB")).astype(int)
    assert sent.shape[:2] == (576, 768)
    got_left, got_right = sent[288, 192], sent[288, 576]
    assert np.abs(got_left - left).max() <= 3 and np.abs(got_right - right).max() <= 3, (got_left, got_right)
