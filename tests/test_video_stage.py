"""The video stage's pieces in process: settings from config (the image budget of the
model, the engine spec), their L1 key, the recount for a backend profile's video pixel
budget, the timestamp tokenizer option, config checks, the per-state budget hook, and
one request through the media stage with the timestamp text counted by a tokenizer."""

from __future__ import annotations

import asyncio
import base64
import subprocess
import sys
import orjson
import pytest

pytest.importorskip("av")

from vlm_gateway import video_tokens as vt  # noqa: E402
from vlm_gateway.backends.backend import Backend  # noqa: E402
from vlm_gateway import ConfigError, load_config  # noqa: E402
import video_corpus as corpus  # noqa: E402
from vlm_gateway.stages.video.budget import frame_budget  # noqa: E402
from vlm_gateway.stages.video.rewrite import rewrite_video  # noqa: E402
from vlm_gateway.stages.video.settings import VideoSettings  # noqa: E402
from vlm_gateway.stages.video.stage import recount  # noqa: E402
from vlm_gateway.proxy.gateway import Gateway  # noqa: E402
from vlm_gateway.stages.images.media import MediaStage  # noqa: E402
from vlm_gateway.core.request import parse_chat  # noqa: E402

CLIP = corpus.motion_clip(2, 320, 240, 15)


def gateway(**video) -> Gateway:
    return Gateway(load_config(None, environ={}, overrides={"video": video,
                                                            "images": {"models": {"small": {"max_long_side": 256}}}}))


def video_of(gw: Gateway):
    return gw.chain.find(MediaStage).video


def test_settings_follow_the_models_image_budget_and_the_engine():
    gw = gateway(engine_max_pixels=8_000_000, crf=23)
    v = video_of(gw)
    s, key = v.settings("any")
    assert s.max_long_side == 768 and s.grid_factor == 32 and s.crf == 23
    assert s.engine.max_pixels == 8_000_000 and s.max_bytes == gw.cfg.limits.max_video_bytes
    small, key_small = v.settings("small")
    assert small.max_long_side == 256 and key_small != key
    assert video_of(gateway(plan="frames")).settings("any")[1] != key
    assert video_of(gateway(max_long_side=512)).settings("any")[0].max_long_side == 512


def test_recount_for_a_backend_profiles_video_budget():
    gw = gateway()
    v = video_of(gw)
    cfg = load_config(None, environ={}, overrides={"backends": [{"url": "http://127.0.0.1:9/v1"}]})
    b = Backend.from_config(cfg.backends[0], 0, {"video_max_pixels": 20 * 64 * 64})
    spec = v.spec_for(b)
    assert spec.max_pixels == 20 * 64 * 64 and v.spec_for(None) is v.spec
    r = rewrite_video(CLIP, VideoSettings(max_long_side=320))
    s, _ = v.settings("any")
    entry = v._rewrite(CLIP, s, "any")
    before, after = recount(entry, spec, v.count)
    # the engine resizes the frames to its smaller volume budget: fewer tokens, by its own rule
    assert after == vt.video_tokens(entry.frames, float(r.plan.rate), entry.width, entry.height, spec).total
    assert after < entry.tokens_after and before < entry.tokens_before
    assert recount(entry, v.spec, v.count) == (entry.tokens_before, entry.tokens_after)


def _tokenizer(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["abc"], tokenizers.trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return str(path)


def test_timestamp_text_counted_with_the_served_tokenizer(tmp_path):
    path = _tokenizer(tmp_path)
    gw = gateway(tokenizer=path)
    qwen = gateway()
    assert video_of(gw).settings("m")[1] != video_of(qwen).settings("m")[1]   # another L1 entry
    body = {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + base64.b64encode(CLIP).decode()}}]}]}

    async def run(g):
        req = parse_chat(orjson.dumps(body), {})
        await g.chain.find(MediaStage)(req)
        return req
    req = asyncio.run(run(gw))
    (part,) = req.media
    e = part.video.entry
    count = vt.tokenizer_counter(path)
    want = vt.video_tokens(e.frames, 2.0, e.width, e.height, count=count)
    assert part.tokens_after == want.total
    assert want.timestamp_tokens == sum(len(vt.timestamp_text(t).encode()) for t in want.timestamps)  # a byte a token
    assert req.response_headers["x-vlm-gateway-video-tokens"].endswith(f"after={want.total}")
    (qpart,) = asyncio.run(run(qwen)).media
    assert qpart.tokens_after == vt.video_tokens(e.frames, 2.0, e.width, e.height).total != part.tokens_after


@pytest.mark.parametrize("video,msg", [
    ({"fps": 4.0}, "video.fps: must be <= video.engine_fps"),
    ({"fps": 0.0}, "video.fps: must be > 0"),
    ({"min_fps": 3.0}, "video.min_fps"),
    ({"max_frames": 1}, "video.max_frames"),
    ({"max_long_side": 8}, "video.max_long_side"),
    ({"plan": "best"}, "video.plan: expected one of groups, frames"),
    ({"tokenizer": "/nonexistent/tokenizer.json"}, "video.tokenizer: no such file"),
    ({"engine_max_pixels": 0}, "video.engine_max_pixels"),
])
def test_video_config_checked(video, msg):
    with pytest.raises(ConfigError, match=msg.replace(".", r"\.")):
        load_config(None, environ={}, overrides={"video": video})


def test_cli_exits_2_naming_the_video_key(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("video:\n  tokenizer: /nonexistent/tokenizer.json\n")
    r = subprocess.run([sys.executable, "-m", "vlm_gateway", "serve", "--config", str(p)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "video.tokenizer" in r.stderr


def test_per_state_budget_hook_sizes_every_frame_at_the_largest_answer():
    """A content-aware budget (the legibility one, later) is asked once per distinct
    state with its pixels; the largest answer, within the ceiling, sizes all frames."""
    data, times = corpus.screen_recording(12, 640, 360, 10, seed=3)
    asked = []

    def per_state(frame, source, ceiling):
        asked.append((frame.shape, source, ceiling))
        return (256, 160) if len(asked) != 2 else (384, 224)   # the second state needs more pixels

    r = rewrite_video(data, VideoSettings(max_long_side=640), frame_budget(640, 32, per_state))
    assert len(asked) == len(times)                                   # once per state, not per frame
    assert all(a == ((352, 640, 3), (640, 360), (640, 352)) for a in asked)
    assert (r.width, r.height) == (384, 224)
    # no hook: the ceiling
    import numpy as np
    assert frame_budget(640, 32)(640, 360, None) == frame_budget(640, 32)(640, 360, np.zeros((352, 640, 3))) \
        == (640, 352)
    greedy = frame_budget(256, 32, lambda f, s, c: (4096, 4096))
    assert greedy(1920, 1080, np.zeros((128, 256, 3), np.uint8)) == (256, 128)   # never above the ceiling


def test_video_off_forwards():
    gw = gateway(enabled=False)
    assert video_of(gw) is None
    assert gw.chain.find(MediaStage).rewrites["video"].__name__ == "forward"
