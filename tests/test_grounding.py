"""Grounding in process: conventions, frames and maps, finding and rewriting coordinate
groups (whole and streamed, split anywhere), the SSE transform, the plan's trim gate,
the rewrite's view of the source, L1 round trips and the config keys."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from vlm_gateway.backends.sim.grounding import desktop
from vlm_gateway import ConfigError, load_config
from vlm_gateway.stages.auth import TENANT
from vlm_gateway.stages.grounding import plan as P
from vlm_gateway.stages.grounding.conventions import BUILTIN, detect, resolve
from vlm_gateway.stages.grounding.frames import Frame, image_map, parse_header
from vlm_gateway.stages.grounding.response import ResponseTransform, StreamTransform
from vlm_gateway.stages.grounding.text import MAX_HOLD, Attribution, Mapper, forward
from vlm_gateway.stages.images.l1 import pack, unpack
from vlm_gateway.stages.images.policy import Policy
from vlm_gateway.stages.images.rewrite import rewrite_bytes
from vlm_gateway.stages.images.source import Source
from vlm_gateway.core.errors import BadRequest
from vlm_gateway.core.request import ChatRequest, ImagePart
from vlm_gateway.proxy.sse import StreamWatcher

Q3, Q25 = BUILTIN["qwen3-vl"], BUILTIN["qwen2.5-vl"]
WINDOW = Frame(1920, 1080, 260, 140, 1660, 940, 768, 448)  # a 1400x800 window, downscaled


# -- conventions ------------------------------------------------------------------------------

@pytest.mark.parametrize("name,conv", [
    ("Qwen/Qwen3-VL-2B-Instruct", "qwen3-vl"), ("qwen3vl-sim", "qwen3-vl"), ("Qwen3-VL-235B-A22B-Thinking", "qwen3-vl"),
    ("Qwen/Qwen2.5-VL-7B-Instruct", "qwen2.5-vl"), ("qwen2_5_vl", "qwen2.5-vl"), ("Qwen2-VL-7B-Instruct", "qwen2-vl"),
    ("llava-1.5", "none"), ("gpt-4o", "none"), ("qwen3-8b", "none"),
])
def test_convention_from_model_name(name, conv):
    assert detect(name).name == conv


def test_configured_convention_and_processor_bounds():
    assert resolve("auto", "my-finetune").name == "none"
    c = resolve("qwen2.5-vl", "my-finetune", 0, 1003520)
    assert (c.name, c.relative, c.factor, c.min_pixels, c.max_pixels) == ("qwen2.5-vl", 0, 28, 3136, 1003520)
    assert resolve("qwen3-vl", "x", 0, 1003520) is Q3  # bounds do not matter for relative coordinates


# -- frames and maps --------------------------------------------------------------------------------

def test_transform_header_round_trip():
    v = WINDOW.header("messages[0].content[1]", Q25)
    assert v == ("part=messages[0].content[1]; client=1920x1080; crop=260,140,1660,940; sent=768x448; "
                 "scale=1.822917,1.785714; model=756x448; answer=1932x1092")
    t = parse_header(v)
    assert t["client"] == (1920, 1080) and t["crop"] == (260, 140, 1660, 940) and t["sent"] == (768, 448)
    assert t["model"] == (756, 448) and t["answer"] == (1932, 1092) and abs(t["scale"][0] - 1400 / 768) < 1e-6
    assert "model=" not in WINDOW.header("p", Q3)
    assert parse_header("part=messages[0].content[0]; unknown")["unknown"]


def test_maps_relative_and_absolute():
    m = image_map(WINDOW, Q3)
    # the crop's (0, 0) and (1000, 1000) are the window's corners, relative to the screenshot
    assert m.back(0, 0) == pytest.approx((260 / 1920 * 1000, 140 / 1080 * 1000))
    assert m.back(1000, 1000) == pytest.approx((1660 / 1920 * 1000, 940 / 1080 * 1000))
    # pixels of the processor's 756x448 frame of the crop -> pixels of its 1932x1092 frame of the
    # screenshot (what the model would have answered for the screenshot itself)
    a = image_map(WINDOW, Q25)
    kx, ky = 1932 / 1920, 1092 / 1080
    assert a.back(0, 0) == pytest.approx((260 * kx, 140 * ky))
    assert a.back(756, 448) == pytest.approx((1660 * kx, 940 * ky))
    for mp in (m, a):
        assert mp.forward(*mp.back(123, 321)) == pytest.approx((123, 321))
    # a point of the client's frame outside the crop clamps to the model's frame
    assert a.forward(0, 0) == (0, 0) and a.forward(1932, 1092) == pytest.approx((756, 448))
    # relative coordinates of an uncropped, downscaled image need no map; absolute ones do; an
    # image sent as it is needs none in either
    full = Frame(1920, 1080, 0, 0, 1920, 1080, 768, 448)
    assert image_map(full, Q3).identity and not image_map(full, Q25).identity
    assert image_map(Frame.identity(1000, 700), Q25).identity
    assert image_map(None, Q3).identity and image_map(None, Q25) is None
    assert image_map(WINDOW, BUILTIN["none"]) is None


# -- coordinate groups ------------------------------------------------------------------------------

M3 = image_map(WINDOW, Q3)
SAMPLE = ('Found them:\n```json\n[\n  {"bbox_2d": [100, 200, 300, 400], "label": "save \\"button\\""},\n'
          "  {'point_2d': [500.5, 7]},\n  {\"bbox_2d\": [ 0 ,0,1000 , 1000 ]}\n]\n```\n"
          "<|object_ref_start|>a dog<|object_ref_end|><|box_start|>(10,20),(30,40)<|box_end|> "
          "<|quad_start|>(1,2),(3,4),(5,6),(7,8)<|quad_end|> "
          '<points x1="100" y1="50" x2="900" y2="950" alt="two">two</points>\n'
          'Not groups: "bbox_2d" alone, bbox_2d: [1, 2, 3, 4], [10, 20, 30, 40], (5,5),(6,6).')


def mapped(x: float, y: float) -> tuple[int, int]:
    bx, by = M3.back(x, y)
    return int(bx + 0.5), int(by + 0.5)


def test_every_format_is_mapped_and_the_rest_kept_byte_for_byte():
    m = Mapper(Attribution(M3, [M3]))
    out = m.text(SAMPLE)
    assert m.counts.mapped == 6 and m.counts.unattributed == 0
    x1, y1 = mapped(100, 200)
    x2, y2 = mapped(300, 400)
    assert f'{{"bbox_2d": [{x1}, {y1}, {x2}, {y2}], "label": "save \\"button\\""}}' in out
    px, py = M3.back(500.5, 7)
    assert f"{{'point_2d': [{px:.1f}, {int(py + 0.5)}]}}" in out  # decimals kept
    assert '{"bbox_2d": [ %d ,%d,%d , %d ]}' % (*mapped(0, 0), *mapped(1000, 1000)) in out
    assert "<|box_start|>(%d,%d),(%d,%d)<|box_end|>" % (*mapped(10, 20), *mapped(30, 40)) in out
    assert "<|quad_start|>(%d,%d),(%d,%d),(%d,%d),(%d,%d)<|quad_end|>" % (
        *mapped(1, 2), *mapped(3, 4), *mapped(5, 6), *mapped(7, 8)) in out
    assert '<points x1="%d" y1="%d" x2="%d" y2="%d" alt="two">' % (*mapped(100, 50), *mapped(900, 950)) in out
    # everything that is not a group's number is untouched
    tail = SAMPLE[SAMPLE.index("Not groups"):]
    assert out.endswith(tail) and out.startswith("Found them:\n```json\n[\n  {\"bbox_2d\": [")


def test_absolute_convention_maps_to_the_frame_of_the_clients_image():
    a = image_map(WINDOW, Q25)
    out = Mapper(Attribution(a, [a])).text('{"bbox_2d": [0, 0, 756, 448]}')
    assert out == '{"bbox_2d": [262, 142, 1670, 950]}'  # the window in the 1932x1092 frame
    assert Mapper(Attribution(a, [a]), forward).text(out) == '{"bbox_2d": [0, 0, 756, 448]}'


def stream_through(m: Mapper, text: str, cuts: list[int]) -> str:
    out, prev = [], 0
    for c in sorted(set(cuts)) + [len(text)]:
        out.append(m.feed(text[prev:c]))
        prev = c
    return "".join(out) + m.flush()


def test_stream_equals_whole_text_at_every_split():
    whole = Mapper(Attribution(M3, [M3])).text(SAMPLE)
    for step in range(1, 12):
        assert stream_through(Mapper(Attribution(M3, [M3])), SAMPLE, list(range(0, len(SAMPLE), step))) == whole


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, len(SAMPLE)), max_size=40))
def test_stream_equals_whole_text_for_any_cuts(cuts):
    whole = Mapper(Attribution(M3, [M3])).text(SAMPLE)
    assert stream_through(Mapper(Attribution(M3, [M3])), SAMPLE, cuts) == whole


def test_stream_holds_back_at_most_one_group():
    m = Mapper(Attribution(M3, [M3]))
    assert m.feed("Plain prose, with 'quotes' and <b>tags</b> and numbers 1, 2, 3.") .endswith("3.")
    assert m.pending == ""
    # a group in the making is held from its first character, and only it
    assert m.feed('Here: {"bbox_2d": [12, 3') == "Here: {"
    assert m.pending == '"bbox_2d": [12, 3'
    assert m.feed("4, 5") == "" and m.feed(", 6]") == '"bbox_2d": [%d, %d, %d, %d]' % (*mapped(12, 34), *mapped(5, 6))
    # a lone quote could begin a key: held until the next character says otherwise
    assert m.feed('He said "') == "He said " and m.feed("hi") == '"hi'
    # a tail that stopped being a group is released at once; nothing waits beyond MAX_HOLD
    assert m.feed("<|box_start|>(1,2") == "" and m.feed(" oops") == "<|box_start|>(1,2 oops"
    long = '<points alt="' + "x" * (MAX_HOLD + 10)
    assert m.feed(long) == long


def test_markers_pick_the_image_when_images_differ():
    a, b = image_map(Frame(1920, 1080, 0, 0, 1920, 1080, 768, 448), Q25), image_map(
        Frame(1000, 800, 0, 0, 1000, 800, 768, 616), Q25)
    attr = Attribution(None, [a, b])
    text = ('Image 2:\n{"bbox_2d": [10, 10, 20, 20]}\nThe image 1920 pixels wide.\n'
            'Image 1:\n{"point_2d": [100, 100]}\n图2 {"point_2d": [100, 100]} 第1张 {"point_2d": [100, 100]}')
    m = Mapper(attr)
    whole = m.text(text)
    assert m.counts.mapped == 4
    bx = b.back(10, 10)
    assert f'[{int(bx[0] + .5)}, {int(bx[1] + .5)}' in whole.split("\n")[1]
    for step in (1, 2, 3, 5, 8):
        assert stream_through(Mapper(attr), text, list(range(0, len(text), step))) == whole
    # no marker before a group: it is left as the model wrote it
    m = Mapper(attr)
    assert m.text('{"bbox_2d": [1, 2, 3, 4]} Image 7: {"point_2d": [5, 6]}') == \
        '{"bbox_2d": [1, 2, 3, 4]} Image 7: {"point_2d": [5, 6]}'
    assert m.counts.unattributed == 2


def test_a_marker_split_across_deltas_still_counts():
    a, b = image_map(Frame(1920, 1080, 0, 0, 1920, 1080, 768, 448), Q25), image_map(
        Frame(1000, 800, 0, 0, 1000, 800, 768, 616), Q25)
    text = 'Image 1' + '2 is not an image. Image 2: {"point_2d": [10, 10]}'
    for cut in range(len(text)):
        out = stream_through(Mapper(Attribution(None, [a, b])), text, [cut])
        want = b.back(10, 10)
        assert out.endswith('[%d, %d]}' % (int(want[0] + .5), int(want[1] + .5))), (cut, out)


# -- SSE and completions ----------------------------------------------------------------------------

def chunk(content, finish=None, index=0, **extra) -> bytes:
    delta = {} if content is None else {"content": content}
    return b"data: " + orjson.dumps({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                                      "choices": [{"index": index, "delta": delta, "logprobs": None,
                                                   "finish_reason": finish}], **extra}) + b"\n\n"


def sse_text(data: bytes) -> dict[int, str]:
    out: dict[int, str] = {}
    for ev in data.split(b"\n\n"):
        for line in ev.split(b"\n"):
            if line.startswith(b"data: {"):
                for c in orjson.loads(line[6:]).get("choices", []):
                    out[c["index"]] = out.get(c["index"], "") + ((c.get("delta") or {}).get("content") or "")
    return out


def make_mapper():
    return Mapper(Attribution(M3, [M3]))


def relayed(tf: StreamTransform, upstream: bytes, size: int) -> bytes:
    """``upstream`` in reads of ``size`` bytes, framed into whole events as the relay frames them
    (proxy/sse.py), through ``tf``."""
    w = StreamWatcher(assemble=False)
    out = [tf.feed_sync(ev) for i in range(0, len(upstream), size) if (ev := w.frame(upstream[i:i + size]))]
    if rest := w.rest():
        out.append(tf.feed_sync(rest + b"\n\n"))
    return b"".join(out) + tf.close_sync()


def test_sse_transform_split_anywhere():
    pieces = [SAMPLE[i:i + 3] for i in range(0, len(SAMPLE), 3)]
    upstream = (b": keepalive\n\n" + chunk("", None) + b"".join(chunk(p) for p in pieces) + chunk(None, "stop") +
                b'data: {"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":3}}\n\n'
                b"data: [DONE]\n\n")
    want = make_mapper().text(SAMPLE)
    for size in (1, 7, 64, len(upstream)):
        out = relayed(StreamTransform(make_mapper), upstream, size)
        assert sse_text(out) == {0: want}
        assert out.startswith(b": keepalive\n\n") and out.endswith(b"data: [DONE]\n\n")
        assert b'"usage":{"prompt_tokens":3}' in out


def test_sse_unchanged_events_keep_their_bytes_and_errors_pass():
    up = chunk("hello ") + chunk("world") + b'data: {"error": {"message": "boom"}}\n\ndata: {not json\n\n'
    tf = StreamTransform(make_mapper)
    assert tf.feed_sync(up) == up


def test_sse_held_text_released_without_finish_and_per_choice():
    tf = StreamTransform(make_mapper)
    up = chunk('A {"point_2d": [0, 0', index=0) + chunk('B {"point_2d": [1000, 1000', index=1) + \
        chunk("]}", index=1) + b"data: [DONE]\n\n"
    out = tf.feed_sync(up) + tf.close_sync()
    got = sse_text(out)
    assert got[1] == 'B {"point_2d": [%d, %d]}' % mapped(1000, 1000)
    assert got[0] == 'A {"point_2d": [0, 0'  # never completed: released as is, before [DONE]
    assert out.endswith(b"data: [DONE]\n\n")


def test_sse_crlf_and_trailing_event_without_blank_line():
    up = chunk('{"point_2d": [0, 0]}').replace(b"\n\n", b"\r\n\r\n") + chunk(None, "stop")[:-2]
    out = relayed(StreamTransform(make_mapper), up, len(up))
    assert sse_text(out) == {0: '{"point_2d": [%d, %d]}' % mapped(0, 0)}


def test_completion_transform():
    c = {"choices": [{"index": 0, "message": {"role": "assistant", "content": SAMPLE}},
                     {"index": 1, "message": {"role": "assistant", "content": None, "tool_calls": []}}]}
    assert ResponseTransform(make_mapper).completion_sync(c)
    assert c["choices"][0]["message"]["content"] == make_mapper().text(SAMPLE)
    assert not ResponseTransform(make_mapper).completion_sync({"choices": [{"message": {"content": "no groups"}}]})


# -- the plan ------------------------------------------------------------------------------------------

def request(model="qwen3vl-sim", n=1, headers=None, tenant=None) -> ChatRequest:
    parts = [{"type": "image_url", "image_url": {"url": "data:x"}} for _ in range(n)]
    req = ChatRequest(body={"model": model, "messages": [{"role": "user", "content": parts}]}, route="chat",
                      model=model, stream=False, headers=headers or {}, request_id="t",
                      images=[ImagePart(0, i, p) for i, p in enumerate(parts)])
    if tenant is not None:
        req.state[TENANT] = tenant
    return req


def src(h: str) -> Source:
    return Source("data", "data:x", h, None, 1)


def test_trim_only_when_mapping_is_possible():
    cfg = load_config(None, environ={}).images
    pol = Policy()
    trims = lambda req, hashes, pols=None: [p.trim_borders for p in P.gate_trim(  # noqa: E731
        cfg, req, [src(h) for h in hashes], pols or [pol] * len(hashes))]
    assert trims(request(), ["a"]) == [True]
    assert trims(request(n=2), ["a", "a"]) == [True, True]  # the same image twice
    assert trims(request(n=2), ["a", "b"]) == [False, False]
    assert trims(request(n=2), ["a", "a"], [pol, Policy(max_long_side=448)]) == [False, False]
    assert trims(request(model="llava"), ["a"]) == [False]
    assert trims(request(headers={"x-vlm-gateway-grounding": "off"}), ["a"]) == [False]
    assert trims(request(headers={"x-vlm-gateway-grounding": " ON "}), ["a"]) == [True]
    from vlm_gateway.config import TenantConfig
    assert trims(request(tenant=TenantConfig(name="t", map_coordinates=False)), ["a"]) == [False]
    off = load_config(None, environ={}, overrides={"images": {"models": {"qwen3vl-sim": {"map_coordinates": False}}}})
    assert [p.trim_borders for p in P.gate_trim(off.images, request(), [src("a")], [pol])] == [False]
    req = request()
    assert P.plan_for(cfg, req).mapping and P.plan_for(cfg, req) is req.grounding
    with pytest.raises(BadRequest) as e:
        P.plan_for(cfg, request(headers={"x-vlm-gateway-grounding": "sometimes"}))
    assert e.value.param == "x-vlm-gateway-grounding"


# -- the rewrite's view, L1 --------------------------------------------------------------------------

def test_view_of_a_trimmed_screenshot_and_l1_round_trip():
    png = desktop(1920, 1080, (260, 140, 1660, 940), {"magenta": (400, 220, 520, 280)})
    r = rewrite_bytes(png)
    assert r.trimmed and r.view == (1920, 1080, 260, 140, 1660, 940) and (r.width, r.height) == (768, 448)
    back = unpack(pack(r))
    assert back.view == r.view and back.data == r.data
    # an entry written before views were kept is a miss, not a wrong frame
    meta = orjson.dumps([r.mime, r.width, r.height, r.source_width, r.source_height, r.source_bytes,
                         r.tokens_before, r.tokens_after, r.trimmed])
    with pytest.raises(ValueError):
        unpack(len(meta).to_bytes(4, "big") + meta + r.data)


def test_view_of_a_rotated_and_dct_scaled_jpeg():
    """A phone photo: stored landscape with EXIF orientation 6, shown (and sent) portrait,
    decoded with DCT scaling; the crop box is in pixels of the upright image."""
    upright = Image.new("RGB", (2001, 3001), (255, 255, 255))
    upright.paste((20, 20, 20), (500, 700, 1500, 2000))
    exif = Image.Exif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    upright.transpose(Image.Transpose.ROTATE_90).save(buf, "JPEG", quality=92, exif=exif)
    r = rewrite_bytes(buf.getvalue())
    assert (r.source_width, r.source_height) == (3001, 2001) and r.width < r.height
    assert r.view[:2] == (2001, 3001)
    assert all(abs(a - b) <= 3 for a, b in zip(r.view[2:], (500, 700, 1500, 2000))), r.view
    r = rewrite_bytes(buf.getvalue(), Policy(trim_borders=False))
    assert r.view == (2001, 3001, 0, 0, 2001, 3001)


# -- config --------------------------------------------------------------------------------------------

def test_config_keys_validated_and_cli_exits_2(tmp_path):
    with pytest.raises(ConfigError, match=r"images.models.m.coordinates: expected one of"):
        load_config(None, environ={}, overrides={"images": {"models": {"m": {"coordinates": "qwen4"}}}})
    with pytest.raises(ConfigError, match=r"images.models.m.processor_max_pixels"):
        load_config(None, environ={}, overrides={"images": {"models": {"m": {"processor_max_pixels": "big"}}}})
    with pytest.raises(ConfigError, match=r"images.coordinates"):
        load_config(None, environ={}, overrides={"images": {"coordinates": "relative"}})
    bad = tmp_path / "bad.yaml"
    bad.write_text("images:\n  models:\n    m:\n      map_coordinates: sometimes\n")
    r = subprocess.run([sys.executable, "-m", "vlm_gateway", "serve", "--config", str(bad)], capture_output=True,
                       text=True, timeout=30, env=dict(os.environ))
    assert r.returncode == 2 and "images.models.m.map_coordinates" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_sse_fast_path_passes_reads_without_a_possible_group_unparsed():
    prose = [chunk(w) for w in ("The ", "window ", "shows ", "a ", "toolbar")]
    group = [chunk(p) for p in ('Save is at ', '{"point_2d": [500, ', "500]}")]
    upstream = b"".join(prose + group) + chunk(None, "stop") + b"data: [DONE]\n\n"
    want = "The window shows a toolbar" + 'Save is at {"point_2d": [%d, %d]}' % mapped(500, 500)
    for size in (1, 3, 17, 50, 200):
        out = relayed(StreamTransform(make_mapper), upstream, size)
        assert sse_text(out) == {0: want}, size
    tf = StreamTransform(make_mapper)
    events = prose[0] + prose[1]
    assert tf.feed_sync(events) is events  # nothing that could start a group: passed unparsed


def test_history_maps_into_the_sent_frame_by_marker_and_is_restored_on_retry():
    from vlm_gateway.stages.grounding.stage import history
    a, b = image_map(WINDOW, Q25), image_map(Frame(1000, 800, 0, 0, 1000, 800, 768, 616), Q25)
    parts = [{"type": "image_url", "image_url": {"url": "data:x"}} for _ in range(2)]
    said = 'Image 2: {"point_2d": [500, 400]} Image 1: {"point_2d": [1000, 600]}'
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "find"}, *parts]},
                         {"role": "assistant", "content": said},
                         {"role": "user", "content": [{"type": "text", "text": "and now?"}]}]}
    req = ChatRequest(body=body, route="chat", model="qwen2.5-vl", stream=False, headers={}, request_id="t",
                      images=[ImagePart(0, 1, parts[0]), ImagePart(0, 2, parts[1])])
    plan = P.GroundingPlan(Q25, mapping=True, maps=[a, b])
    req.grounding = plan
    history(req, plan)
    fb, fa = b.forward(500, 400), a.forward(1000, 600)
    want = 'Image 2: {"point_2d": [%d, %d]} Image 1: {"point_2d": [%d, %d]}' % (
        int(fb[0] + .5), int(fb[1] + .5), int(fa[0] + .5), int(fa[1] + .5))
    assert body["messages"][1]["content"] == want and plan.history.mapped == 2
    history(req, plan)  # a retry starts again from the client's text
    assert body["messages"][1]["content"] == want and plan.originals == [(1, -1, said)]
    plan.mapping = False
    history(req, plan)
    assert body["messages"][1]["content"] == said


def test_state_of_absolute_coordinates_for_images_never_seen():
    plan = P.GroundingPlan(Q25, mapping=True, frames=[None], maps=[image_map(None, Q25)])
    assert plan.state == "convention=qwen2.5-vl; mapping=off; reason=unknown-image-size"
    assert not plan.needs_transform and plan.key() == "sent:url"
    plan = P.GroundingPlan(Q3, mapping=True, frames=[None], maps=[image_map(None, Q3)])
    assert plan.state == "convention=qwen3-vl; mapping=on" and plan.key() == "client"


# -- finding by literal = the regex tried everywhere ---------------------------------------------------

_PIECES = ['{"bbox_2d": [1, 2, 3, 4]}', "'point_2d': [5, 6]", '"bbox_2d": [1, 2', "<|box_start|>(1,2),(3,4)<|box_end|>",
           "<|quad_start|>(1,2),(3,4),(5,6),(7,8)<|quad_end|>", '<points x1="1" y1="2" alt="a">', '<points alt="',
           "Image 2:", "image#3", "Picture no. 1", "图2", "第 1 张", "screenshot 12", "İmage 1", "myimage 1", '"', "'",
           "<", " ", "x", "9" * 40, "bbox_2d", "point_2d", "<|box_start|>", "<points", "IMG 4.5", "photo 7."]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=30))
def test_groups_and_markers_found_by_their_literals_are_the_regex_matches(pieces):
    from vlm_gateway.stages.grounding.text import GROUP, MARKER, markers, groups
    s = "".join(pieces)
    assert [m.span() for m in groups(s)] == [m.span() for m in GROUP.finditer(s)]
    assert [m.span() for m in markers(s)] == [m.span() for m in MARKER.finditer(s)]


def test_numbers_outside_the_frame_or_too_long_leave_their_group_as_written():
    m = Mapper(Attribution(M3, [M3]))
    odd = ['{"bbox_2d": [%s, 10, 20, 30]}' % ("9" * 400), '{"bbox_2d": [-1, 10, 20, 30]}',
           '{"point_2d": [1000.5, 3]}', '{"point_2d": [0.%s, 3]}' % ("1" * 40), "<|box_start|>(1,2),(3,-4)<|box_end|>"]
    text = " ".join(odd) + ' {"point_2d": [1000, 0]}'
    assert m.text(text) == " ".join(odd) + ' {"point_2d": [%d, %d]}' % mapped(1000, 0)
    assert (m.counts.mapped, m.counts.unmappable) == (1, len(odd))
    # the other way (the conversation, client frame -> model frame) alike
    f = Mapper(Attribution(M3, [M3]), forward)
    assert f.text('{"point_2d": [1001, 5]}') == '{"point_2d": [1001, 5]}' and f.counts.unmappable == 1


def test_the_groups_limit_maps_the_first_and_keeps_the_rest_whole_or_streamed():
    from vlm_gateway.stages.grounding.text import Counts
    text = " ".join('{"point_2d": [%d, 10]}' % i for i in range(10))
    want = " ".join(('{"point_2d": [%d, %d]}' % mapped(i, 10)) if i < 4 else '{"point_2d": [%d, 10]}' % i
                    for i in range(10))
    whole = Mapper(Attribution(M3, [M3]), counts=Counts(limit=4))
    assert whole.text(text) == want and whole.counts.over and whole.counts.mapped == 4
    for step in (1, 5, 13):
        m = Mapper(Attribution(M3, [M3]), counts=Counts(limit=4))
        assert stream_through(m, text, list(range(0, len(text), step))) == want and m.counts.over
