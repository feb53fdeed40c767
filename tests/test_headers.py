"""The header reference (docs/HEADERS.md, from vlm_gateway/core/headers.py) against what a
running gateway really sends: a tour of requests that sets every response header (images,
grounding, a converted image, a video, the three cache hits, rate limits and their 429, a
stream, errors, the plain routes), through a real gateway process and simulator.

- every header a response carries is in the registry (or is plain HTTP), every registered
  response header was seen, and the cache header's values are the documented ones;
- a browser page allowed by server.allowed_origins may read every one of them
  (access-control-expose-headers) and no request-only header is listed there;
- Server-Timing's parts add up to no more than the whole with several images rewritten in
  parallel;
- the reference is generated from the registry and every gateway header a doc names exists.
"""

from __future__ import annotations

import hashlib
import io
import re
from pathlib import Path

import httpx
import pytest
from PIL import Image, ImageDraw

from conftest import SIM_MODEL
from images import data_uri, photo_jpeg
from waiting import wait_until
from vlm_gateway.core import headers as H

ROOT = Path(__file__).resolve().parent.parent
ORIGIN = "http://app.example"
KEY, TIGHT = "key-headers-a", "key-headers-b"
# plain HTTP, set by uvicorn/Starlette or the CORS layer, not the gateway's own
STANDARD = {"content-type", "content-length", "date", "server", "transfer-encoding", "connection", "vary",
            "access-control-allow-origin", "access-control-expose-headers", "access-control-allow-credentials",
            "access-control-allow-methods", "access-control-allow-headers", "access-control-max-age",
            "location", "keep-alive", "etag", "last-modified", "accept-ranges", "content-disposition"}


def _sha(k: str) -> str:
    return hashlib.sha256(k.encode()).hexdigest()


def screenshot() -> bytes:
    im = Image.new("RGB", (1920, 1080), "white")
    d = ImageDraw.Draw(im)
    for i in range(40):
        d.text((40, 20 + 26 * i), f"row {i}: the quick brown fox jumps over the lazy dog 0123456789", fill="black")
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()


def animated_gif() -> bytes:
    frames = [Image.new("RGB", (320, 240), c) for c in ((250, 0, 0), (0, 0, 250))]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    return buf.getvalue()


def chat(content, **kw) -> dict:
    return {"model": SIM_MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": content}], **kw}


def img(uri: str) -> dict:
    return {"type": "image_url", "image_url": {"url": uri}}


@pytest.fixture(scope="module")
def tour(module_servers):
    sim = module_servers.sim(grounding="qwen3-vl")
    gw = module_servers.gateway({
        "server": {"allowed_origins": [ORIGIN]},
        "cache": {"semantic": True},
        "images": {"pool_workers": 4},
        "auth": {"tenants": [
            {"name": "a", "key_sha256": _sha(KEY), "requests_per_minute": 1000, "images_per_minute": 1000,
             "visual_tokens_per_minute": 10_000_000},
            {"name": "b", "key_sha256": _sha(TIGHT), "requests_per_minute": 1}]},
    }, backends=[sim])
    seen: dict[str, set[str]] = {}
    answers: list[httpx.Response] = []
    client = httpx.Client(base_url=gw.url, timeout=60, headers={"authorization": f"Bearer {KEY}", "origin": ORIGIN})

    def send(method: str, path: str, **kw) -> httpx.Response:
        r = client.request(method, path, **kw)
        for k, v in r.headers.items():
            seen.setdefault(k.lower(), set()).add(v)
        answers.append(r)
        return r

    shot, photo = data_uri(screenshot()), data_uri(photo_jpeg(1600, 1200), "image/jpeg")
    for path in ("/", "/health", "/ready", "/v1/models", "/metrics", "/openapi.json"):
        send("GET", path)
    q = "What is the total on this screenshot?"
    two = [{"type": "text", "text": q}, img(shot), img(photo)]
    assert send("POST", "/v1/chat/completions", json=chat(two, temperature=0)).status_code == 200
    assert send("POST", "/v1/chat/completions", json=chat(two, temperature=0)).headers[H.CACHE.name] in (
        "hit-exact", "miss")  # the entry is stored in the background
    wait_until(lambda: send("POST", "/v1/chat/completions", json=chat(two, temperature=0))
               .headers[H.CACHE.name] == "hit-exact", "an exact hit")
    spaced = [{"type": "text", "text": "  what is the TOTAL on this screenshot ? "}, img(shot), img(photo)]
    assert send("POST", "/v1/chat/completions", json=chat(spaced, temperature=0)).headers[H.CACHE.name] == \
        "hit-normalized"
    # semantic entries are indexed in the background: wait for it, then ask it reworded
    wait_until(lambda: re.search(r'vlm_gateway_cache_entries\{level="l3_semantic"\} [1-9]',
                                 client.get("/metrics").text), "the semantic entry is indexed", 30)
    para = [{"type": "text", "text": "On this screenshot, what is the total?"}, img(shot), img(photo)]
    assert send("POST", "/v1/chat/completions", json=chat(para, temperature=0)).headers[H.CACHE.name] == \
        "hit-semantic"
    # not deterministic: no lookup (the default cache.mode); streamed
    with client.stream("POST", "/v1/chat/completions", json=chat(two, stream=True)) as r:
        r.read()
        for k, v in r.headers.items():
            seen.setdefault(k.lower(), set()).add(v)
    send("POST", "/v1/chat/completions", json=chat([{"type": "text", "text": "gif"}, img(data_uri(animated_gif(),
                                                                                                   "image/gif"))]))
    av = pytest.importorskip("av")  # noqa: F841 - the video rewrite needs PyAV
    import video_corpus
    clip, _ = video_corpus.screen_recording(6, 640, 360, 10, seed=3)
    vid = {"type": "video_url", "video_url": {"url": data_uri(clip, "video/mp4")}}
    assert send("POST", "/v1/chat/completions", json=chat([{"type": "text", "text": "what changes?"}, vid])
                ).status_code == 200
    send("POST", "/v1/completions", json={"model": SIM_MODEL, "prompt": "hello", "max_tokens": 2})
    send("POST", "/v1/chat/completions", json={"model": SIM_MODEL})                      # 400
    send("POST", "/v1/chat/completions", json=chat("hi"), headers={"authorization": "Bearer nope"})  # 401
    tight = {"authorization": f"Bearer {TIGHT}"}
    send("POST", "/v1/chat/completions", json=chat("hi"), headers=tight)
    assert send("POST", "/v1/chat/completions", json=chat("hi"), headers=tight).status_code == 429
    return gw, seen, answers, client


def test_every_header_sent_is_registered_and_every_registered_one_is_sent(tour):
    _, seen, _, _ = tour
    ours = {k for k in seen if k not in STANDARD}
    unregistered = {k for k in ours if H.lookup(k) is None and k != "cache-control"}
    assert not unregistered, f"sent but not in core/headers.py: {sorted(unregistered)}"
    missing = [h.name for h in H.RESPONSE if not any(h.matches(k) for k in seen)]
    assert not missing, f"registered but never sent in the tour: {missing}"
    # the cache header's values are exactly the documented ones (all five seen)
    documented = set(re.findall(r"`([a-z-]+)`", H.CACHE.values))
    assert seen[H.CACHE.name] == documented == {"miss", "bypass", "hit-exact", "hit-normalized", "hit-semantic"}
    assert all(re.fullmatch(r"\d\.\d{4}", v) for v in seen[H.CACHE_SIMILARITY.name])
    assert all(re.fullmatch(r"before=\d+;after=\d+", v) for v in seen[H.VISUAL_TOKENS.name])
    assert seen[H.STREAM_NO_BUFFER.name] == {"no"}


def test_browser_pages_may_read_every_response_header_and_no_request_header(tour):
    _, seen, answers, _ = tour
    exposed = {x.strip() for r in answers for x in r.headers.get("access-control-expose-headers", "").split(",")}
    assert exposed, "CORS headers on answers to an allowed origin"
    ours = {k for k in seen if k not in STANDARD and k != "cache-control"}   # cache-control is CORS-safelisted
    assert ours <= exposed, f"not readable by a browser page: {sorted(ours - exposed)}"
    for n in (1, 16):
        assert H.IMAGE_TRANSFORM.nth(n) in exposed  # up to limits.max_images_per_request
    request_only = {h.name for h in H.REQUEST} - {h.name for h in H.RESPONSE}
    assert not exposed & request_only, f"request headers listed as readable: {sorted(exposed & request_only)}"


def _server_timing(value: str) -> dict[str, float]:
    return {name.strip(): float(dur) for name, _, dur in (p.partition(";dur=") for p in value.split(","))}


def test_server_timing_parts_add_up_to_the_whole_with_several_images(tour):
    gw, _, _, client = tour
    # four different large images, rewritten in parallel by the four pool threads
    parts = [{"type": "text", "text": "compare"}] + [
        img(data_uri(photo_jpeg(2400 + 16 * i, 1800), "image/jpeg")) for i in range(4)]
    r = client.post("/v1/chat/completions", json=chat(parts))
    assert r.status_code == 200
    t = _server_timing(r.headers[H.SERVER_TIMING.name])
    assert set(t) == {"receive", "parse", "queue", "media", "route", "other", "gateway"}
    whole = t.pop("gateway")
    assert t["media"] > 0
    # each part is rounded to 0.01 ms
    assert sum(t.values()) <= whole + 0.01 * len(t), (t, whole)


def test_headers_doc_is_generated_from_the_registry():
    from vlm_gateway.docgen_refs import HEADERS_PATH, render_headers
    assert HEADERS_PATH.read_text() == render_headers(), "regenerate with: python -m vlm_gateway.docgen"
    text = render_headers()
    for h in H.REGISTRY:
        assert f"| `{h.name}` |" in text


def test_every_gateway_header_the_docs_name_exists():
    names = set()
    for f in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        names |= {(f.name, m) for m in re.findall(r"x-vlm-gateway-[a-z-]+(?:\d+|N|\{n\})?", f.read_text())}
    for doc, name in sorted(names):
        probe = re.sub(r"-(N|\{n\})$", "-1", name).rstrip("-")
        assert H.lookup(probe) or H.lookup(probe, "request") or H.lookup(probe + "1"), f"{doc} names {name}"


def test_architecture_lists_no_request_header_as_a_response_header():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    para = text[text.index("Every answer of `/v1/chat/completions`"):]
    para = para[:para.index("\n\n")]
    request_only = {h.name for h in H.REQUEST} - {h.name for h in H.RESPONSE}
    for name in request_only:
        assert f"`{name}`" not in para, name
