"""A burst of large images keeps the image pool busy but never stalls text-only
requests: decode/resize/encode run off the event loop. The check is on ordering
(every text request finishes while the image burst is still being worked
through), not on absolute times."""

from __future__ import annotations

import asyncio
import base64
import re
import time

import httpx

from conftest import SIM_MODEL
from PIL import Image

from image_corpus import photo_array, save
from vlm_gateway.data_uri import payload_bytes
from waiting import async_wait_until

N_IMAGES = 12


async def test_large_image_burst_does_not_stall_text_requests(servers):
    sim = servers.sim(profile="fast")
    # one rewrite thread: the burst is worked through one 12 MP image at a time
    gw = servers.gateway({"images": {"pool_workers": 1, "max_queue": 64}, "cache": {"enabled": False}},
                         backends=[sim])
    # one 12 MP photo, encoded at different qualities: distinct bytes, so every one is an L1 miss
    im = Image.fromarray(photo_array(4032, 3024, 7))
    images = [save(im, "JPEG", quality=80 + i) for i in range(N_IMAGES)]
    urls = ["data:image/jpeg;base64," + base64.b64encode(b).decode() for b in images]
    done: dict[str, float] = {}

    async def burst_taken_in(c: httpx.AsyncClient) -> bool:
        # the image stage holds each data: image's bytes from when it takes the request in until
        # the request ends: held now + answered = every image means the whole burst reached it
        text = (await c.get(gw.url + "/metrics")).text
        held = float(re.search(r"^vlm_gateway_media_bytes_in_flight ([0-9.e+]+)$", text, re.M).group(1))
        answered = sum(payload_bytes(u) for i, u in enumerate(urls) if f"image{i}" in done)
        return held + answered >= sum(payload_bytes(u) for u in urls)

    async def image_request(c: httpx.AsyncClient, i: int) -> int:
        url = urls[i]
        r = await c.post("/chat/completions", json={"model": SIM_MODEL, "max_tokens": 1, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "describe"},
                                         {"type": "image_url", "image_url": {"url": url}}]}]})
        done[f"image{i}"] = time.monotonic()
        return r.status_code

    async def text_requests(c: httpx.AsyncClient) -> list[int]:
        await async_wait_until(lambda: burst_taken_in(c), "the image burst is queued in the gateway", 60)
        codes = []
        for i in range(5):
            r = await c.post("/chat/completions", json={"model": SIM_MODEL, "max_tokens": 1,
                                                         "messages": [{"role": "user", "content": f"text {i}"}]})
            codes.append(r.status_code)
        done["text"] = time.monotonic()
        return codes

    async with httpx.AsyncClient(base_url=gw.base_url, timeout=120,
                                 limits=httpx.Limits(max_connections=N_IMAGES + 4)) as c:
        results = await asyncio.gather(*(image_request(c, i) for i in range(N_IMAGES)), text_requests(c))
    assert results[:N_IMAGES] == [200] * N_IMAGES
    assert results[-1] == [200] * 5
    # decoding on the event loop would serve the text requests only after the queued decodes;
    # off the loop they finish while most of the burst is still waiting for the one thread
    images_before_text = sum(1 for k, v in done.items() if k.startswith("image") and v < done["text"])
    assert images_before_text <= N_IMAGES // 2, f"text-only requests waited behind {images_before_text} images"
