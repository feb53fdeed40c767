"""Fetched bytes count against the per-request totals, and the media bytes one
process holds are bounded (503 + Retry-After past the bound, given back when the
request ends). Real gateway and simulator processes, a local origin."""

from __future__ import annotations

import base64
import concurrent.futures
import io
import re

import httpx
import numpy as np
from PIL import Image

from conftest import SIM_MODEL, until
from media_server import Origin
import image_corpus as C

MB = 1024 * 1024


def noise_jpeg(min_bytes: int) -> bytes:
    """A valid JPEG of at least ``min_bytes`` (noise does not compress)."""
    side = 256
    while True:
        px = np.random.default_rng(side).integers(0, 256, (side, side, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(px).save(buf, "JPEG", quality=95)
        if buf.tell() >= min_bytes:
            return buf.getvalue()
        side += 128


JPEG_1M = noise_jpeg(MB)
JPEG_15M = noise_jpeg(3 * MB // 2)


def chat(gw, parts: list[dict]) -> httpx.Response:
    body = {"model": SIM_MODEL, "max_tokens": 4,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "describe"}, *parts]}]}
    return httpx.post(gw.base_url + "/chat/completions", json=body, timeout=60)


def in_flight(gw) -> float:
    m = re.search(r"^vlm_gateway_media_bytes_in_flight (\S+)$", httpx.get(gw.url + "/metrics").text, re.M)
    return float(m.group(1))


def test_many_urls_in_a_small_request_count_against_the_total(servers):
    sim = servers.sim()
    gw = servers.gateway({"images": {"allow_networks": ["127.0.0.1/32"]},
                          "limits": {"max_total_image_bytes": 3 * MB, "max_total_video_bytes": 3 * MB,
                                     "max_videos_per_request": 16}}, backends=[sim])
    with Origin() as o:
        o.put("/1m.jpg", JPEG_1M, "image/jpeg")
        # 16 URLs of 1 MiB each (a ~2 KB request): stops once 3 MiB have arrived
        parts = [{"type": "image_url", "image_url": {"url": o.base + f"/1m.jpg?i={i}"}} for i in range(16)]
        r = chat(gw, parts)
        assert r.status_code == 413, r.text
        err = r.json()["error"]
        assert err["code"] == "image_bytes_too_large" and "limits.max_total_image_bytes" in err["message"]
        assert err["param"].startswith("messages[0].content[") and err["param"].endswith("].image_url")
        # the same for video, however the parts are written
        parts = [{"type": "video_url", "video_url": o.base + f"/1m.jpg?v={i}"} for i in range(16)]
        r = chat(gw, parts)
        assert r.status_code == 413 and r.json()["error"]["code"] == "video_bytes_too_large", r.text
    assert sim.sim_requests() == []
    assert until(lambda: in_flight(gw) == 0)


def test_bytes_in_flight_bounded_across_concurrent_requests(servers):
    sim = servers.sim()
    gw = servers.gateway({"images": {"allow_networks": ["127.0.0.1/32"], "max_fetch_bytes": 2 * MB},
                          "limits": {"max_media_bytes_in_flight": 3 * MB}}, backends=[sim])
    with Origin() as o:
        o.put("/1m.jpg", JPEG_1M, "image/jpeg")
        o.put("/1.5m.jpg", JPEG_15M, "image/jpeg")

        # one URL of 1.5 MiB arriving over ~1.2 s per request: two fit, the third does not
        def one(i):
            return chat(gw, [{"type": "image_url",
                              "image_url": {"url": o.base + f"/slow/1.5m.jpg?delay=0.05&c={i}"}}])

        with concurrent.futures.ThreadPoolExecutor(6) as ex:
            results = list(ex.map(one, range(6)))
        busy = [r for r in results if r.status_code == 503]
        assert busy, [r.status_code for r in results]
        for r in busy:
            assert r.json()["error"]["code"] == "media_bytes_in_flight"
            assert r.headers["retry-after"] == "1"
            assert "limits.max_media_bytes_in_flight" in r.json()["error"]["message"]
        # the others got through, and nothing else failed
        assert all(r.status_code in (200, 503) for r in results), [(r.status_code, r.text[:120]) for r in results]
        assert any(r.status_code == 200 for r in results)
        # many URLs in one request hit the same bound
        r = chat(gw, [{"type": "image_url", "image_url": {"url": o.base + f"/1m.jpg?m={i}"}} for i in range(8)])
        assert r.status_code == 503 and r.json()["error"]["code"] == "media_bytes_in_flight", r.text
    # every request gave its bytes back: a real image goes through afterwards
    assert until(lambda: in_flight(gw) == 0), in_flight(gw)
    big = C.photo_jpeg(1920, 1080)
    r = chat(gw, [{"type": "image_url",
                   "image_url": {"url": "data:image/jpeg;base64," + base64.b64encode(big).decode()}}])
    assert r.status_code == 200, r.text
    assert until(lambda: in_flight(gw) == 0)
