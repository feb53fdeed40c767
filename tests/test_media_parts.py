"""Every content part that can carry a URL or media goes through one policy
(SSRF guard, domain lists, url_mode, per-kind counts and byte caps, per-minute
image limits) or is refused with a 400 naming the part. Real gateway and
simulator processes; what reached the engine is read from GET /sim/requests."""

from __future__ import annotations

import base64
import io
import os

import httpx
import openai
import pytest
from PIL import Image

from conftest import SIM_MODEL
from media_server import Origin
from test_security_support import sha
import image_corpus as C
import video_corpus

BIG = C.photo_jpeg(1920, 1080)
# a real (tiny) H.264 clip (the simulator decodes what it receives, as vLLM does) and a
# WAV-looking body (RIFF/WAVE): the gateway does not decode audio, it inlines the bytes;
# videos are rewritten unless the request says x-vlm-gateway-video-policy: off
VIDEO_OFF = {"x-vlm-gateway-video-policy": "off"}
CLIP = video_corpus.motion_clip(2, 320, 240, 15)  # ~60 KB
SOUND = b"RIFF\x24\x00\x01\x00WAVEfmt " + os.urandom(30_000)
KEY = "sk-media-" + os.urandom(8).hex()


def uri(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


# every URL-carrying part type, in each shape a client may use
def image_url(u):
    return {"type": "image_url", "image_url": {"url": u}}


def image_url_str(u):
    return {"type": "image_url", "image_url": u}


def input_image(u):
    return {"type": "input_image", "image_url": u}


def video_url(u):
    return {"type": "video_url", "video_url": {"url": u}}


def video_url_str(u):
    return {"type": "video_url", "video_url": u}


def audio_url(u):
    return {"type": "audio_url", "audio_url": {"url": u}}


URL_PARTS = [image_url, image_url_str, input_image, video_url, video_url_str, audio_url]


def chat(gw, parts: list[dict], key: str | None = None, headers: dict | None = None, **kw) -> httpx.Response:
    body = {"model": SIM_MODEL, "max_tokens": 4,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "describe"}, *parts]}], **kw}
    h = {"authorization": f"Bearer {key}"} if key else {}
    h.update(headers or {})
    return httpx.post(gw.base_url + "/chat/completions", json=body, headers=h, timeout=30)


def last_parts(sim) -> list[dict]:
    return [p for m in sim.sim_requests()[-1]["messages"] if isinstance(m.get("content"), list)
            for p in m["content"] if p.get("type") != "text"]


def decoded(u: str) -> Image.Image:
    assert u.startswith("data:image/"), u[:40]
    return Image.open(io.BytesIO(base64.b64decode(u.split(",", 1)[1])))


@pytest.fixture(scope="module")
def origin():
    with Origin() as o:
        o.put("/big.jpg", BIG, "image/jpeg")
        o.put("/clip.mp4", CLIP, "video/mp4")
        o.put("/sound.wav", SOUND, "audio/wav")
        o.put("/clip-octet", CLIP, "application/octet-stream")
        yield o


@pytest.fixture(scope="module")
def env(module_servers):
    sim = module_servers.sim()
    # default policy: private and loopback addresses refused
    guarded = module_servers.gateway({}, backends=[sim])
    # the local origin is an allowed internal store
    store = module_servers.gateway({"images": {"allow_networks": ["127.0.0.1/32"]},
                                    "limits": {"max_images_per_request": 16}}, backends=[sim])
    return sim, guarded, store


PRIVATE = ["http://169.254.169.254/latest/meta-data/", "http://10.0.0.1/x", "http://[::1]/x",
           "http://2852039166/x", "http://[::ffff:169.254.169.254]/x", "HTTP://127.0.0.1/x"]


@pytest.mark.parametrize("make", URL_PARTS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("url", PRIVATE)
def test_private_urls_refused_in_every_part_type(env, make, url):
    sim, guarded, _ = env
    n = len(sim.sim_requests())
    part = make(url)
    r = chat(guarded, [part])
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert err["param"] == f"messages[0].content[1].{part['type']}"
    assert err["code"].endswith("_url_private_address"), err
    # the message says how an operator allows it
    for hint in ("images.allow_private_networks", "VLM_GATEWAY_IMAGES__ALLOW_PRIVATE_NETWORKS",
                 "images.allow_networks"):
        assert hint in err["message"]
    assert len(sim.sim_requests()) == n  # nothing reached the engine


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.com/a", "//example.com/a.png",
                                 " http://169.254.169.254/", "gopher://127.0.0.1:6379/_x"])
@pytest.mark.parametrize("make", [input_image, video_url, audio_url], ids=lambda f: f.__name__)
def test_other_schemes_refused(env, make, url):
    sim, guarded, _ = env
    n = len(sim.sim_requests())
    part = make(url)
    r = chat(guarded, [part])
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == f"messages[0].content[1].{part['type']}"
    assert r.json()["error"]["code"].startswith("invalid_")
    assert len(sim.sim_requests()) == n


def test_input_image_rewritten_like_image_url(env, origin):
    sim, _, store = env
    for part in (input_image(uri(BIG, "image/jpeg")), input_image(origin.base + "/big.jpg")):
        r = chat(store, [part])
        assert r.status_code == 200, r.text
        assert r.headers["x-vlm-gateway-visual-tokens"] == "before=2040;after=336"
        (sent,) = last_parts(sim)
        assert sent["type"] == "input_image" and isinstance(sent["image_url"], str)
        assert decoded(sent["image_url"]).size == (768, 448)


def test_input_image_counts_against_max_images(env, origin):
    sim, _, store = env
    n = len(sim.sim_requests())
    before = origin.hits.get("/big.jpg", 0)
    r = chat(store, [input_image(origin.base + f"/big.jpg?i={i}") for i in range(40)])
    assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_images"
    assert "max_images_per_request (16)" in r.json()["error"]["message"]
    assert origin.hits.get("/big.jpg", 0) == before  # refused before any fetch
    # images of both part types count together
    r = chat(store, [input_image(uri(C.photo_jpeg(64, 64), "image/jpeg"))] * 9
             + [image_url(uri(C.photo_jpeg(64, 64), "image/jpeg"))] * 8)
    assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_images"
    assert len(sim.sim_requests()) == n


@pytest.mark.parametrize("make", [video_url, video_url_str], ids=lambda f: f.__name__)
def test_video_url_fetched_and_inlined(env, origin, make):
    sim, _, store = env
    hits = origin.hits.get("/clip.mp4", 0)
    r = chat(store, [make(origin.base + "/clip.mp4")], headers=VIDEO_OFF)
    assert r.status_code == 200, r.text
    (sent,) = last_parts(sim)
    u = sent["video_url"]["url"] if isinstance(sent["video_url"], dict) else sent["video_url"]
    assert u == uri(CLIP, "video/mp4")  # the engine gets the bytes, never the URL
    assert origin.hits["/clip.mp4"] == hits + 1
    assert "outcome=forwarded" in r.headers["x-vlm-gateway-video-1"]
    # rewritten (the default): the fetched bytes are the rewrite's input, as a data: URI would be
    r = chat(store, [make(origin.base + "/clip.mp4")])
    assert r.status_code == 200, r.text
    (sent,) = last_parts(sim)
    u = sent["video_url"]["url"] if isinstance(sent["video_url"], dict) else sent["video_url"]
    assert u.startswith("data:video/mp4;base64,") and u != uri(CLIP, "video/mp4")
    assert origin.hits["/clip.mp4"] == hits + 2
    r2 = chat(store, [make(uri(CLIP, "video/mp4"))])
    (sent2,) = last_parts(sim)
    assert (sent2["video_url"]["url"] if isinstance(sent2["video_url"], dict) else sent2["video_url"]) == u
    assert "outcome=l1_hit" in r2.headers["x-vlm-gateway-video-1"]


def test_audio_url_fetched_and_inlined_and_mime_from_bytes(env, origin):
    sim, _, store = env
    r = chat(store, [audio_url(origin.base + "/sound.wav"), video_url(origin.base + "/clip-octet")],
             headers=VIDEO_OFF)
    assert r.status_code == 200, r.text
    audio, video = last_parts(sim)
    assert audio["audio_url"]["url"] == uri(SOUND, "audio/wav")
    assert video["video_url"]["url"] == uri(CLIP, "video/mp4")


def test_data_media_forwarded_unchanged(env):
    sim, guarded, _ = env
    v, a = uri(CLIP, "video/mp4"), base64.b64encode(SOUND).decode()
    r = chat(guarded, [video_url(v), {"type": "input_audio", "input_audio": {"data": a, "format": "wav"}}],
             headers=VIDEO_OFF)
    assert r.status_code == 200, r.text
    video, audio = last_parts(sim)
    assert video["video_url"]["url"] == v and audio["input_audio"] == {"data": a, "format": "wav"}


def test_url_mode_reject_applies_to_every_part(module_servers, origin):
    sim = module_servers.sim()
    gw = module_servers.gateway({"images": {"url_mode": "reject", "allow_networks": ["127.0.0.1/32"]}},
                                backends=[sim])
    for make, path in ((image_url, "/big.jpg"), (input_image, "/big.jpg"), (video_url, "/clip.mp4"),
                       (audio_url, "/sound.wav")):
        part = make(origin.base + path)
        r = chat(gw, [part])
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == f"messages[0].content[1].{part['type']}"
        assert err["code"].endswith("_url_not_allowed") and "url_mode" in err["message"]
    assert sim.sim_requests() == []
    r = chat(gw, [video_url(uri(CLIP, "video/mp4"))])
    assert r.status_code == 200, r.text


def test_url_mode_passthrough_still_guards(module_servers, origin):
    sim = module_servers.sim()
    gw = module_servers.gateway({"images": {"url_mode": "passthrough", "deny_domains": ["evil.example"]}},
                                backends=[sim])
    for make in (image_url, input_image, video_url, audio_url):
        r = chat(gw, [make("http://169.254.169.254/latest/meta-data/")])
        assert r.status_code == 400 and r.json()["error"]["code"].endswith("_url_private_address")
        r = chat(gw, [make("https://cdn.evil.example/a")])
        assert r.status_code == 400 and r.json()["error"]["code"].endswith("_url_denied")
        # the engine parses the URL again: forms parsers disagree on are refused
        for odd in ("http://cdn.example.org@127.0.0.1/a", "http://cdn.example.org\\@127.0.0.1/a",
                    "http://127.0.0.1/a b"):
            r = chat(gw, [make(odd)])
            assert r.status_code == 400 and r.json()["error"]["code"].startswith("invalid_"), (odd, r.text)
    assert sim.sim_requests() == []


def test_video_and_audio_byte_caps(module_servers, origin):
    sim = module_servers.sim()
    gw = module_servers.gateway({"images": {"allow_networks": ["127.0.0.1/32"]},
                                 "limits": {"max_video_bytes": 40_000, "max_total_audio_bytes": 40_000,
                                            "max_videos_per_request": 1}}, backends=[sim])
    r = chat(gw, [video_url(origin.base + "/clip.mp4")])  # fetched, 60 KB > 40 KB
    assert r.status_code == 400 and r.json()["error"]["code"] == "video_too_large", r.text
    assert r.json()["error"]["param"] == "messages[0].content[1].video_url"
    r = chat(gw, [video_url(uri(CLIP, "video/mp4"))])  # inline, same cap
    assert r.status_code == 400 and r.json()["error"]["code"] == "video_too_large", r.text
    small = os.urandom(20_000)
    r = chat(gw, [video_url(uri(small, "video/mp4")), video_url(uri(small, "video/mp4"))])
    assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_videos"
    # audio: 30 KB fetched + 30 KB inline > 40 KB per request
    a = base64.b64encode(SOUND).decode()
    r = chat(gw, [audio_url(origin.base + "/sound.wav"), {"type": "input_audio",
                                                           "input_audio": {"data": a, "format": "wav"}}])
    assert r.status_code == 413 and r.json()["error"]["code"] == "audio_bytes_too_large", r.text
    assert "limits.max_total_audio_bytes" in r.json()["error"]["message"]
    assert sim.sim_requests() == []


@pytest.mark.parametrize("part,param,code,hint", [
    ({"type": "image_embeds", "image_embeds": "AAAA"}, "image_embeds", "image_embeds_not_allowed",
     "images.allow_image_embeds"),
    ({"type": "image_pil", "image_pil": "AAAA"}, "image_pil", "unsupported_content_part", "image_url"),
    ({"type": "file", "file": {"file_data": "AAAA", "filename": "a.pdf"}}, "file", "unsupported_content_part",
     "image_url"),
    # vLLM reads media by key when a part has a uuid (whatever its type), and a uuid alone
    # reuses media the engine cached for someone else
    ({"type": "text", "text": "x", "uuid": "u1", "image_url": "http://169.254.169.254/"}, "uuid",
     "media_uuid_not_allowed", "uuid"),
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}, "uuid": "u1"}, "uuid",
     "media_uuid_not_allowed", "uuid"),
    ({"type": "text", "text": "x", "video_url": {"url": "http://169.254.169.254/"}}, "video_url",
     "unexpected_media_field", "own part"),
    ({"type": "input_image", "image_url": "data:image/png;base64,AAAA", "audio_url": "http://10.0.0.1/"},
     "audio_url", "unexpected_media_field", "own part"),
    ({"type": "input_image", "file_id": "file-123"}, "input_image", "invalid_type", "file_id"),
    ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav;base64,x"}}, "input_audio",
     "invalid_value", "format"),
    ({"type": "prompt_embeds", "data": "AAAA"}, "type", "invalid_value", "supported"),
])
def test_parts_the_gateway_cannot_police_are_refused(env, part, param, code, hint):
    sim, guarded, _ = env
    n = len(sim.sim_requests())
    r = chat(guarded, [part])
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == f"messages[0].content[1].{param}" and err["code"] == code, err
    assert hint in err["message"]
    assert len(sim.sim_requests()) == n


def test_image_embeds_allowed_by_config_are_counted(module_servers):
    sim = module_servers.sim()
    gw = module_servers.gateway({"images": {"allow_image_embeds": True},
                                 "limits": {"max_images_per_request": 2, "max_total_image_bytes": 30_000}},
                                backends=[sim])
    emb = base64.b64encode(os.urandom(3000)).decode()
    r = chat(gw, [{"type": "image_embeds", "image_embeds": emb}])
    assert r.status_code == 200, r.text
    assert last_parts(sim) == [{"type": "image_embeds", "image_embeds": emb}]
    r = chat(gw, [{"type": "image_embeds", "image_embeds": emb}] * 2 + [image_url(uri(BIG, "image/jpeg"))])
    assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_images"
    big = base64.b64encode(os.urandom(40_000)).decode()
    r = chat(gw, [{"type": "image_embeds", "image_embeds": {"image_embeds": big}}])
    assert r.status_code == 413 and r.json()["error"]["code"] == "image_bytes_too_large"


def test_images_per_minute_counts_every_visual_part(module_servers):
    sim = module_servers.sim()
    gw = module_servers.gateway({"auth": {"tenants": [{"name": "t", "key_sha256": sha(KEY),
                                                       "images_per_minute": 3}]}}, backends=[sim])
    small = uri(C.photo_jpeg(64, 64), "image/jpeg")
    r = chat(gw, [input_image(small), video_url(uri(CLIP, "video/mp4"))], key=KEY)
    assert r.status_code == 200, r.text
    assert r.headers["x-ratelimit-remaining-images"] == "1"
    r = chat(gw, [input_image(small), input_image(small)], key=KEY)
    assert r.status_code == 429 and r.json()["error"]["code"] == "rate_limit_exceeded"


def test_openai_sdk_gets_the_refusal(env):
    sim, guarded, _ = env
    client = openai.OpenAI(base_url=guarded.base_url, api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=SIM_MODEL, messages=[{"role": "user", "content": [
            {"type": "text", "text": "what is in the video?"},
            {"type": "video_url", "video_url": {"url": "http://169.254.169.254/latest/meta-data/"}}]}])
    assert e.value.body["param"] == "messages[0].content[1].video_url"
    assert e.value.body["code"] == "video_url_private_address"


def test_engine_media_kwargs_refused_unless_allowed(env, module_servers):
    """mm_processor_kwargs / media_io_kwargs would let a client raise the engine's pixel or
    frame budget past the gateway's limits."""
    sim, guarded, _ = env
    small = image_url(uri(C.photo_jpeg(64, 64), "image/jpeg"))
    for k, v in (("mm_processor_kwargs", {"max_pixels": 100_000_000, "min_pixels": 50_000_000}),
                 ("media_io_kwargs", {"video": {"num_frames": 100_000}})):
        n = len(sim.sim_requests())
        r = chat(guarded, [small], **{k: v})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == k and "limits.allow_media_kwargs" in err["message"]
        assert len(sim.sim_requests()) == n
    gw = module_servers.gateway({"limits": {"allow_media_kwargs": True}}, backends=[sim])
    r = chat(gw, [small], mm_processor_kwargs={"max_pixels": 1_000_000})
    assert r.status_code == 200, r.text
    assert sim.sim_requests()[-1]["mm_processor_kwargs"] == {"max_pixels": 1_000_000}
