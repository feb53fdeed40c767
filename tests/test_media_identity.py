"""Content identity is the cryptographic hash of the bytes actually used.

End to end: a URL whose content changes between requests is never answered from
a rewrite or a cached answer computed for the earlier content; a strong ETag is
revalidated with the origin; the admin flush forgets remembered URLs; two
different images with one XXH3-128 hash get different identities. Real gateway
and simulator processes; what reached the engine is read from GET /sim/requests."""

from __future__ import annotations

import base64
import io

import blake3
import httpx
import pytest
from PIL import Image

from conftest import SIM_MODEL
from media_server import Origin
from test_security_support import sha
import image_corpus as C
from xxh3_twins import bmp_twins

ADMIN = "sk-admin-identity-test"
A = C.photo_jpeg(1600, 1200, seed=1)   # rewritten to 768x576
B = C.photo_jpeg(1200, 1600, seed=2)   # rewritten to 576x768


def ask(gw, url: str, question: str = "what is this?") -> httpx.Response:
    body = {"model": SIM_MODEL, "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "user", "content": [{"type": "text", "text": question},
                                                      {"type": "image_url", "image_url": {"url": url}}]}]}
    return httpx.post(gw.base_url + "/chat/completions", json=body, timeout=30)


def sent_image(sim) -> bytes:
    (p,) = [p for p in sim.sim_requests()[-1]["messages"][0]["content"] if p["type"] == "image_url"]
    return base64.b64decode(p["image_url"]["url"].split(",", 1)[1])


def size(data: bytes) -> tuple[int, int]:
    return Image.open(io.BytesIO(data)).size


@pytest.fixture
def env(servers):
    sim = servers.sim()
    gw = servers.gateway({"images": {"allow_networks": ["127.0.0.1/32"]},
                          "cache": {"mode": "deterministic"},
                          "auth": {"admin_key_sha256": sha(ADMIN)}}, backends=[sim])
    with Origin() as origin:
        yield sim, gw, origin


def test_changed_url_content_is_never_answered_from_the_old_image(env):
    sim, gw, origin = env
    url = origin.put("/photo.jpg", A, "image/jpeg")  # no validator: fetched every time
    r = ask(gw, url)
    assert r.status_code == 200 and r.headers["x-vlm-gateway-cache"] == "miss"
    assert size(sent_image(sim)) == (768, 576)
    n = len(sim.sim_requests())
    r = ask(gw, url)  # same content: the cached answer is right
    assert r.headers["x-vlm-gateway-cache"] == "hit-exact" and len(sim.sim_requests()) == n
    origin.put("/photo.jpg", B, "image/jpeg")
    r = ask(gw, url)
    assert r.status_code == 200
    assert r.headers["x-vlm-gateway-cache"] == "miss"  # not the answer computed for A
    assert len(sim.sim_requests()) == n + 1
    assert size(sent_image(sim)) == (576, 768)  # the engine saw B


def test_strong_etag_revalidated_and_flush_forgets_it(env):
    sim, gw, origin = env
    url = origin.put("/tagged.jpg", A, "image/jpeg", etag='"v1"')
    assert ask(gw, url).status_code == 200
    first = sent_image(sim)
    assert origin.not_modified == 0
    # a repeat (another question: no L3 hit) asks the origin; 304 = the same bytes,
    # whose rewrite comes from L1
    r = ask(gw, url, "and what colour is it?")
    assert r.status_code == 200 and origin.not_modified == 1
    assert sent_image(sim) == first
    # new content, new tag: the full body is fetched and used
    origin.put("/tagged.jpg", B, "image/jpeg", etag='"v2"')
    r = ask(gw, url)
    assert r.status_code == 200 and r.headers["x-vlm-gateway-cache"] == "miss"
    assert size(sent_image(sim)) == (576, 768) and origin.not_modified == 1
    # the admin flush forgets the remembered URL (and the L1/L3 entries)
    f = httpx.post(gw.url + "/admin/cache/flush", headers={"authorization": f"Bearer {ADMIN}"}).json()
    assert f["flushed"]["MediaSources.flush"] >= 1, f
    hits = origin.hits["/tagged.jpg"]
    r = ask(gw, url)
    assert r.status_code == 200 and r.headers["x-vlm-gateway-cache"] == "miss"
    assert origin.hits["/tagged.jpg"] == hits + 1 and origin.not_modified == 1  # unconditional fetch


def test_images_with_one_xxh3_hash_are_different_images(env):
    """Two BMPs with different pixels and the same XXH3-128: each request goes
    upstream with its own image (an XXH3-keyed L1 sent the first one twice)."""
    sim, gw, _ = env
    a, b = bmp_twins()
    assert a != b
    sent = []
    for data in (a, b):
        r = ask(gw, "data:image/bmp;base64," + base64.b64encode(data).decode())
        assert r.status_code == 200 and r.headers["x-vlm-gateway-cache"] == "miss", r.text
        sent.append(sent_image(sim))
    assert sent[0] != sent[1]
    # and each is the rewrite of its own source: the first again gives the first bytes
    r = ask(gw, "data:image/bmp;base64," + base64.b64encode(a).decode(), "describe it")
    assert r.status_code == 200 and sent_image(sim) == sent[0]


def test_identity_is_blake3_of_the_bytes():
    """The hash chosen for every content identity (L1, L3, affinity)."""
    from vlm_gateway import hashing
    from vlm_gateway.stages.cache.keys import image_identity
    from vlm_gateway.stages.images.source import content_hash
    from xxh3_twins import twins
    data = bytes(range(256)) * 20
    assert hashing.content_hash(data) == blake3.blake3(data).hexdigest() and len(hashing.content_hash(data)) == 64
    assert content_hash is hashing.content_hash
    assert image_identity("", "http://x/a.png") == "url:" + blake3.blake3(b"http://x/a.png").hexdigest()
    a, b = twins(data, 0, len(data))
    assert a != b and hashing.content_hash(a) != hashing.content_hash(b)
    import xxhash  # the test extra
    assert xxhash.xxh3_128_hexdigest(a) == xxhash.xxh3_128_hexdigest(b)  # what the old identity could not tell
    assert xxhash.xxh3_128_hexdigest(bmp_twins()[0]) == xxhash.xxh3_128_hexdigest(bmp_twins()[1])


def test_passthrough_urls_are_never_answered_from_the_cache(servers):
    """url_mode passthrough: the engine fetches, the gateway never sees the bytes, so an
    answer cached under the URL could outlive the content: such requests bypass L3."""
    sim = servers.sim()
    gw = servers.gateway({"images": {"url_mode": "passthrough", "allow_networks": ["127.0.0.1/32"]}},
                         backends=[sim])
    with Origin() as origin:
        url = origin.put("/photo.jpg", A, "image/jpeg")
        for _ in range(2):
            r = ask(gw, url)
            assert r.status_code == 200 and r.headers["x-vlm-gateway-cache"] == "bypass", r.text
        assert len(sim.sim_requests()) == 2
        assert origin.hits["/photo.jpg"] == 2  # fetched by the engine, each time
        # data: images in the same gateway are still cached
        data = "data:image/jpeg;base64," + base64.b64encode(A).decode()
        assert ask(gw, data).headers["x-vlm-gateway-cache"] == "miss"
        assert ask(gw, data).headers["x-vlm-gateway-cache"] == "hit-exact"


def test_revalidated_identity_never_sends_other_bytes(servers):
    """An origin that answers 304 for an ETag whose content it changed: when the body
    has to be fetched again (its rewrite is not in L1), the gateway notices the bytes
    differ from the identity already used and refuses rather than send them under it."""
    sim = servers.sim()
    gw = servers.gateway({"images": {"allow_networks": ["127.0.0.1/32"], "l1_max_bytes": 1000}},
                         backends=[sim])
    with Origin() as origin:
        url = origin.put("/liar.jpg", A, "image/jpeg", etag='"same"')
        assert ask(gw, url).status_code == 200
        origin.put("/liar.jpg", B, "image/jpeg", etag='"same"')
        r = ask(gw, url, "second question")
        assert origin.not_modified == 1
        assert r.status_code == 503 and r.json()["error"]["code"] == "image_changed", r.text
        assert r.json()["error"]["param"] == "messages[0].content[1].image_url"
        assert len(sim.sim_requests()) == 1
        r = ask(gw, url, "third question")  # the URL was forgotten: fetched whole, B is used
        assert r.status_code == 200 and size(sent_image(sim)) == (576, 768)
