"""The simulator accepts video parts (data: URIs) and charges them as vLLM 0.24 does:
prompt tokens by the Qwen3-VL video rule, the processor cache and the prefix cache keyed
by the video's content hash, and more engine time for more frames."""

from __future__ import annotations

import base64
import time

import openai
import pytest

pytest.importorskip("av")

from vlm_gateway import video_tokens as vt  # noqa: E402
import video_corpus as corpus  # noqa: E402

MODEL = "qwen3vl-sim"


def video_message(data: bytes, text: str = "hi") -> list[dict]:
    return [{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + base64.b64encode(data).decode()}},
        {"type": "text", "text": text}]}]


@pytest.fixture(scope="module")
def clips():
    return corpus.motion_clip(4, 320, 240, 30, seed=1), corpus.motion_clip(4, 320, 240, 30, seed=2)


def test_video_tokens_cache_and_cost(module_servers, clips):
    sim = module_servers.sim(profile="h200", echo=True, time_scale=1.0)
    client = openai.OpenAI(base_url=sim.base_url, api_key="sim", max_retries=0)
    a, b = clips
    text_only = client.chat.completions.create(model=MODEL, max_tokens=1,
                                               messages=[{"role": "user", "content": "hi"}]).usage.prompt_tokens
    t = time.perf_counter()
    r1 = client.chat.completions.create(model=MODEL, max_tokens=1, messages=video_message(a))
    first = time.perf_counter() - t
    v = vt.video_tokens(120, 30.0, 320, 240)        # 4 s at 30 fps: 8 frames, 4 pairs of 320x256 (7.5 rounds to 8)
    assert (v.frames, v.groups, v.tokens_per_group) == (8, 4, 80)
    # the video replaces the template's 3-token placeholder: text tokens + its own total
    assert r1.usage.prompt_tokens == text_only + v.total
    t = time.perf_counter()
    r2 = client.chat.completions.create(model=MODEL, max_tokens=1, messages=video_message(a))
    again = time.perf_counter() - t
    assert r2.usage.prompt_tokens_details.cached_tokens >= (text_only + v.total) // 16 * 16 - 16
    assert again < first
    r3 = client.chat.completions.create(model=MODEL, max_tokens=1, messages=video_message(b))
    assert r3.usage.prompt_tokens == r1.usage.prompt_tokens
    assert r3.usage.prompt_tokens_details.cached_tokens < 16        # another video: nothing shared past the text


def test_bad_video_is_400(module_servers):
    sim = module_servers.sim(profile="fast", echo=True)
    client = openai.OpenAI(base_url=sim.base_url, api_key="sim", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="video"):
        client.chat.completions.create(model=MODEL, max_tokens=1, messages=video_message(corpus.HTML))
