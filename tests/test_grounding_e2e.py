"""Coordinates stay in the client's frame, end to end: real gateway processes in front of
the simulator in grounding mode (a perfect locator of colour markers in the image it
received, answering in Qwen3-VL's or Qwen2.5-VL's convention), driven with the OpenAI SDK.

The screenshots are windows on a flat desktop, so the gateway trims them to the window
and downscales them: every coordinate the client receives must land on its target in the
client's own image within 1% of that side.
"""

from __future__ import annotations

import base64
import io
import re
import socket

import httpx
import openai

import pytest
from PIL import Image

from vlm_gateway.backends.sim.grounding import answer_for, desktop, find_targets, model_frame
from vlm_gateway.stages.grounding.frames import parse_header

MODELS = {"qwen3-vl": "qwen3vl-sim", "qwen2.5-vl": "qwen2.5-vl-sim"}
TOL = 0.01

# (width, height, format, window, targets): label -> box in pixels of that screenshot
SCENES = [
    (1920, 1080, "PNG", (260, 140, 1660, 940),
     {"magenta": (400, 220, 520, 280), "cyan": (1400, 800, 1600, 900), "yellow": (300, 600, 340, 640)}),
    (1280, 800, "JPEG", (100, 60, 1180, 760), {"lime": (150, 100, 260, 160), "blue": (900, 500, 1100, 700)}),
    (2560, 1440, "PNG", (400, 300, 2100, 1300), {"magenta": (500, 400, 640, 460), "yellow": (1900, 1100, 2050, 1250)}),
]
_IMAGES = [desktop(w, h, win, t, fmt) for w, h, fmt, win, t in SCENES]
_HEADING = re.compile(r"^Image (\d+):$", re.M)
_JSON = re.compile(r'"(bbox_2d|point_2d)":\s*\[([^\]]*)\],\s*"label":\s*"(\w+)"')
_TOKENS = re.compile(r"<\|object_ref_start\|>(\w+)<\|object_ref_end\|><\|box_start\|>\((-?\d+),(-?\d+)\),"
                     r"\((-?\d+),(-?\d+)\)<\|box_end\|>")
_XML = re.compile(r'<points x1="(-?\d+)" y1="(-?\d+)" alt="(\w+)">')


def uri(data: bytes) -> str:
    mime = "image/png" if data[:4] == b"\x89PNG" else "image/jpeg"
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def image_msg(text: str, scenes: list[int]) -> dict:
    return {"role": "user", "content": [{"type": "text", "text": text},
                                        *({"type": "image_url", "image_url": {"url": uri(_IMAGES[i])}}
                                          for i in scenes)]}


def parse(answer: str, n_images: int) -> list[tuple[int, str, str, list[int]]]:
    """(image number, label, kind, numbers) of every group in an answer."""
    cuts = [(m.start(), int(m.group(1))) for m in _HEADING.finditer(answer)] or [(0, 1)]
    out = []
    for k, (start, n) in enumerate(cuts):
        part = answer[start:cuts[k + 1][0] if k + 1 < len(cuts) else len(answer)]
        out += [(n, m.group(3), m.group(1), [int(v) for v in m.group(2).split(",")]) for m in _JSON.finditer(part)]
        out += [(n, m.group(1), "bbox_2d", [int(m.group(i)) for i in range(2, 6)]) for m in _TOKENS.finditer(part)]
        out += [(n, m.group(3), "point_2d", [int(m.group(1)), int(m.group(2))]) for m in _XML.finditer(part)]
    assert len({c[0] for c in out}) <= n_images
    return out


def errors(answer: str, scenes: list[int], convention: str) -> list[float]:
    """|coordinate - truth| / side for every coordinate, in the client's images."""
    groups = parse(answer, len(scenes))
    expected = sum(len(SCENES[i][4]) for i in scenes)
    assert len(groups) == expected, answer
    out = []
    for n, label, kind, v in groups:
        w, h, _, _, targets = SCENES[scenes[n - 1]]
        x0, y0, x1, y1 = targets[label]
        # the convention applied to the client's image: 0-1000 of it, or pixels of the processor's
        # smart_resize of it (as Qwen2.5-VL's cookbook maps them back)
        ux, uy = model_frame(w, h, convention)
        kx, ky = 1 / ux, 1 / uy
        truth = [x0, y0, x1, y1] if kind == "bbox_2d" else [(x0 + x1) / 2, (y0 + y1) / 2]
        for i, (got, want) in enumerate(zip(v, truth)):
            side, k = (w, kx) if i % 2 == 0 else (h, ky)
            out.append(abs(got * k - want) / side)
    return out


def ask(gw, model: str, messages: list[dict], stream: bool, headers: dict | None = None, **kw):
    """(answer text, response headers) through the OpenAI SDK."""
    client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(model=model, messages=messages, max_tokens=2000,
                                                           stream=stream, extra_headers=headers or {}, **kw)
    if not stream:
        return raw.parse().choices[0].message.content, raw.headers
    text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    return text, raw.headers


def sent_images(sim) -> list[bytes]:
    """The images the engine received in the last request, as bytes."""
    body = sim.sim_requests()[-1]
    return [base64.b64decode(p["image_url"]["url"].split(",", 1)[1])
            for m in body["messages"] if isinstance(m.get("content"), list)
            for p in m["content"] if p.get("type") == "image_url"]


def size(data: bytes) -> tuple[int, int]:
    return Image.open(io.BytesIO(data)).size


@pytest.fixture(scope="module")
def env(module_servers):
    sims = {conv: module_servers.sim(grounding=conv, model=MODELS[conv]) for conv in MODELS}
    gw = module_servers.gateway({"cache": {"mode": "off"}}, backends=list(sims.values()))
    return sims, gw


@pytest.mark.parametrize("convention", list(MODELS))
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("prompt", ["Box every marker.", "Point to every marker.", "Point to them in XML.",
                                    "Answer with box tokens."], ids=["bbox", "point", "xml", "tokens"])
def test_one_screenshot_trimmed_and_downscaled(env, convention, stream, prompt):
    sims, gw = env
    text, h = ask(gw, MODELS[convention], [image_msg(prompt, [0])], stream)
    assert h["x-vlm-gateway-grounding"] == f"convention={convention}; mapping=on"
    t = parse_header(h["x-vlm-gateway-image-transform-1"])
    # the engine received the window only, downscaled: the header says so
    assert t["client"] == (1920, 1080) and t["sent"] == (768, 448)
    assert all(abs(a - b) <= 2 for a, b in zip(t["crop"], SCENES[0][3])), t
    assert size(sent_images(sims[convention])[0]) == (768, 448)
    errs = errors(text, [0], convention)
    assert max(errs) <= TOL, (text, max(errs))
    metrics = httpx.get(gw.url + "/metrics", timeout=5).text
    assert f'vlm_gateway_coordinates_total{{convention="{convention}",outcome="mapped"}}' in metrics


def test_unmapped_answer_would_miss(env):
    """The engine's own answer (in the cropped frame it saw), read on the client's screenshot,
    misses by more than 10% of the side: what clients got before the mapping."""
    sims, gw = env
    text, _ = ask(gw, MODELS["qwen3-vl"], [image_msg("Box every marker.", [0])], False)
    raw = answer_for(sent_images(sims["qwen3-vl"]), "Box every marker.", "qwen3-vl")
    assert raw != text
    assert max(errors(raw, [0], "qwen3-vl")) > 0.10
    assert max(errors(text, [0], "qwen3-vl")) <= TOL


@pytest.mark.parametrize("convention", list(MODELS))
def test_mapping_off_by_request_header(env, convention):
    """Off: nothing is cropped and the answer keeps the engine's numbers; the transform
    header alone lets the client map them (relative ones need nothing after a pure downscale)."""
    sims, gw = env
    text, h = ask(gw, MODELS[convention], [image_msg("Box every marker.", [0])], False,
                  headers={"x-vlm-gateway-grounding": "off"})
    assert h["x-vlm-gateway-grounding"] == f"convention={convention}; mapping=off; reason=request"
    assert size(sent_images(sims[convention])[0]) == (768, 448)  # the 32 px grid stretches it a little
    t = parse_header(h["x-vlm-gateway-image-transform-1"])
    assert t["crop"] == (0, 0, 1920, 1080) and t["sent"] == (768, 448)
    if convention == "qwen3-vl":
        assert max(errors(text, [0], convention)) <= TOL
        return
    assert t["model"] == (756, 448) and t["answer"] == (1932, 1092)  # smart_resize, factor 28
    assert max(errors(text, [0], convention)) > 0.3  # pixels of a 756 px frame read as a 1932 px one
    sx = (t["crop"][2] - t["crop"][0]) / t["model"][0] * t["answer"][0] / t["client"][0]
    sy = (t["crop"][3] - t["crop"][1]) / t["model"][1] * t["answer"][1] / t["client"][1]
    mapped = re.sub(r"(?<=bbox_2d\": )\[([^\]]*)\]", lambda m: "[" + ", ".join(
        str(round(int(v) * (sx if i % 2 == 0 else sy))) for i, v in enumerate(m.group(1).split(","))) + "]", text)
    assert max(errors(mapped, [0], convention)) <= TOL


def test_bad_grounding_header_is_a_400(env):
    _, gw = env
    r = httpx.post(gw.base_url + "/chat/completions", headers={"x-vlm-gateway-grounding": "maybe"},
                   json={"model": MODELS["qwen3-vl"], "messages": [image_msg("Box every marker.", [0])]}, timeout=30)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "x-vlm-gateway-grounding"
    assert r.json()["error"]["code"] == "invalid_grounding_mode"


@pytest.mark.parametrize("convention", list(MODELS))
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_several_images_per_request(env, convention, stream):
    sims, gw = env
    text, h = ask(gw, MODELS[convention], [image_msg("Box every marker.", [0, 1, 2])], stream)
    sent = sent_images(sims[convention])
    # different images: nothing is cropped (an answer might not say which image it means)
    assert [size(im) for im in sent] == [(768, 448), (768, 480), (768, 448)]
    for i in range(3):
        t = parse_header(h[f"x-vlm-gateway-image-transform-{i + 1}"])
        assert t["crop"] == (0, 0, SCENES[i][0], SCENES[i][1])
    # relative coordinates survive a pure downscale; absolute ones need the answer to name its image
    want = "on" if convention == "qwen3-vl" else "by-image-marker"
    assert h["x-vlm-gateway-grounding"] == f"convention={convention}; mapping={want}"
    errs = errors(text, [0, 1, 2], convention)
    assert max(errs) <= TOL, (text, max(errs))


def test_several_images_answer_without_image_names_is_left_as_is(env):
    sims, gw = env
    text, h = ask(gw, MODELS["qwen2.5-vl"], [image_msg("Box every marker, no image headings.", [0, 1])], False)
    assert h["x-vlm-gateway-grounding"] == "convention=qwen2.5-vl; mapping=by-image-marker"
    # the engine's own numbers (its frame of each sent image), untouched
    expect = []
    for data in sent_images(sims["qwen2.5-vl"]):
        im = Image.open(io.BytesIO(data))
        kx, ky = model_frame(*im.size, "qwen2.5-vl")
        expect += [[round(v * k) for v, k in zip(box, (kx, ky, kx, ky))] for box in find_targets(im).values()]
    got = [v for _, _, _, v in parse(text, 1)]
    assert got == expect


@pytest.mark.parametrize("convention", list(MODELS))
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_across_turns(env, convention, stream):
    """Turn 2 sends turn 1's answer (client frame) back: the model must see it on the targets
    of the image it receives, and its new answer must land in the client's frame again."""
    sims, gw = env
    sim = sims[convention]
    first = [image_msg("Box every marker.", [0])]
    text1, _ = ask(gw, MODELS[convention], first, stream)
    assert max(errors(text1, [0], convention)) <= TOL
    turn2 = first + [{"role": "assistant", "content": text1},
                     {"role": "user", "content": "Point to every marker again."}]
    text2, h = ask(gw, MODELS[convention], turn2, stream)
    assert h["x-vlm-gateway-grounding"] == f"convention={convention}; mapping=on"
    assert max(errors(text2, [0], convention)) <= TOL
    # what the engine read in the history: turn 1's boxes in the frame of the (cropped) image it got
    body = sim.sim_requests()[-1]
    sent = Image.open(io.BytesIO(sent_images(sim)[0]))
    assert sent.size == (768, 448)
    kx, ky = model_frame(*sent.size, convention)
    truth = find_targets(sent)
    history = body["messages"][1]["content"]
    assert history != text1
    groups = parse(history, 1)
    assert len(groups) == len(SCENES[0][4])
    for _, label, _, v in groups:
        x0, y0, x1, y1 = truth[label]
        for i, (got, want) in enumerate(zip(v, (x0 * kx, y0 * ky, x1 * kx, y1 * ky))):
            extent = kx * sent.size[0] if i % 2 == 0 else ky * sent.size[1]
            assert abs(got - want) <= 0.01 * extent + 1, (history, truth)


# -- switches, unknown models, the response cache ------------------------------------------------

KEYS = {"on": "sk-grounding-on-test", "off": "sk-grounding-off-test"}


@pytest.fixture(scope="module")
def env2(module_servers):
    import hashlib
    sha = lambda k: hashlib.sha256(k.encode()).hexdigest()  # noqa: E731
    sims = {
        "qwen3vl-sim": module_servers.sim(grounding="qwen3-vl"),
        "qwen3vl-small": module_servers.sim(grounding="qwen3-vl", model="qwen3vl-small"),
        "llava-sim": module_servers.sim(grounding="qwen3-vl", model="llava-sim"),
        "custom-25": module_servers.sim(grounding="qwen2.5-vl", model="custom-25"),
    }
    backends = [{"url": s.base_url, "name": name, "engine": "sim", "models": [name],
                 **({"profile": "small"} if name == "qwen3vl-small" else {})} for name, s in sims.items()]
    # a second, uncapped backend for qwen3vl-small that never answers: the model's backends
    # differ in their image cap, so the 512 px cap is known only once a backend is chosen
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead = closed.getsockname()[1]
    backends.append({"url": f"http://127.0.0.1:{dead}/v1", "name": "small-uncapped-down", "engine": "vllm",
                     "models": ["qwen3vl-small"]})
    gw = module_servers.gateway({
        "backends": backends,
        "profiles": {"small": {"base": "l4", "image_max_long_side": 512}},
        "images": {"models": {"custom-25": {"coordinates": "qwen2.5-vl", "grid_factor": 28}}},
        "auth": {"tenants": [{"name": "on", "key_sha256": sha(KEYS["on"])},
                             {"name": "off", "key_sha256": sha(KEYS["off"]), "map_coordinates": False}]},
    })
    return sims, gw


def ask2(gw, model, messages, stream=False, key="on", headers=None, **kw):
    client = openai.OpenAI(base_url=gw.base_url, api_key=KEYS[key], max_retries=0)
    raw = client.chat.completions.with_raw_response.create(model=model, messages=messages, max_tokens=2000,
                                                           stream=stream, extra_headers=headers or {}, **kw)
    if not stream:
        return raw.parse().choices[0].message.content, raw.headers
    return "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices), raw.headers


def test_tenant_switch_turns_mapping_and_trimming_off(env2):
    sims, gw = env2
    text, h = ask2(gw, "qwen3vl-sim", [image_msg("Box every marker.", [0])], key="off")
    assert h["x-vlm-gateway-grounding"] == "convention=qwen3-vl; mapping=off; reason=tenant"
    assert size(sent_images(sims["qwen3vl-sim"])[0]) == (768, 448)
    assert parse_header(h["x-vlm-gateway-image-transform-1"])["crop"] == (0, 0, 1920, 1080)
    _, h = ask2(gw, "qwen3vl-sim", [image_msg("Box every marker.", [0])], key="on")
    assert h["x-vlm-gateway-grounding"] == "convention=qwen3-vl; mapping=on"


def test_unknown_model_is_never_cropped(env2):
    sims, gw = env2
    text, h = ask2(gw, "llava-sim", [image_msg("Box every marker.", [0])])
    assert h["x-vlm-gateway-grounding"] == "convention=none; mapping=off; reason=unknown-convention"
    assert size(sent_images(sims["llava-sim"])[0]) == (768, 448)
    assert parse_header(h["x-vlm-gateway-image-transform-1"])["crop"] == (0, 0, 1920, 1080)
    # this locator answers relative coordinates: after a pure downscale they still land
    assert max(errors(text, [0], "qwen3-vl")) <= TOL


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_configured_convention_for_a_model_name(env2, stream):
    """images.models.NAME.coordinates: a name auto-detection cannot place (grid 28 as well)."""
    sims, gw = env2
    text, h = ask2(gw, "custom-25", [image_msg("Point to every marker.", [0])], stream)
    assert h["x-vlm-gateway-grounding"] == "convention=qwen2.5-vl; mapping=on"
    t = parse_header(h["x-vlm-gateway-image-transform-1"])
    assert t["sent"] == (756, 448) and t["model"] == (756, 448)
    assert max(errors(text, [0], "qwen2.5-vl")) <= TOL


def test_cache_hit_is_in_the_frame_of_the_client_that_receives_it(env2):
    sims, gw = env2
    msgs = [image_msg("Box every marker. (cache)", [0])]
    text, h = ask2(gw, "qwen3vl-sim", msgs, stream=True, temperature=0)
    assert h["x-vlm-gateway-cache"] == "miss" and max(errors(text, [0], "qwen3-vl")) <= TOL
    n = len(sims["qwen3vl-sim"].sim_requests())
    hit, h = ask2(gw, "qwen3vl-sim", msgs, temperature=0)
    assert h["x-vlm-gateway-cache"] == "hit-exact" and hit == text
    assert len(sims["qwen3vl-sim"].sim_requests()) == n
    # a client that switched mapping off gets the engine's own frame, never the mapped entry
    off, h = ask2(gw, "qwen3vl-sim", msgs, temperature=0, headers={"x-vlm-gateway-grounding": "off"})
    assert h["x-vlm-gateway-cache"] == "miss" and off != text
    off2, h = ask2(gw, "qwen3vl-sim", msgs, stream=True, temperature=0, headers={"x-vlm-gateway-grounding": "off"})
    assert h["x-vlm-gateway-cache"] == "hit-exact" and off2 == off


def test_cache_does_not_store_an_answer_whose_frame_changed_after_the_lookup(env2):
    """The answering backend's profile caps images at 512 px, the model's other backend does
    not: with mapping off the answer is in that 512 px frame, not the 768 px one the key was
    built with, so it is not stored; mapped answers (client frame) are."""
    sims, gw = env2
    msgs = [image_msg("Box every marker. (cap)", [0])]
    for _ in range(2):
        _, h = ask2(gw, "qwen3vl-small", msgs, temperature=0, headers={"x-vlm-gateway-grounding": "off"})
        assert h["x-vlm-gateway-cache"] == "miss"
        assert size(sent_images(sims["qwen3vl-small"])[0]) == (512, 288)
    text, h = ask2(gw, "qwen3vl-small", msgs, temperature=0)
    assert h["x-vlm-gateway-cache"] == "miss" and max(errors(text, [0], "qwen3-vl")) <= TOL
    assert parse_header(h["x-vlm-gateway-image-transform-1"])["sent"] == (512, 288)
    again, h = ask2(gw, "qwen3vl-small", msgs, temperature=0)
    assert h["x-vlm-gateway-cache"] == "hit-exact" and again == text
