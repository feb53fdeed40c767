"""The legible image budget: the estimate (legibility.py), the choice (budget.py), the
policy around it, and what a client sees through a running gateway (header, metric,
detail/header/tenant overrides)."""

from __future__ import annotations

import base64
import hashlib
import io

import httpx
import openai
import pytest
from PIL import Image

import text_corpus as T
from conftest import SIM_MODEL
import image_corpus as C
from vlm_gateway.stages.images.budget import choose
from vlm_gateway.stages.images.legibility import NONE, Estimate, estimate
from vlm_gateway.stages.images.policy import Policy, resolve
from vlm_gateway.config import ImagesConfig
from vlm_gateway.stages.images.rewrite import rewrite_bytes


def _im(pair) -> Image.Image:
    return pair[0]


def test_estimate_finds_small_latin_text_at_its_x_height():
    for px in (11, 13, 16):
        e = estimate(_im(T.ui(1920, 1080, px, 1)))
        assert e.kind == "text" and 0.45 * px <= e.text_px <= 0.7 * px, (px, e)
        assert e.horizontal < 0.52


def test_estimate_tells_dense_cjk_from_latin_and_measures_the_glyph():
    e = estimate(_im(T.cjk(1920, 1080, 16, 2)))
    assert e.kind == "text" and e.horizontal >= 0.52 and 12 <= e.text_px <= 17


def test_grid_lines_are_not_text_size():
    e = estimate(_im(T.spreadsheet(1920, 1080, 13, 3)))
    assert e.kind == "text" and e.text_px < 11  # the 24 px row pitch is not taken for the text


def test_photos_have_no_text_and_reduced_decodes_convert_the_size():
    assert estimate(T.photo(1600, 1200, 5)) == NONE
    im = _im(T.document(1240, 1754, 20, 4))
    full = estimate(im)
    half = estimate(im.resize((620, 877), Image.Resampling.BOX), scale=2.0)
    assert half.kind == "text" and abs(half.text_px - full.text_px) <= 2.5


def test_choose_rule():
    # a larger legible size: 1920 * 7 / 8 = 1680 -> 1696, within 15 % of the source: sent as it is
    b = choose(Estimate("text", 8.0, 0.4, 0.3, 50, 0.5), 1920, Policy(legible_text_px=7.0))
    assert (b.long_side, b.legible_floor, b.reason) == (1920, 1696, "source")
    p = Policy()
    text = Estimate("text", 8.0, 0.4, 0.3, 50, 0.5)
    b = choose(text, 1920, p)
    # 1920 * 6.5 / 8 = 1560 -> 1568 on the 32 px grid
    assert (b.cls, b.long_side, b.legible_floor, b.reason) == ("text", 1568, 1568, "legible")
    # 1920 * 6.5 / 7 = 1783 -> 1792: within 15 % of the source, which is sent as it is
    b = choose(Estimate("text", 7.0, 0.4, 0.3, 50, 0.5), 1920, p)
    assert (b.long_side, b.legible_floor, b.reason) == (1920, 1792, "source")
    big = Estimate("text", 40.0, 0.4, 0.3, 50, 0.5)
    assert choose(big, 1920, p).long_side == 768 and choose(big, 1920, p).reason == "floor"
    tiny = Estimate("text", 3.0, 0.4, 0.3, 50, 0.5)
    assert choose(tiny, 5000, p).long_side == 2560 and choose(tiny, 5000, p).reason == "ceiling"
    assert choose(tiny, 1920, p).reason == "source"
    cjk = Estimate("text", 15.0, 0.4, 0.7, 50, 0.5)
    assert choose(cjk, 1920, p).cls == "dense_text" and choose(cjk, 1920, p).long_side == 1536
    assert choose(NONE, 4000, p).long_side == 768 and choose(NONE, 4000, Policy(photo_long_side=512)).long_side == 512


def test_policy_key_and_client_choices():
    cfg = ImagesConfig()
    base = resolve(cfg, "m", "default", None)
    assert base.legible
    assert base.key != Policy(budget="fixed").key  # the rule changes the output: different L1 entries
    assert base.key != Policy(legible_text_px=8.0).key and base.key != Policy(text_max_long_side=1920).key
    for pol in (resolve(cfg, "m", "default", "high"), resolve(cfg, "m", "default", "low"), resolve(cfg, "m", 1024, None)):
        assert pol.budget == "client" and not pol.legible
    assert not resolve(cfg, "m", "default", None, {"budget": "fixed"}).legible  # a tenant's own setting
    cfg2 = ImagesConfig(models={"doc": {"text_max_long_side": 1600}})
    assert resolve(cfg2, "doc", "default", None).text_max_long_side == 1600
    capped = base.capped(1024)
    assert capped.text_max_long_side == 1024 and capped.max_long_side == 768


def test_in_budget_images_pass_through_untouched():
    small = C.screenshot_png(700, 500, (40, 40))
    r = rewrite_bytes(small)
    assert r.passthrough and r.data is small and r.budget is None


def _uri(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


@pytest.fixture(scope="module")
def env(module_servers):
    sim = module_servers.sim()
    sha = hashlib.sha256(b"key-fixed").hexdigest()
    gw = module_servers.gateway({"auth": {"tenants": [
        {"name": "legible", "key_sha256": hashlib.sha256(b"key-legible").hexdigest()},
        {"name": "fixed", "key_sha256": sha, "images": {"budget": "fixed"}}]}}, backends=[sim])
    return sim, gw


def _sent_size(sim) -> tuple[int, int]:
    body = sim.sim_requests()[-1]
    url = [p["image_url"]["url"] for m in body["messages"] if isinstance(m.get("content"), list)
           for p in m["content"] if p.get("type") == "image_url"][0]
    return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).size


def test_gateway_header_metric_and_overrides(env):
    sim, gw = env
    buf = io.BytesIO()
    _im(T.ui(1920, 1080, 16, 3)).save(buf, "PNG")  # 16 px UI text: legible from about 1400 px
    part = {"type": "image_url", "image_url": {"url": _uri(buf.getvalue(), "image/png")}}
    msgs = [{"role": "user", "content": [{"type": "text", "text": "read"}, part]}]
    legible = openai.OpenAI(base_url=gw.base_url, api_key="key-legible")
    raw = legible.chat.completions.with_raw_response.create(model=SIM_MODEL, max_tokens=4, messages=msgs)
    h = raw.headers["x-vlm-gateway-image-budget"]
    assert h.startswith("messages[0].content[1].image_url;class=text;") and "reason=legible" in h
    long_side = int(h.split("long_side=")[1].split(";")[0])
    assert 768 < long_side < 1920 and max(_sent_size(sim)) == long_side
    m = httpx.get(gw.url + "/metrics").text
    assert 'vlm_gateway_image_budgets_total{class="text",reason="legible"}' in m
    # the client asked: its size, as asked
    raw = legible.chat.completions.with_raw_response.create(
        model=SIM_MODEL, max_tokens=4, messages=msgs, extra_headers={"x-vlm-gateway-image-policy": "768"})
    assert "reason=client" in raw.headers["x-vlm-gateway-image-budget"] and max(_sent_size(sim)) == 768
    hi = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": part["image_url"]["url"],
                                                                           "detail": "low"}}]}]
    raw = legible.chat.completions.with_raw_response.create(model=SIM_MODEL, max_tokens=4, messages=hi)
    assert "reason=client" in raw.headers["x-vlm-gateway-image-budget"] and max(_sent_size(sim)) == 448
    # a tenant pinned to the fixed rule
    fixed = openai.OpenAI(base_url=gw.base_url, api_key="key-fixed")
    raw = fixed.chat.completions.with_raw_response.create(model=SIM_MODEL, max_tokens=4, messages=msgs)
    assert "reason=fixed" in raw.headers["x-vlm-gateway-image-budget"] and max(_sent_size(sim)) == 768
