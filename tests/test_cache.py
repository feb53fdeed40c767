"""L3 response cache end to end: real gateway and simulator processes, the OpenAI SDK."""

from __future__ import annotations

import base64
import hashlib
import io
import uuid

import httpx
import openai
import pytest
from PIL import Image

from conftest import SIM_MODEL

HEADER = "x-vlm-gateway-cache"


def png(color) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), color).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def user(text, image=None):
    if image is None:
        return {"role": "user", "content": text}
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}},
                                        {"type": "text", "text": text}]}


def ask(client: openai.OpenAI, messages, *, stream=False, headers=None, **kw):
    """(cache header, text, completion-or-chunks)"""
    params = {"model": SIM_MODEL, "temperature": 0, "max_tokens": 6, **kw}
    raw = client.chat.completions.with_raw_response.create(messages=messages, stream=stream,
                                                           extra_headers=headers or {}, **params)
    if not stream:
        c = raw.parse()
        return raw.headers.get(HEADER), c.choices[0].message.content, c
    chunks = list(raw.parse())
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    return raw.headers.get(HEADER), text, chunks


def fresh(prefix="q") -> str:
    return f"{prefix} {uuid.uuid4().hex[:8]} please describe"


@pytest.fixture(scope="module")
def env(module_servers):
    sim = module_servers.sim(echo=True)
    gw = module_servers.gateway({}, backends=[sim])
    client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)
    return sim, gw, client


def sim_count(sim) -> int:
    return sim.sim_stats()["received"]


def test_exact_miss_then_hit_without_touching_the_backend(env):
    sim, gw, client = env
    msgs = [user(fresh())]
    h1, t1, c1 = ask(client, msgs)
    n = sim_count(sim)
    h2, t2, c2 = ask(client, msgs)
    assert (h1, h2) == ("miss", "hit-exact")
    assert t2 == t1 and sim_count(sim) == n
    assert c2.id != c1.id and c2.id.startswith("chatcmpl-") and c2.created >= c1.created
    assert c2.usage is not None and c2.usage.completion_tokens == c1.usage.completion_tokens


def test_stream_miss_is_recorded_and_replayed_as_chunks(env):
    sim, gw, client = env
    msgs = [user(fresh("stream"))]
    h1, t1, chunks1 = ask(client, msgs, stream=True, stream_options={"include_usage": True})
    n = sim_count(sim)
    h2, t2, chunks2 = ask(client, msgs, stream=True, stream_options={"include_usage": True})
    assert (h1, h2) == ("miss", "hit-exact") and sim_count(sim) == n
    assert t2 == t1 and t1
    assert all(ch.object == "chat.completion.chunk" for ch in chunks2)
    assert len({ch.id for ch in chunks2}) == 1 and chunks2[0].id not in {ch.id for ch in chunks1}
    assert chunks2[0].choices[0].delta.role == "assistant"
    finish = [ch.choices[0].finish_reason for ch in chunks2 if ch.choices and ch.choices[0].finish_reason]
    assert finish == ["length"]
    assert chunks2[-1].choices == [] and chunks2[-1].usage.completion_tokens == 6
    # without include_usage: no usage chunk
    h3, t3, chunks3 = ask(client, msgs, stream=True)
    assert h3 == "hit-exact" and t3 == t1 and all(ch.usage is None for ch in chunks3)
    # stream and non-stream share the entry
    h4, t4, c4 = ask(client, msgs)
    assert h4 == "hit-exact" and t4 == t1 and c4.object == "chat.completion"


def test_non_stream_miss_replays_on_a_stream_request(env):
    sim, gw, client = env
    msgs = [user(fresh("ns"))]
    h1, t1, _ = ask(client, msgs)
    h2, t2, chunks = ask(client, msgs, stream=True, stream_options={"include_usage": True})
    assert (h1, h2) == ("miss", "hit-exact") and t2 == t1
    assert chunks[-1].usage is not None


def test_sampling_requests_bypass_unless_the_client_opts_in(env):
    sim, gw, client = env
    msgs = [user(fresh("hot"))]
    assert ask(client, msgs, temperature=0.8)[0] == "bypass"
    assert ask(client, msgs, temperature=0.8)[0] == "bypass"
    on = {"x-vlm-gateway-cache-mode": "on"}
    assert ask(client, msgs, temperature=0.8, headers=on)[0] == "miss"
    assert ask(client, msgs, temperature=0.8, headers=on)[0] == "hit-exact"
    seeded = [user(fresh("seed"))]
    assert [ask(client, seeded, temperature=0.8, seed=7)[0] for _ in range(2)] == ["miss", "hit-exact"]


def test_cache_mode_off_and_cache_control(env):
    sim, gw, client = env
    msgs = [user(fresh("cc"))]
    assert ask(client, msgs, headers={"x-vlm-gateway-cache-mode": "off"})[0] == "bypass"
    assert ask(client, msgs, headers={"cache-control": "no-store"})[0] == "bypass"
    assert ask(client, msgs)[0] == "miss"  # neither of the above stored anything
    assert ask(client, msgs)[0] == "hit-exact"
    n = sim_count(sim)
    assert ask(client, msgs, headers={"cache-control": "no-cache"})[0] == "bypass"
    assert sim_count(sim) == n + 1  # went to the backend
    other = [user(fresh("nc"))]
    assert ask(client, other, headers={"cache-control": "no-cache"})[0] == "bypass"
    assert ask(client, other)[0] == "hit-exact"  # no-cache still stores the fresh answer


def test_a_different_image_is_a_miss(env):
    sim, gw, client = env
    q = fresh("img")
    red, blue = png((200, 10, 10)), png((10, 10, 200))
    assert ask(client, [user(q, red)])[0] == "miss"
    assert ask(client, [user(q, red)])[0] == "hit-exact"
    assert ask(client, [user(q, blue)])[0] == "miss"
    # same image, trivially different wording
    assert ask(client, [user(q.upper() + "?", red)])[0] == "hit-normalized"


def test_earlier_turns_matter(env):
    sim, gw, client = env
    q = user("and what about the second one?")
    a = [user(fresh("turn-a")), {"role": "assistant", "content": "the first one is red"}, q]
    b = [user(fresh("turn-b")), {"role": "assistant", "content": "the first one is red"}, q]
    assert ask(client, a)[0] == "miss"
    assert ask(client, a)[0] == "hit-exact"
    assert ask(client, b)[0] == "miss"


def test_normalized_level_catches_trivial_variants(env):
    sim, gw, client = env
    tag = uuid.uuid4().hex[:8]
    assert ask(client, [user(f"What's the total on receipt {tag}?")])[0] == "miss"
    assert ask(client, [user(f"hey, can you please tell me what is the TOTAL on receipt {tag}")])[0] == \
        "hit-normalized"
    assert ask(client, [user(f"What's the tax on receipt {tag}?")])[0] == "miss"


def test_answers_cut_by_the_engine_limit_are_not_stored(env):
    sim, gw, client = env
    msgs = [user(fresh("nolimit"))]
    # no max_tokens: the simulator stops at its own limit (finish_reason "length")
    assert ask(client, msgs, max_tokens=None)[0] == "miss"
    assert ask(client, msgs, max_tokens=None)[0] == "miss"


def test_broken_streams_are_not_stored(env):
    sim, gw, client = env
    msgs = [user(fresh("broken"))]
    sim.sim_faults(die_mid_stream=1)
    with pytest.raises(openai.APIError):
        ask(client, msgs, stream=True, max_tokens=8)
    h, text, _ = ask(client, msgs, stream=True, max_tokens=8)
    assert h == "miss" and text
    assert ask(client, msgs, stream=True, max_tokens=8)[0] == "hit-exact"


def test_errors_are_not_stored(env):
    sim, gw, client = env
    msgs = [user(fresh("err"))]
    sim.sim_faults(fail_next=5, fail_status=500)
    with pytest.raises(openai.APIStatusError):
        ask(client, msgs)
    sim.sim_faults(fail_next=0)
    assert ask(client, msgs)[0] == "miss"


def test_completions_route_is_not_cached(env):
    sim, gw, client = env
    r = httpx.post(gw.base_url + "/completions", json={"model": SIM_MODEL, "prompt": "hi", "temperature": 0,
                                                        "max_tokens": 3}, timeout=10)
    assert r.status_code == 200 and HEADER not in r.headers


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def test_tenants_never_share_answers(servers):
    sim = servers.sim(echo=True)
    gw = servers.gateway({"auth": {"tenants": [{"name": "team-a", "key_sha256": _sha("key-a")},
                                               {"name": "team-b", "key_sha256": _sha("key-b")},
                                               {"name": "team-c", "key_sha256": _sha("key-c"),
                                                "cache_scope": "shared"},
                                               {"name": "team-d", "key_sha256": _sha("key-d"),
                                                "cache_scope": "shared"}]}}, backends=[sim])
    a, b, c, d = (openai.OpenAI(base_url=gw.base_url, api_key=f"key-{t}", max_retries=0) for t in "abcd")
    msgs = [user(fresh("tenant"), png((1, 2, 3)))]
    assert ask(a, msgs)[0] == "miss"
    assert ask(a, msgs)[0] == "hit-exact"
    assert ask(b, msgs)[0] == "miss"  # same request, other tenant
    assert ask(b, [user(msgs[0]["content"][1]["text"].upper(), png((1, 2, 3)))])[0] == "hit-normalized"
    # a client header cannot pick another tenant's scope
    assert ask(b, [user(fresh("tenant2"))], headers={"x-vlm-gateway-tenant": "team-a"})[0] == "miss"
    # tenants configured with one cache_scope share on purpose
    shared = [user(fresh("scope"))]
    assert ask(c, shared)[0] == "miss" and ask(d, shared)[0] == "hit-exact"
    assert ask(a, shared)[0] == "miss"
