"""The /ui page and its JSON APIs, over real HTTP against a gateway + simulator:
static files, the rewrite API's before/after figures, the status view, and access
control (disabled, open, admin-key protected)."""

from __future__ import annotations

import base64
import hashlib
import io
from fractions import Fraction

import httpx
import pytest
from PIL import Image, ImageDraw

ADMIN_KEY = "ui-admin-key-for-tests"
TENANT_KEY = "tenant-key-for-tests"


def photo_uri(width: int, height: int, fmt: str = "JPEG") -> str:
    im = Image.linear_gradient("L").resize((width, height)).convert("RGB")
    d = ImageDraw.Draw(im)
    for i in range(0, width, max(1, width // 8)):
        d.rectangle([i, height // 4, i + width // 16, height // 2], fill=(30, 120, 200))
    buf = io.BytesIO()
    im.save(buf, fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def open_gw(module_servers):
    sim = module_servers.sim()
    return sim, module_servers.gateway({}, backends=[sim])


def test_static_page_is_served(open_gw):
    _, gw = open_gw
    r = httpx.get(gw.url + "/ui")
    assert r.status_code == 307 and r.headers["location"] == "/ui/"
    page = httpx.get(gw.url + "/ui/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'id="playground"' in page.text and 'src="app.js"' in page.text
    for asset, ctype in (("app.js", "javascript"), ("style.css", "text/css")):
        a = httpx.get(f"{gw.url}/ui/{asset}")
        assert a.status_code == 200 and ctype in a.headers["content-type"]
    assert httpx.get(gw.url + "/ui/nope.js").status_code == 404


def test_rewrite_api_reports_before_and_after(open_gw):
    _, gw = open_gw
    r = httpx.post(gw.url + "/ui/api/rewrite", json={"image": photo_uri(1920, 1080)}, timeout=30)
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["model"] == "qwen3vl-sim" and d["rewritten"] is True and d["backend"] == "sim0"
    assert (d["before"]["width"], d["before"]["height"], d["before"]["tokens"]) == (1920, 1080, 2040)
    assert (d["after"]["width"], d["after"]["height"], d["after"]["tokens"]) == (768, 448, 336)
    assert d["tokens_saved"] == 1704 and d["after"]["bytes"] < d["before"]["bytes"]
    out = base64.b64decode(d["image"].split(",", 1)[1])
    assert Image.open(io.BytesIO(out)).size == (768, 448) and len(out) == d["after"]["bytes"]
    # deterministic: the same image gives the same bytes again
    again = httpx.post(gw.url + "/ui/api/rewrite", json={"image": photo_uri(1920, 1080)}, timeout=30).json()
    assert again["image"] == d["image"]


def test_rewrite_api_detail_and_small_images(open_gw):
    _, gw = open_gw
    low = httpx.post(gw.url + "/ui/api/rewrite", json={"image": photo_uri(1920, 1080), "detail": "low"},
                     timeout=30).json()
    assert max(low["after"]["width"], low["after"]["height"]) <= 448
    small = photo_uri(320, 240, "PNG")
    d = httpx.post(gw.url + "/ui/api/rewrite", json={"image": small}, timeout=30).json()
    assert d["rewritten"] is False and d["image"] == small and d["before"] == d["after"]


@pytest.mark.parametrize("body,code", [
    ({"image": "https://example.com/a.png"}, "invalid_type"),
    ({"image": "data:image/png;base64,!!!"}, "invalid_image"),
    ({"image": "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n broken").decode()}, "invalid_image"),
    ({"image": photo_uri(64, 48), "model": 5}, "missing_required_parameter"),
])
def test_rewrite_api_rejects_bad_input_cleanly(open_gw, body, code):
    _, gw = open_gw
    r = httpx.post(gw.url + "/ui/api/rewrite", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["type"] == "invalid_request_error"


def test_status_shows_backends_and_recent_requests(open_gw):
    sim, gw = open_gw
    r = httpx.post(gw.base_url + "/chat/completions", timeout=30, json={
        "model": "qwen3vl-sim", "max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "status check"},
            {"type": "image_url", "image_url": {"url": photo_uri(1920, 1080)}}]}]})
    assert r.status_code == 200
    rid = r.headers["x-request-id"]
    s = httpx.get(gw.url + "/ui/api/status").json()
    (b,) = s["backends"]
    assert b["name"] == "sim0" and b["healthy"] and b["state"] == "ok" and b["inflight"] == 0
    assert b["models"] == ["qwen3vl-sim"]
    mine = next(q for q in s["recent"] if q.get("request_id") == rid)
    assert mine["status"] == 200 and mine["backend"] == "sim0" and mine["images"] == 1
    assert (mine["visual_tokens_before"], mine["visual_tokens_after"]) == (2040, 336)
    assert s["images"]["visual_tokens"]["before"] >= 2040
    assert s["requests_by_status"]["200"] >= 1
    assert isinstance(s["cache"], list)
    (pool,) = s["image_budget"]["pools"]  # idle engines: full budgets
    assert s["image_budget"]["enabled"] and (pool["pool"], pool["level"], pool["max_level"]) == ("qwen3vl-sim", 0, 4)
    models = httpx.get(gw.url + "/ui/api/models").json()
    assert models == {"models": ["qwen3vl-sim"]}


def test_ui_switched_off(servers):
    sim = servers.sim()
    gw = servers.gateway({"server": {"ui": False}}, backends=[sim])
    assert httpx.get(gw.url + "/ui/").status_code == 404
    assert httpx.get(gw.url + "/ui/api/status").status_code == 404


def tenant():
    return {"name": "team-a", "key_sha256": hashlib.sha256(TENANT_KEY.encode()).hexdigest()}


def test_ui_disabled_when_keys_but_no_admin_key(servers):
    sim = servers.sim()
    gw = servers.gateway({"auth": {"tenants": [tenant()]}}, backends=[sim])
    for path in ("/ui/", "/ui/api/status"):
        r = httpx.get(gw.url + path, headers={"authorization": f"Bearer {TENANT_KEY}"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "ui_disabled"


def test_ui_apis_need_the_admin_key(servers):
    sim = servers.sim()
    gw = servers.gateway({"auth": {"tenants": [tenant()],
                                   "admin_key_sha256": hashlib.sha256(ADMIN_KEY.encode()).hexdigest()}},
                         backends=[sim])
    assert httpx.get(gw.url + "/ui/").status_code == 200  # static, carries no data
    assert httpx.get(gw.url + "/ui/api/config").json() == {"auth": True, "api_auth": True}
    for path in ("/ui/api/status", "/ui/api/models"):
        assert httpx.get(gw.url + path).status_code == 401
        for key in (TENANT_KEY, "wrong"):  # a key, but not the admin key: as for /admin/*
            r = httpx.get(gw.url + path, headers={"authorization": f"Bearer {key}"})
            assert r.status_code == 403 and r.json()["error"]["code"] == "admin_key_required"
        assert httpx.get(gw.url + path, headers={"authorization": f"Bearer {ADMIN_KEY}"}).status_code == 200
    r = httpx.post(gw.url + "/ui/api/rewrite", json={"image": photo_uri(1920, 1080)})
    assert r.status_code == 401
    r = httpx.post(gw.url + "/ui/api/rewrite", json={"image": photo_uri(1920, 1080)}, timeout=30,
                   headers={"authorization": f"Bearer {ADMIN_KEY}"})
    assert r.status_code == 200 and r.json()["after"]["tokens"] == 336


def test_rewrite_video_api_reports_before_and_after(open_gw):
    pytest.importorskip("av")
    import video_corpus as corpus
    _, gw = open_gw
    data, times = corpus.screen_recording(12, 640, 360, 10, seed=5)
    src = "data:video/mp4;base64," + base64.b64encode(data).decode()
    r = httpx.post(gw.url + "/ui/api/rewrite-video", json={"video": src}, timeout=60)
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["model"] == "qwen3vl-sim" and d["rewritten"] is True and d["plan"] == "groups"
    assert d["states"] == len(times)
    b, a = d["before"], d["after"]
    assert (b["width"], b["height"], b["frames"], b["rate"]) == (640, 360, 24, "10")
    assert (a["width"], a["height"]) == (640, 352) and a["frames"] < b["frames"] and Fraction(a["rate"]) <= 2
    assert a["tokens"] < b["tokens"] and d["tokens_saved"] == b["tokens"] - a["tokens"]
    out = base64.b64decode(d["video"].split(",", 1)[1])
    assert out[4:8] == b"ftyp" and len(out) == a["bytes"] and b["bytes"] == len(data)
    assert d["header"].startswith("part=messages[0].content[0].video_url; outcome=")
    # the same rewrite a chat request gets (same settings, same L1 entry)
    again = httpx.post(gw.url + "/ui/api/rewrite-video", json={"video": src}, timeout=60).json()
    assert again["outcome"] == "l1_hit" and again["video"] == d["video"]
    # bad input names the field
    bad = httpx.post(gw.url + "/ui/api/rewrite-video", json={"video": "data:video/mp4;base64,"
                                                             + base64.b64encode(b"<html></html>").decode()})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "video"
    assert bad.json()["error"]["code"] == "unsupported_video_format"
