"""SLO-aware image budgets end to end: a gateway process whose TTFT target no engine can
meet (1 ms) steps its level to the deepest one; what the engine receives, the
x-vlm-gateway-image-budget header, the gauge, the /ui status and the L3 cache follow it."""

from __future__ import annotations

import base64
import hashlib
import io
import re

import httpx
import openai
from PIL import Image

import text_corpus as T
from conftest import SIM_MODEL, until
import image_corpus as C

BIG = "data:image/jpeg;base64," + base64.b64encode(C.photo_jpeg(1920, 1080)).decode()
# a 1920x1080 UI screenshot with 12 px text: its legible floor is above 768
TEXT = "data:image/png;base64," + base64.b64encode(T._png(T.ui(1920, 1080, 12, seed=7)[0])).decode()
KEY_A, KEY_B = "slo-tenant-a-key", "slo-tenant-b-key-opted-in"
ADMIN = "slo-admin-key"
HEADER = "x-vlm-gateway-image-budget"


def _sha(k: str) -> str:
    return hashlib.sha256(k.encode()).hexdigest()


def _sent_long_side(sim) -> int:
    body = sim.sim_requests()[-1]
    (url,) = [p["image_url"]["url"] for m in body["messages"] if isinstance(m.get("content"), list)
              for p in m["content"] if p.get("type") == "image_url"]
    im = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    return max(im.size)


def _chat(client: openai.OpenAI, detail: str | None = None, headers: dict | None = None, url: str = BIG, **kw):
    iu = {"url": url, **({"detail": detail} if detail else {})}
    return client.chat.completions.with_raw_response.create(
        model=SIM_MODEL, max_tokens=4, extra_headers=headers or {}, **kw,
        messages=[{"role": "user", "content": [{"type": "text", "text": "what is shown?"},
                                               {"type": "image_url", "image_url": iu}]}])


def _budget(r) -> dict[str, str]:
    """The one image's entry of the budget header, as a dict (param first)."""
    param, *fields = r.headers[HEADER].split(";")
    assert param == "messages[0].content[1].image_url"
    return dict(f.split("=", 1) for f in fields)


def test_level_steps_down_and_images_follow_it(servers):
    sim = servers.sim()
    gw = servers.gateway({
        "slo": {"ttft_ms": 1, "min_samples": 2, "interval_s": 0.05, "down_hold_s": 0.05, "window_s": 60,
                "up_hold_s": 600, "up_hold_max_s": 600},
        "auth": {"admin_key_sha256": _sha(ADMIN), "tenants": [
            {"name": "a", "key_sha256": _sha(KEY_A)},
            {"name": "b", "key_sha256": _sha(KEY_B), "images_below_floor": True}]},
    }, backends=[sim])
    a = openai.OpenAI(base_url=gw.base_url, api_key=KEY_A, max_retries=0)
    b = openai.OpenAI(base_url=gw.base_url, api_key=KEY_B, max_retries=0)
    admin = {"authorization": f"Bearer {ADMIN}"}

    first = _budget(_chat(a))
    assert first["class"] == "no_text" and first["long_side"] == "768" and first["level"] == "0"
    text0 = _budget(_chat(a, url=TEXT))
    assert text0["class"] in ("text", "dense_text")  # the level may have moved: text keeps its floor
    text_side, floor = int(text0["long_side"]), int(text0["legible_floor"])
    assert 768 < floor <= text_side <= 1920

    def deepest():
        a.chat.completions.create(model=SIM_MODEL, max_tokens=2, messages=[{"role": "user", "content": "hi"}])
        pools = httpx.get(gw.url + "/ui/api/status", headers=admin).json()["image_budget"]["pools"]
        return pools and pools[0]["level"] == pools[0]["max_level"] == 4 and pools[0]
    pool = until(deepest, timeout=20)
    assert pool["pool"] == SIM_MODEL and pool["target_ms"] == 1
    metrics = httpx.get(gw.url + "/metrics").text
    measured = re.search(r'^vlm_gateway_slo_ttft_seconds\{pool="qwen3vl-sim"\} (\S+)$', metrics, re.M)
    assert measured and float(measured.group(1)) > 0.001  # what made it step down
    assert re.search(r'^vlm_gateway_image_budget_level\{pool="qwen3vl-sim"\} 4\.0$', metrics, re.M)
    assert re.search(r'^vlm_gateway_slo_ttft_target_seconds\{pool="qwen3vl-sim"\} 0\.001$', metrics, re.M)

    # a photo gives up pixels first: 768 x 0.5 at the deepest level, held at the photo floor (384)
    r = _budget(_chat(a))
    assert (r["long_side"], r["reason"], r["level"]) == ("384", "pressure", "4")
    assert _sent_long_side(sim) == 384
    # text shrinks no further than its legible floor under any level
    r = _budget(_chat(a, url=TEXT))
    assert int(r["long_side"]) == max(floor, round(text_side * 0.67)) and r["level"] == "4"
    assert floor <= _sent_long_side(sim) <= int(r["long_side"])
    # the client opts in: the deepest text factor (0.67) takes it below its floor
    r = _budget(_chat(a, url=TEXT, headers={"x-vlm-gateway-image-policy": "below-floor"}))
    assert int(r["long_side"]) == round(text_side * 0.67) and r["reason"] == "pressure"
    assert _sent_long_side(sim) <= round(text_side * 0.67)
    # detail low opts in too: 448 x 0.67 = 300, held at the photo floor (384)
    r = _budget(_chat(a, url=TEXT, detail="low"))
    assert r["long_side"] == "384" and r["level"] == "4"
    assert _sent_long_side(sim) == 384
    # the tenant setting
    r = _chat(b, url=TEXT)
    assert int(_budget(r)["long_side"]) == round(text_side * 0.67)
    assert _sent_long_side(sim) <= round(text_side * 0.67)
    # "off" still sends the original, whatever the level
    r = _chat(a, headers={"x-vlm-gateway-image-policy": "off"})
    assert r.headers[HEADER] == "messages[0].content[1].image_url;long_side=original;level=0"
    assert _sent_long_side(sim) == 1920

    text = httpx.get(gw.url + "/metrics").text
    degraded = {m.group(1): float(m.group(2)) for m in
                re.finditer(r'^vlm_gateway_images_degraded_total\{class="(\w+)"\} (\S+)$', text, re.M)}
    assert degraded.get("no_text") == 1.0 and degraded.get("unmeasured") == 1.0
    assert degraded.get("text", 0) + degraded.get("dense_text", 0) == 3.0  # to its floor, below it twice

    # an answer read from a degraded image is not cached for anyone (deterministic request twice)
    for _ in range(2):
        r = _chat(b, temperature=0)
        assert r.headers["x-vlm-gateway-cache"] == "miss"
    # a full-budget answer is
    _chat(a, temperature=0, headers={"x-vlm-gateway-image-policy": "1024"})
    r = _chat(a, temperature=0, headers={"x-vlm-gateway-image-policy": "1024"})
    assert r.headers["x-vlm-gateway-cache"] == "hit-exact"
