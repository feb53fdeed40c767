"""Video through a running gateway to the simulator (which reads videos as vLLM 0.24 does:
the Qwen3-VL token rule on what OpenCV would report): the OpenAI SDK and LangChain
sending a video, the token header against the engine's usage, the L1 and L3 caches and
the affinity keys keyed by the video sent, engine extras that would change video
sampling, the decode pool's bound, a gateway without PyAV, and hostile videos refused
with 4xx in bounded time and memory while other requests go on."""

from __future__ import annotations

import base64
import concurrent.futures as cf
import os
import re
import sys
import time

import httpx
import openai
import pytest

pytest.importorskip("av")

from conftest import SIM_MODEL  # noqa: E402
from media_server import Origin  # noqa: E402
from vlm_gateway import video_tokens as vt  # noqa: E402
import video_corpus as corpus  # noqa: E402
from vlm_gateway.stages.video.rewrite import probe_video  # noqa: E402
from vlm_gateway.stages.video.settings import VideoSettings  # noqa: E402

CLIP = corpus.motion_clip(2, 320, 240, 15)                       # 30 frames, every one different
SCREEN, TIMES = corpus.screen_recording(12, 640, 360, 10, seed=3)  # 12 s, 3 screen states


def uri(data: bytes, mime: str = "video/mp4") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def video_part(u: str) -> dict:
    return {"type": "video_url", "video_url": {"url": u}}


def messages(*parts: dict, text: str = "What happens in the video?") -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": text}, *parts]}]


def chat(gw, parts: list[dict], headers: dict | None = None, timeout: float = 60, **kw) -> httpx.Response:
    body = {"model": SIM_MODEL, "max_tokens": 4, "messages": messages(*parts), **kw}
    return httpx.post(gw.base_url + "/chat/completions", json=body, headers=headers or {}, timeout=timeout)


def sent_video(sim) -> str:
    (p,) = [p for m in sim.sim_requests()[-1]["messages"] if isinstance(m.get("content"), list)
            for p in m["content"] if p.get("type") == "video_url"]
    return p["video_url"]["url"]


def tokens_header(r) -> tuple[int, int]:
    kv = dict(x.split("=") for x in r.headers["x-vlm-gateway-video-tokens"].split(";"))
    return int(kv["before"]), int(kv["after"])


def detail(r, i: int = 1) -> dict[str, str]:
    return dict(x.strip().split("=", 1) for x in r.headers[f"x-vlm-gateway-video-{i}"].split(";"))


@pytest.fixture(scope="module")
def env(module_servers):
    sim = module_servers.sim()
    gw = module_servers.gateway({}, backends=[sim])
    return sim, gw


def text_only_tokens(client) -> int:
    return client.chat.completions.create(model=SIM_MODEL, max_tokens=1,
                                          messages=messages()).usage.prompt_tokens


def test_openai_sdk_video_tokens_equal_the_engines_count(env):
    sim, gw = env
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    text = text_only_tokens(client)
    raw = client.chat.completions.with_raw_response.create(
        model=SIM_MODEL, max_tokens=4, messages=messages(video_part(uri(SCREEN))))
    before, after = tokens_header(raw)
    usage = raw.parse().usage
    sent = base64.b64decode(sent_video(sim).split(",", 1)[1])
    # what the video adds to the prompt the engine reports, exactly
    assert usage.prompt_tokens - text == after
    # before: what the engine reports for the same video sent as it came
    direct = openai.OpenAI(base_url=sim.base_url, api_key="x", max_retries=0)
    raw_usage = direct.chat.completions.create(model=SIM_MODEL, max_tokens=1,
                                               messages=messages(video_part(uri(SCREEN)))).usage
    assert raw_usage.prompt_tokens - text == before
    h = probe_video(SCREEN, VideoSettings())
    assert before == vt.video_tokens(h.opencv_frames, float(h.rate), h.width, h.height).total
    d = detail(raw)
    assert d["part"] == "messages[0].content[1].video_url" and d["outcome"] in ("rewritten", "l1_hit")
    assert d["states"] == str(len(TIMES)) and d["plan"] == "groups" and d["size"] == "640x360->640x352"
    assert after < before
    # the engine got the rewritten MP4, whose count follows from its own header
    o = probe_video(sent, VideoSettings())
    assert (o.width, o.height) == (640, 352)
    assert vt.video_tokens(o.opencv_frames, float(o.rate), o.width, o.height).total == after
    assert d["frames"].split("->")[1] == str(o.opencv_frames)


def test_langchain_sends_a_video(env):
    sim, gw = env
    from langchain_core.messages import HumanMessage
    from langchain_openai import ChatOpenAI
    llm = ChatOpenAI(base_url=gw.base_url, api_key="x", model=SIM_MODEL, max_tokens=4, max_retries=0)
    out = llm.invoke([HumanMessage(content=[{"type": "text", "text": "What happens in the video?"},
                                            video_part(uri(CLIP))])])
    assert out.content
    sent = sent_video(sim)
    assert sent.startswith("data:video/mp4;base64,") and sent != uri(CLIP)
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(model=SIM_MODEL, max_tokens=4,
                                                           messages=messages(video_part(uri(CLIP))))
    assert out.response_metadata["token_usage"]["prompt_tokens"] == raw.parse().usage.prompt_tokens
    assert raw.parse().usage.prompt_tokens - text_only_tokens(client) == tokens_header(raw)[1]


def _metric(gw, name: str, labels: str) -> float:
    text = httpx.get(gw.url + "/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith(name + "{") and labels in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_repeated_video_hits_l1_and_sends_the_same_bytes(env):
    sim, gw = env
    clip = corpus.motion_clip(2, 320, 240, 15, seed=41)
    hits = _metric(gw, "vlm_gateway_cache_hits_total", 'level="l1_video"')
    r1 = chat(gw, [video_part(uri(clip))])
    first = sent_video(sim)
    r2 = chat(gw, [video_part(uri(clip))])
    assert r1.status_code == r2.status_code == 200
    assert detail(r1)["outcome"] == "rewritten" and detail(r2)["outcome"] == "l1_hit"
    assert sent_video(sim) == first and tokens_header(r1) == tokens_header(r2)
    assert _metric(gw, "vlm_gateway_cache_hits_total", 'level="l1_video"') == hits + 1
    # the engine's prefix cache hits too: the bytes (and so its content hash) are the same
    assert r2.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 16
    assert _metric(gw, "vlm_gateway_video_frames_total", 'direction="out"') > 0
    assert _metric(gw, "vlm_gateway_video_tokens_saved_total", "") >= 0


def test_response_cache_key_includes_the_video(env):
    sim, gw = env
    a, b = corpus.motion_clip(2, 320, 240, 15, seed=42), corpus.motion_clip(2, 320, 240, 15, seed=43)
    n = len(sim.sim_requests())
    r1 = chat(gw, [video_part(uri(a))], temperature=0)
    r2 = chat(gw, [video_part(uri(a))], temperature=0)
    r3 = chat(gw, [video_part(uri(b))], temperature=0)
    assert r1.headers["x-vlm-gateway-cache"] == "miss"
    assert r2.headers["x-vlm-gateway-cache"].startswith("hit")
    assert r3.headers["x-vlm-gateway-cache"] == "miss"     # same text, another video
    assert len(sim.sim_requests()) == n + 2


def test_affinity_and_cache_keys_follow_the_bytes_sent():
    """In process: two requests that differ only in the video sent have different prefix
    keys and cache keys; the same video sent twice has the same."""
    import orjson

    from vlm_gateway.backends.router.affinity import prefix_keys
    from vlm_gateway.stages.cache.keys import build_keys
    from vlm_gateway.core.request import parse_chat

    def req(identity: str):
        body = {"model": SIM_MODEL, "messages": messages(video_part(uri(CLIP)))}
        r = parse_chat(orjson.dumps(body), {})
        (v,) = r.media
        v.content_hash, v.tokens_after = identity, 500
        return r

    a1, a2, b = req("a" * 64), req("a" * 64), req("b" * 64)
    assert prefix_keys(a1)[0] == prefix_keys(a2)[0] != prefix_keys(b)[0]
    assert build_keys(a1).exact == build_keys(a2).exact != build_keys(b).exact
    # the rewritten video's count weighs in the prompt estimate the affinity match uses
    assert prefix_keys(a1)[1] > 500


def test_engine_extras_that_change_video_sampling_are_refused(module_servers, env):
    sim, _ = env
    gw = module_servers.gateway({"limits": {"allow_media_kwargs": True}}, backends=[sim])
    v = video_part(uri(CLIP))
    for kw, param in ((dict(mm_processor_kwargs={"fps": 4}), "mm_processor_kwargs.fps"),
                      (dict(mm_processor_kwargs={"size": {"longest_edge": 10**9}}), "mm_processor_kwargs.size"),
                      (dict(mm_processor_kwargs={"videos_kwargs": {"max_frames": 10**5}}),
                       "mm_processor_kwargs.videos_kwargs"),
                      (dict(media_io_kwargs={"video": {"fps": 30, "num_frames": 10**5}}), "media_io_kwargs.video")):
        n = len(sim.sim_requests())
        r = chat(gw, [v], **kw)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == param and err["code"] == "unsupported_parameter", err
        assert "x-vlm-gateway-video-policy: off" in err["message"]
        assert len(sim.sim_requests()) == n
    # image-only settings pass; with the rewrite off for the request the engine reads the original
    r = chat(gw, [v], mm_processor_kwargs={"images_kwargs": {"max_pixels": 1_000_000}})
    assert r.status_code == 200, r.text
    r = chat(gw, [v], headers={"x-vlm-gateway-video-policy": "off"}, media_io_kwargs={"video": {"fps": 1}})
    assert r.status_code == 200, r.text
    assert sent_video(sim) == uri(CLIP) and detail(r)["outcome"] == "forwarded"
    # counted from the container's header as the engine will read it (here: the engine's own
    # sampling changed by media_io_kwargs, which only an operator's allow_media_kwargs lets through)
    h = probe_video(CLIP, VideoSettings())
    n = vt.video_tokens(h.opencv_frames, float(h.rate), h.width, h.height).total
    assert tokens_header_raw(r) == f"before={n};after={n}"
    r = chat(gw, [v], headers={"x-vlm-gateway-video-policy": "fast"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "x-vlm-gateway-video-policy"


def tokens_header_raw(r) -> str:
    return r.headers["x-vlm-gateway-video-tokens"]


def test_full_decode_pool_answers_503_with_retry_after(module_servers, env):
    sim, _ = env
    gw = module_servers.gateway({"video": {"pool_workers": 1, "max_queue": 0}}, backends=[sim])
    clips = [corpus.motion_clip(3, 640, 360, 30, seed=60 + i) for i in range(3)]   # ~0.5 s of decode each
    with cf.ThreadPoolExecutor(3) as ex:
        rs = list(ex.map(lambda c: chat(gw, [video_part(uri(c))]), clips))
    codes = sorted(r.status_code for r in rs)
    assert codes[0] == 200 and codes[-1] == 503, [r.text[:200] for r in rs]
    busy = [r for r in rs if r.status_code == 503]
    assert all(r.headers["retry-after"] == "1" and r.json()["error"]["code"] == "video_queue_full" for r in busy)
    # once the pool is free the same video goes through
    assert chat(gw, [video_part(uri(clips[0]))]).status_code == 200


def test_gateway_without_pyav_answers_a_4xx_the_sdk_does_not_retry(module_servers, env, tmp_path):
    """PyAV is a core dependency; an install that lost it answers 400 video_unavailable, naming
    the command that installs it (the package is installed from its checkout), and the OpenAI
    SDK, which retries 5xx twice, sends it once."""
    sim, _ = env
    stub = tmp_path / "no_pyav" / "av"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('PyAV is not installed here')\n")
    path = os.pathsep.join([str(stub.parent), os.environ.get("PYTHONPATH", "")])
    gw = module_servers.gateway({}, backends=[sim], env={"PYTHONPATH": path})
    r = chat(gw, [video_part(uri(CLIP))])
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "video_unavailable" and err["param"] == "messages[0].content[1].video_url"
    assert err["type"] == "invalid_request_error"
    assert "pip install -e . in the gateway's checkout" in err["message"] and "vlm-gateway[" not in err["message"]
    assert "PyAV is not installed" in open(gw.log).read()

    def refused() -> float:
        text = httpx.get(gw.url + "/metrics", timeout=10).text
        m = re.search(r'vlm_gateway_rejections_total\{reason="video_unavailable",status="400"\} (\S+)', text)
        return float(m.group(1)) if m else 0.0
    before = refused()
    client = openai.OpenAI(base_url=gw.base_url, api_key="x")  # the SDK's default retries
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=SIM_MODEL, max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "text", "text": "what happens?"}, video_part(uri(CLIP))]}])
    assert exc.value.code == "video_unavailable"
    assert refused() == before + 1, "the SDK retried"
    # the operator's escape hatch per request, and requests without video, still work
    assert chat(gw, [video_part(uri(CLIP))], headers={"x-vlm-gateway-video-policy": "off"}).status_code == 200
    assert chat(gw, []).status_code == 200


# -- hostile videos ------------------------------------------------------------------------

def _hwm_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


HOSTILE = [  # (name, path on the origin, bytes, content type, expected code)
    ("truncated MP4", "/truncated.mp4", corpus.truncated(corpus.motion_clip(2, 160, 120, 30)), "video/mp4",
     "video_corrupt"),
    ("huge declared frame size", "/huge.mp4", corpus.huge_frame_size(), "video/mp4", "video_frame_too_large"),
    ("thousands of tiny frames", "/tiny.mkv", corpus.tiny_frames(40_000), "video/mp4", "video_too_many_frames"),
    ("zip served as video/mp4", "/zip.mp4", corpus.zip_bytes(), "video/mp4", "unsupported_video_format"),
    ("HTML served as video/mp4", "/page.mp4", corpus.HTML, "video/mp4", "unsupported_video_format"),
    ("stream past the duration limit", "/long.ts", corpus.long_stream(2000), "video/mp4", "video_too_long"),
    ("endless HTTP body", "/endless/clip.ts", None, "video/mp4", "video_too_large"),
]


@pytest.fixture(scope="module")
def hostile(module_servers, env):
    sim, _ = env
    with Origin() as o:
        for _, path, data, ctype, _ in HOSTILE:
            if data is not None:
                o.put(path, data, ctype)
        o.put("/clip.ts", corpus.encode(corpus.motion_frames(2, 160, 120, 30), 30, fmt="mpegts"), "video/mp4")
        gw = module_servers.gateway({"images": {"allow_networks": ["127.0.0.1/32"], "fetch_timeout_s": 20},
                                     "limits": {"max_video_bytes": 8 * 2**20}}, backends=[sim])
        yield o, gw


@pytest.mark.parametrize("name,path,code", [(n, p, c) for n, p, _, _, c in HOSTILE], ids=[h[0] for h in HOSTILE])
def test_hostile_videos_are_refused_in_bounded_time_and_memory(hostile, env, name, path, code):
    sim, _ = env
    origin, gw = hostile
    pid = gw.proc.pid
    hwm0 = _hwm_mib(pid)
    n = len(sim.sim_requests())
    with cf.ThreadPoolExecutor(2) as ex:
        t0 = time.monotonic()
        bad = ex.submit(chat, gw, [video_part(origin.base + path)])
        # another request at the same time is not affected
        other = ex.submit(chat, gw, [video_part(uri(CLIP))])
        r = bad.result()
        took = time.monotonic() - t0
        ok = other.result()
    assert 400 <= r.status_code < 500, (name, r.status_code, r.text[:300])
    err = r.json()["error"]
    assert err["code"] == code and err["param"] == "messages[0].content[1].video_url", (name, err)
    assert took < 20, (name, took)
    assert ok.status_code == 200, ok.text
    assert len(sim.sim_requests()) == n + 1                  # only the good one reached the engine
    assert gw.proc.poll() is None and httpx.get(gw.url + "/health", timeout=5).status_code == 200
    assert _hwm_mib(pid) - hwm0 < 400, (name, _hwm_mib(pid) - hwm0)


def test_visual_tokens_per_minute_charges_video_tokens(module_servers, env):
    import hashlib
    import uuid
    sim, _ = env
    key = "sk-video-" + uuid.uuid4().hex
    gw = module_servers.gateway({"auth": {"tenants": [{"name": "vtok", "key_sha256": hashlib.sha256(
        key.encode()).hexdigest(), "visual_tokens_per_minute": 300}]}}, backends=[sim])
    c = openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0)
    # admitted while the bucket is positive, then charged what the video costs the engine (685)
    r = c.chat.completions.with_raw_response.create(model=SIM_MODEL, max_tokens=1,
                                                    messages=messages(video_part(uri(SCREEN))))
    assert tokens_header(r)[1] > 300
    with pytest.raises(openai.RateLimitError) as ei:
        c.chat.completions.create(model=SIM_MODEL, max_tokens=1, messages=messages(video_part(uri(SCREEN))))
    assert "visual tokens" in ei.value.message


def test_rewrite_off_still_applies_the_limits_and_charges_the_tokens(module_servers, env):
    """x-vlm-gateway-video-policy: off sends the video as it came, but it is not a way
    around the operator's limits, the visual-token budget or the image rules."""
    import hashlib
    import uuid
    sim, _ = env
    key = "sk-video-off-" + uuid.uuid4().hex
    gw = module_servers.gateway({"video": {"max_duration_s": 1.5, "max_frame_pixels": 320 * 240},
                                 "auth": {"tenants": [{"name": "voff", "key_sha256": hashlib.sha256(
                                     key.encode()).hexdigest(), "visual_tokens_per_minute": 150}]}},
                                backends=[sim])
    off = {"x-vlm-gateway-video-policy": "off", "authorization": f"Bearer {key}"}
    n = len(sim.sim_requests())
    long_clip = corpus.motion_clip(3, 320, 240, 15, seed=71)
    big_frames = corpus.motion_clip(1, 640, 480, 15, seed=72)
    for clip, code in ((long_clip, "video_too_long"), (big_frames, "video_frame_too_large")):
        for headers in (off, {"authorization": f"Bearer {key}"}):
            r = chat(gw, [video_part(uri(clip))], headers=headers)
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert err["code"] == code and err["param"] == "messages[0].content[1].video_url", err
    # an image carried as "video/jpeg" (read by engines as image frames) is not a video
    import image_corpus as C
    for mime in ("video/jpeg", "video/mp4"):
        r = chat(gw, [video_part(uri(C.photo_jpeg(64, 48), mime))], headers=off)
        assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_video_format", r.text
    assert len(sim.sim_requests()) == n
    # a clip within the limits goes through as it came, and costs the tenant what the engine spends
    short = corpus.motion_clip(1, 320, 240, 15, seed=73)
    r = chat(gw, [video_part(uri(short))], headers=off)
    assert r.status_code == 200, r.text
    assert sent_video(sim) == uri(short) and detail(r)["outcome"] == "forwarded"
    before, after = tokens_header(r)
    text = chat(gw, [], headers=off).json()["usage"]["prompt_tokens"]
    assert before == after == r.json()["usage"]["prompt_tokens"] - text > 150
    r = chat(gw, [video_part(uri(short))], headers=off)
    assert r.status_code == 429 and "visual tokens" in r.json()["error"]["message"], r.text


def test_video_parts_must_hold_a_video_with_the_rewrite_disabled(module_servers, env):
    import image_corpus as C
    sim, _ = env
    gw = module_servers.gateway({"video": {"enabled": False}}, backends=[sim])
    r = chat(gw, [video_part(uri(C.photo_jpeg(64, 48), "video/jpeg"))])
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_video_format", r.text
    r = chat(gw, [video_part(uri(CLIP))])
    assert r.status_code == 200 and sent_video(sim) == uri(CLIP), r.text


def test_replicas_share_rewritten_videos_through_redis(module_servers, env, tmp_path):
    from test_cache_redis import RedisProc
    sim, _ = env
    redis = RedisProc(str(tmp_path))
    try:
        a, b = (module_servers.gateway({"redis_url": redis.url}, backends=[sim]) for _ in range(2))
        clip = corpus.motion_clip(2, 320, 240, 15, seed=77)
        ra = chat(a, [video_part(uri(clip))])
        sent_a = sent_video(sim)
        rb = chat(b, [video_part(uri(clip))])
        assert detail(ra)["outcome"] == "rewritten" and detail(rb)["outcome"] == "l1_hit"
        assert sent_video(sim) == sent_a and tokens_header(ra) == tokens_header(rb)
    finally:
        redis.stop()


def test_concurrent_requests_for_one_video_share_one_rewrite(env):
    sim, gw = env
    clip = corpus.motion_clip(3, 640, 360, 30, seed=88)      # ~0.5 s to rewrite: the others arrive meanwhile
    before = _metric(gw, "vlm_gateway_videos_total", 'outcome="rewritten"')
    with cf.ThreadPoolExecutor(4) as ex:
        rs = list(ex.map(lambda _: chat(gw, [video_part(uri(clip))]), range(4)))
    assert all(r.status_code == 200 for r in rs), [r.text[:200] for r in rs]
    outcomes = sorted(detail(r)["outcome"] for r in rs)
    assert outcomes.count("rewritten") == 1 and set(outcomes) <= {"rewritten", "shared", "l1_hit"}, outcomes
    assert _metric(gw, "vlm_gateway_videos_total", 'outcome="rewritten"') == before + 1
    assert len({tokens_header(r) for r in rs}) == 1
