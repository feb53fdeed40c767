"""Routing end to end: a real gateway in front of 2-4 simulator processes whose
gateway-side GPU profiles differ; the OpenAI SDK as the client. Tests marked with
``engine`` run against simulators in vLLM mode and in TensorRT-LLM mode (trtllm-serve's
load endpoints, backends configured as ``engine: trtllm``)."""

from __future__ import annotations

import base64
import concurrent.futures as cf
import io
import threading

import httpx
import openai
import pytest
from PIL import Image

from conftest import SIM_MODEL
from waiting import wait_until


def sim_profile(name: str) -> str:
    """The simulator's timing profile of the same name when it has one, else its fast one:
    what is under test here is the gateway's routing, whose limits come from the gateway
    profile given to each backend."""
    from vlm_gateway.backends.sim import profiles
    names = profiles.profile_names() if hasattr(profiles, "profile_names") else list(profiles.PROFILES)
    return name if name in names else "fast"


def png(color: tuple[int, int, int], size=(64, 48)) -> str:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def backends_cfg(sims, profiles, engine: str = "sim"):
    return [{"url": s.base_url, "name": f"sim{i}", "engine": engine, "profile": p}
            for i, (s, p) in enumerate(zip(sims, profiles))]


# (simulator --engine, gateway backends[].engine)
ENGINES = pytest.mark.parametrize("engine", [("vllm", "sim"), ("trtllm", "trtllm")], ids=["vllm", "trtllm"])


def client(gw, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=30, **kw)


def chat(c: openai.OpenAI, messages, max_tokens=4, **kw):
    """(completion, backend name) of one request."""
    raw = c.chat.completions.with_raw_response.create(model=SIM_MODEL, messages=messages, max_tokens=max_tokens,
                                                      **kw)
    return raw.parse(), raw.headers.get("x-vlm-gateway-backend")


def gateway_metric(gw, name: str, **labels) -> float:
    total = 0.0
    for line in httpx.get(gw.url + "/metrics", timeout=5).text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def sim_images_seen(sim) -> list[int]:
    """Number of image parts in every request body the simulator received."""
    out = []
    for body in sim.sim_requests():
        n = 0
        for m in body.get("messages", []):
            if isinstance(m.get("content"), list):
                n += sum(1 for p in m["content"] if p.get("type") == "image_url")
        out.append(n)
    return out


# -- filter by profile -----------------------------------------------------------------------
def test_three_image_request_never_lands_on_a_one_image_profile(servers):
    names = ["rtx4060ti", "rtx3090", "h200"]
    sims = [servers.sim(profile=sim_profile(n)) for n in names]
    gw = servers.gateway({"routing": {"policy": "affinity"}, "backends": backends_cfg(sims, names)})
    c = client(gw)
    seen = set()
    for i in range(8):
        imgs = [{"type": "image_url", "image_url": {"url": png((i * 30 % 255, k * 60, 7))}} for k in range(3)]
        _, b = chat(c, [{"role": "user", "content": imgs + [{"type": "text", "text": f"compare {i}"}]}])
        seen.add(b)
        one = [{"type": "image_url", "image_url": {"url": png((i, 200, 9 * i % 255))}}]
        chat(c, [{"role": "user", "content": one + [{"type": "text", "text": f"one {i}"}]}])
    assert seen == {"sim2"}
    assert all(n <= 1 for n in sim_images_seen(sims[0]))
    assert all(n <= 2 for n in sim_images_seen(sims[1]))
    assert 3 in sim_images_seen(sims[2])
    # single-image requests still use every profile
    assert sim_images_seen(sims[0]) and sim_images_seen(sims[1])
    # nine images fit no profile: a clear 400, not a lost request
    imgs = [{"type": "image_url", "image_url": {"url": png((k, k, k))}} for k in range(9)]
    with pytest.raises(openai.BadRequestError) as e:
        chat(c, [{"role": "user", "content": imgs + [{"type": "text", "text": "too many"}]}])
    assert e.value.code == "no_backend_admits"


def test_context_check_counts_a_screenshot_at_the_size_the_budget_sends(servers):
    """A 1080p screenshot of small text is sent at its full 1920x1080 (2040 visual tokens)
    by the legibility-aware budget: against a 1400-token context it is refused before any
    engine sees it, where the fixed 768 px estimate (336 tokens) would have let it through
    to fail there. A 1080p photo, sent at 768x448, still fits."""
    import image_corpus as C
    sim = servers.sim()
    gw = servers.gateway({"profiles": {"shortctx": {"base": "h200", "max_model_len": 1400, "image_max_long_side": 0}},
                          "backends": backends_cfg([sim], ["shortctx"])})
    c = client(gw)

    def ask(data: bytes, mime: str):
        url = f"data:{mime};base64," + base64.b64encode(data).decode()
        return chat(c, [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                     {"type": "text", "text": "what does it say?"}]}],
                    max_tokens=200)

    with pytest.raises(openai.BadRequestError) as e:
        ask(C.desktop_screenshot_png(1920, 1080), "image/png")
    assert e.value.code == "no_backend_admits" and "exceed the 1400-token context" in str(e.value)
    assert not sim_images_seen(sim)
    done, _ = ask(C.photo_jpeg(1920, 1080), "image/jpeg")
    assert done.choices[0].message.content is not None and sim_images_seen(sim) == [1]


def test_images_are_sent_within_the_profiles_pixel_budget(servers):
    """With no long-side cap, the profile's image_max_pixels (the engine's max_pixels: it
    would shrink anything larger itself) still bounds what is sent, per image on the token
    grid: a 1080p screenshot the legible budget keeps whole is sent at 1696x960, once (one
    rewrite: the only backend's caps are the model's)."""
    import image_corpus as C
    sim = servers.sim()
    gw = servers.gateway({"profiles": {"nocap": {"base": "h200", "image_max_long_side": 0}},
                          "backends": backends_cfg([sim], ["nocap"])})
    url = "data:image/png;base64," + base64.b64encode(C.desktop_screenshot_png(1920, 1080)).decode()
    raw = client(gw).chat.completions.with_raw_response.create(
        model=SIM_MODEL, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "read it"}]}])
    assert raw.headers["x-vlm-gateway-visual-tokens"] == "before=2040;after=1590"
    [body] = sim.sim_requests()
    sent = body["messages"][0]["content"][0]["image_url"]["url"]
    im = Image.open(io.BytesIO(base64.b64decode(sent.split(",", 1)[1])))
    assert im.size == (1696, 960) and im.width * im.height <= 1638400
    assert gateway_metric(gw, "vlm_gateway_image_rewrite_seconds_count") == 1


def test_large_image_is_rewritten_to_the_small_profile_budget(servers):
    """A 12 MP photo routed to the RTX 4060 Ti profile reaches it at that profile's 512 px
    budget (the image stage rewrites for the chosen backend)."""
    sim = servers.sim(profile=sim_profile("rtx4060ti"))
    gw = servers.gateway({"backends": backends_cfg([sim], ["rtx4060ti"])})
    buf = io.BytesIO()
    Image.effect_noise((4000, 3000), 40).convert("RGB").save(buf, "JPEG", quality=70)
    url = "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()
    _, b = chat(client(gw), [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                                          {"type": "text", "text": "what is it?"}]}])
    assert b == "sim0"
    sent = sim.sim_requests()[-1]["messages"][0]["content"][0]["image_url"]["url"]
    data = base64.b64decode(sent.split(",", 1)[1])
    w, h = Image.open(io.BytesIO(data)).size
    assert max(w, h) <= 512 and w % 32 == 0 and h % 32 == 0, (w, h)


# -- affinity --------------------------------------------------------------------------------
@ENGINES
def test_multi_turn_chats_stick_and_distinct_chats_spread(servers, engine):
    sims = [servers.sim(profile=sim_profile("h200"), engine=engine[0]) for _ in range(3)]
    gw = servers.gateway({"routing": {"policy": "affinity"},
                          "backends": backends_cfg(sims, ["h200"] * 3, engine[1])})
    c = client(gw)
    system = {"role": "system", "content": "You are a careful visual assistant."}
    chats = {}
    for i in range(9):  # nine conversations, each about its own image, interleaved turn by turn
        chats[i] = [system, {"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": png((i * 25, 255 - i * 20, 90))}},
            {"type": "text", "text": "What is in this picture?"}]}]
    placed: dict[int, list[str]] = {i: [] for i in chats}
    for turn in range(3):
        for i, msgs in chats.items():
            comp, b = chat(c, msgs, max_tokens=6)
            placed[i].append(b)
            msgs.append({"role": "assistant", "content": comp.choices[0].message.content})
            msgs.append({"role": "user", "content": f"Tell me more, part {turn + 2}."})
    for i, bs in placed.items():
        assert len(set(bs)) == 1, f"chat {i} moved between backends: {bs}"
    firsts = [bs[0] for bs in placed.values()]
    counts = {b: firsts.count(b) for b in set(firsts)}
    assert len(counts) == 3 and max(counts.values()) <= 4, counts
    assert gateway_metric(gw, "vlm_gateway_routing_decisions_total", policy="affinity", outcome="affinity") >= 18


# -- failover --------------------------------------------------------------------------------
@ENGINES
def test_killing_a_simulator_mid_test_loses_no_request(servers, engine):
    sims = [servers.sim(profile="fast", token_rate=40, engine=engine[0]) for _ in range(3)]
    gw = servers.gateway({"routing": {"policy": "least_loaded", "max_retries": 2},
                          "backends": backends_cfg(sims, ["h200"] * 3, engine[1])})
    c = client(gw)
    outcomes: list[str] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        msgs = [{"role": "user", "content": f"request {i}"}]
        try:
            if i % 2:
                stream = c.chat.completions.create(model=SIM_MODEL, messages=msgs, max_tokens=20, stream=True)
                text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
                res = "answer" if text else "empty"
            else:
                comp = c.chat.completions.create(model=SIM_MODEL, messages=msgs, max_tokens=20)
                res = "answer" if comp.choices[0].message.content else "empty"
        except openai.APIError as e:  # an explicit error: HTTP status or in-stream error event
            res = f"error:{type(e).__name__}"
        with lock:
            outcomes.append(("s" if i % 2 else "n") + ":" + res)

    with cf.ThreadPoolExecutor(24) as ex:
        futs = [ex.submit(one, i) for i in range(24)]
        # kill once every request is in flight (20 tokens at 40/s = 0.5 s each)
        wait_until(lambda: gateway_metric(gw, "vlm_gateway_backend_inflight") >= 24 or any(f.done() for f in futs),
                   "24 requests in flight (or one already answered)", every=0.02)
        sims[1].kill()
        for f in futs:
            f.result(timeout=30)
    assert len(outcomes) == 24 and not [o for o in outcomes if o.endswith("empty")], outcomes
    # a non-stream answer sends nothing before it is complete: the dead backend's share was
    # retried on the others, so every non-stream request got its answer
    assert all(o == "n:answer" for o in outcomes if o.startswith("n:")), outcomes
    # ... and the kill did hit work in flight: retried sends, or streams ended by an error event
    assert gateway_metric(gw, "vlm_gateway_retries_total") + sum(o.startswith("s:error") for o in outcomes) >= 1
    # after the kill everything goes to the survivors
    for i in range(6):
        _, b = chat(c, [{"role": "user", "content": f"after {i}"}])
        assert b in ("sim0", "sim2")


def test_ejected_backend_comes_back_after_recovery(servers):
    sims = [servers.sim(profile="fast") for _ in range(2)]
    gw = servers.gateway({"routing": {"policy": "round_robin", "eject_after_failures": 2, "eject_base_s": 0.3,
                                      "health_interval_s": 0.2},
                          "backends": backends_cfg(sims, ["h200", "h200"])})
    c = client(gw)
    sims[0].sim_faults(fail_next=1000, fail_status=500)
    for i in range(6):  # 5xx before the first byte: retried on sim1, sim0 ejected
        _, b = chat(c, [{"role": "user", "content": f"x{i}"}])
        assert b == "sim1"
    assert gateway_metric(gw, "vlm_gateway_backend_circuit_state", backend="sim0", state="closed") == 0
    assert gateway_metric(gw, "vlm_gateway_retries_total", reason="upstream_5xx") >= 2
    sims[0].sim_faults(fail_next=0)  # it recovers: half-open after the back-off, closed on success
    wait_until(lambda: chat(c, [{"role": "user", "content": "again"}])[1] == "sim0", "a request goes to sim0 again")
    assert gateway_metric(gw, "vlm_gateway_backend_circuit_state", backend="sim0", state="closed") == 1

    # killed outright: probes mark it down; restarted on its port, it is used again
    port = sims[0].port
    sims[0].kill()
    wait_until(lambda: gateway_metric(gw, "vlm_gateway_backend_circuit_state", backend="sim0", state="down") == 1,
               "sim0's circuit shows down", every=0.02)
    assert {chat(c, [{"role": "user", "content": f"d{i}"}])[1] for i in range(4)} == {"sim1"}
    servers.sim(profile="fast", port=port)
    wait_until(lambda: chat(c, [{"role": "user", "content": "back"}])[1] == "sim0", "the restarted sim0 is used again")


# -- admission -------------------------------------------------------------------------------
def test_full_backends_queue_then_429_with_retry_after(servers):
    sim = servers.sim(profile="fast", token_rate=10)  # 10 tokens = 1 s per request
    gw = servers.gateway({"routing": {"queue_timeout_s": 0.3, "max_queue": 8},
                          "profiles": {"one-slot": {"base": "h200", "max_num_seqs": 1}},
                          "backends": backends_cfg([sim], ["one-slot"])})
    url = gw.base_url + "/chat/completions"

    def post(i):
        return httpx.post(url, json={"model": SIM_MODEL, "max_tokens": 10,
                                     "messages": [{"role": "user", "content": f"q{i}"}]}, timeout=30)

    with cf.ThreadPoolExecutor(3) as ex:
        rs = list(ex.map(post, range(3)))
    codes = sorted(r.status_code for r in rs)
    assert codes == [200, 429, 429], [r.text for r in rs]
    for r in rs:
        if r.status_code == 429:
            assert r.headers["retry-after"].isdigit()
            assert r.json()["error"]["code"] == "backends_busy"
            assert r.json()["error"]["type"] == "rate_limit_error"
    assert gateway_metric(gw, "vlm_gateway_rejections_total", status="429", reason="queue_timeout") == 2
    assert gateway_metric(gw, "vlm_gateway_queue_depth") == 0
    # the engine never saw more than its profile's one sequence at a time
    assert sim.sim_stats()["finished"] == 1


def test_queued_request_is_served_when_a_slot_frees(servers):
    sim = servers.sim(profile="fast", token_rate=20)  # 0.5 s per request
    gw = servers.gateway({"routing": {"queue_timeout_s": 5},
                          "profiles": {"one-slot": {"base": "h200", "max_num_seqs": 1}},
                          "backends": backends_cfg([sim], ["one-slot"])})
    c = client(gw)
    with cf.ThreadPoolExecutor(3) as ex:
        res = list(ex.map(lambda i: chat(c, [{"role": "user", "content": f"w{i}"}], max_tokens=10)[1], range(3)))
    assert res == ["sim0"] * 3
    assert gateway_metric(gw, "vlm_gateway_routing_decisions_total", outcome="queued") >= 2
