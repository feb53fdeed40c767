"""Work that grows with the input is bounded and stays off the event loop (class 2 of #32),
and the answers the mapper cannot map leak nothing (class 3), in real processes: a gateway in
front of a backend that answers as the test says (tests/hostile.py), the screenshot trimmed
to its window so that every coordinate is really mapped.

While each hostile case runs, ``/health`` is asked back to back; every answer must come within
``HEALTH_BOUND_S`` (0.5 s: generous on a shared machine, while work held on the loop stalls it
for seconds; the speed itself is measured in docs/benchmarks/hardening.md)."""

from __future__ import annotations

import base64
import concurrent.futures
import re
import time

import httpx
import orjson
import pytest
from aiohttp import web

from vlm_gateway.backends.sim.grounding import desktop
from vlm_gateway.stages.grounding.conventions import BUILTIN
from vlm_gateway.stages.grounding.frames import Frame, image_map, parse_header
from vlm_gateway.stages.grounding.response import LIMIT_COMMENT
from vlm_gateway.stages.grounding.text import Attribution, Mapper, forward

from conftest import SIM_MODEL
from hostile import HostileBackend

HEALTH_BOUND_S = 0.5
LIMIT = 100_000  # images.max_coordinate_groups here: large enough that mapping up to it is real work
MiB = 1024 * 1024
WINDOW = (260, 140, 1660, 940)
URI = "data:image/png;base64," + base64.b64encode(
    desktop(1920, 1080, WINDOW, {"magenta": (400, 220, 520, 280)})).decode()


def group(i: int) -> str:
    return '{"bbox_2d": [%d, %d, %d, %d], "label": "icon"}' % (i % 900, i % 700 + 1, i % 900 + 50, i % 700 + 60)


SEP = " ; "


def groups(n: int) -> str:
    return SEP.join(group(i) for i in range(n))


def chunk(content: str) -> bytes:
    return b"data: " + orjson.dumps({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": SIM_MODEL,
                                     "choices": [{"index": 0, "delta": {"content": content},
                                                  "finish_reason": None}]}) + b"\n\n"


def completion(text: str) -> dict:
    return {"id": "c", "object": "chat.completion", "created": 1, "model": SIM_MODEL,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


class Engine:
    """Answers by the last user text: ``answer N`` (N groups), ``stream N`` (N groups in events of
    20), ``huge`` (a 400-digit number), ``odd index``, ``flood`` (one event that never ends);
    anything else: ``ok``. Keeps the last request it got."""

    def __init__(self) -> None:
        self.last: dict = {}
        self.written = 0

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self.last = body
        ask = body["messages"][-1]["content"]
        ask = ask if isinstance(ask, str) else ask[0]["text"]
        stream = body.get("stream")
        if ask.startswith("huge"):
            text = '{"bbox_2d": [%s, 10, 20, 30]} and %s' % ("9" * 400, group(1))
        elif m := re.match(r"(answer|stream) (\d+)", ask):
            text = groups(int(m.group(2)))
        else:
            text = "ok"
        if not stream:
            return web.json_response(completion(text))
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        if ask == "flood":
            await resp.write(chunk("first ") + b'data: {"choices": [{"index": 0, "delta": {"content": "')
            try:
                for _ in range(800):  # 200 MB, never a blank line
                    await resp.write(b'\\"bbox_2d\\": [1, 2, 3, 4] ' * 9362)
                    self.written += 9362 * 27
            except (ConnectionError, RuntimeError):
                pass
            return resp
        if ask == "odd index":
            await resp.write(b"data: " + orjson.dumps({"id": "c", "choices": [{"index": [1], "delta": {
                "content": group(2)}}]}) + b"\n\n")
        pieces = text.split(SEP)
        for i in range(0, len(pieces), 20):
            await resp.write(chunk(SEP.join(pieces[i:i + 20]) + (SEP if i + 20 < len(pieces) else "")))
        await resp.write(b"data: " + orjson.dumps({"id": "c", "choices": [{"index": 0, "delta": {},
                                                                            "finish_reason": "stop"}]}) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp


@pytest.fixture(scope="module")
def env(module_servers):
    engine = Engine()
    backend = HostileBackend(engine).start()
    gw = module_servers.gateway({
        "backends": [{"url": backend.base_url, "name": "b0", "models": [SIM_MODEL], "profile": "one"}],
        # one slot, and a context long enough for the long conversations
        "profiles": {"one": {"base": "h200", "max_num_seqs": 1, "max_model_len": 10_000_000}},
        "routing": {"queue_timeout_s": 0.2},  # one slot: a leaked one refuses the next request
        "cache": {"enabled": False}, "images": {"max_coordinate_groups": LIMIT}})
    yield gw, engine
    backend.stop()


def ask(gw, text: str, stream: bool = False, history: str | None = None) -> httpx.Response:
    messages = [{"role": "user", "content": [{"type": "text", "text": "Box every icon."},
                                             {"type": "image_url", "image_url": {"url": URI}}]}]
    if history is not None:
        messages += [{"role": "assistant", "content": history}]
    messages += [{"role": "user", "content": text}]
    body = {"model": SIM_MODEL, "messages": messages, "max_tokens": 100, "stream": stream}
    return httpx.post(gw.base_url + "/chat/completions", content=orjson.dumps(body),
                      headers={"content-type": "application/json"}, timeout=120)


def while_probing(gw, fn):
    """``fn()`` in a thread while ``/health`` is asked back to back: (its result, the probes' latencies)."""
    lat = []
    with httpx.Client(timeout=30) as c, concurrent.futures.ThreadPoolExecutor(1) as pool:
        assert c.get(gw.url + "/health").status_code == 200  # the connection is open before timing
        fut = pool.submit(fn)
        while not fut.done():
            t0 = time.perf_counter()
            r = c.get(gw.url + "/health")
            lat.append(time.perf_counter() - t0)
            assert r.status_code == 200
        return fut.result(), lat


def assert_loop_free(gw, lat: list[float]) -> None:
    assert len(lat) >= 5, lat  # the probes overlapped the work
    assert max(lat) < HEALTH_BOUND_S, f"/health took {max(lat):.3f} s (p50 {sorted(lat)[len(lat) // 2]:.4f} s)"
    assert inflight_zero(gw)  # and the backend's one slot is free again


def the_map(headers):
    t = parse_header(headers["x-vlm-gateway-image-transform-1"])
    assert t["crop"] == WINDOW  # trimmed: no identity map
    return image_map(Frame(*t["client"], *t["crop"], *t["sent"]), BUILTIN["qwen3-vl"])


def mapped(m, i: int) -> str:
    return Mapper(Attribution(m, [m])).text(group(i))


def inflight_zero(gw) -> bool:
    """The backend's slots are all free (no sample yet: none was ever taken)."""
    m = re.search(r'^vlm_gateway_backend_inflight\{backend="b0"\} (\S+)$', httpx.get(gw.url + "/metrics").text, re.M)
    return m is None or float(m.group(1)) == 0


def test_a_conversation_with_more_groups_than_the_limit_is_refused_without_holding_the_loop(env):
    gw, _ = env
    history = groups(450_000)  # ~23 MB of boxes beside one image
    r, lat = while_probing(gw, lambda: ask(gw, "again", history=history))
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert err["code"] == "too_many_coordinate_groups" and err["param"] == "messages"
    assert "images.max_coordinate_groups" in err["message"] and "x-vlm-gateway-grounding: off" in err["message"]
    assert_loop_free(gw, lat)


def test_a_long_conversation_is_mapped_off_the_loop(env):
    gw, engine = env
    history = groups(60_000)
    r, lat = while_probing(gw, lambda: ask(gw, "again", history=history))
    assert r.status_code == 200, r.text[:300]
    assert_loop_free(gw, lat)
    m = the_map(r.headers)
    sent = engine.last["messages"][1]["content"].split(SEP)
    assert len(sent) == 60_000
    assert sent[0] == Mapper(Attribution(m, [m]), forward).text(group(0))  # into the frame the model sees
    assert sent[-1] == Mapper(Attribution(m, [m]), forward).text(group(59_999))


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_long_answer_is_mapped_off_the_loop(env, stream):
    gw, _ = env
    r, lat = while_probing(gw, lambda: ask(gw, "answer 60000" if not stream else "stream 60000", stream))
    assert r.status_code == 200
    assert_loop_free(gw, lat)
    assert r.headers["x-vlm-gateway-grounding"] == "convention=qwen3-vl; mapping=on"
    m = the_map(r.headers)
    text = r.json()["choices"][0]["message"]["content"] if not stream else "".join(
        (orjson.loads(e[6:])["choices"] or [{}])[0].get("delta", {}).get("content") or ""
        for e in r.content.split(b"\n\n") if e.startswith(b"data: {"))
    got = text.split(SEP)
    assert len(got) == 60_000 and got[0] == mapped(m, 0) and got[-1] == mapped(m, 59_999)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_an_answer_past_the_limit_keeps_the_rest_as_written_and_says_so(env, stream):
    gw, _ = env
    n = LIMIT + 50_000
    r, lat = while_probing(gw, lambda: ask(gw, f"answer {n}" if not stream else f"stream {n}", stream))
    assert r.status_code == 200
    assert_loop_free(gw, lat)
    m = the_map(r.headers)
    if stream:
        assert LIMIT_COMMENT in r.content and r.content.endswith(b"data: [DONE]\n\n")
        text = "".join((orjson.loads(e[6:])["choices"] or [{}])[0].get("delta", {}).get("content") or ""
                       for e in r.content.split(b"\n\n") if e.startswith(b"data: {"))
    else:
        assert r.headers["x-vlm-gateway-grounding"] == "convention=qwen3-vl; mapping=partial; reason=too-many-groups"
        text = r.json()["choices"][0]["message"]["content"]
    got = text.split(SEP)
    assert len(got) == n
    assert got[LIMIT - 1] == mapped(m, LIMIT - 1)  # the first LIMIT groups mapped
    assert got[LIMIT] == group(LIMIT) and got[-1] == group(n - 1)  # the rest as the model wrote them


def test_an_endless_event_is_cut_at_the_cap_before_the_mapping_reads_it(env):
    gw, engine = env
    engine.written = 0
    r, lat = while_probing(gw, lambda: ask(gw, "flood", stream=True))
    assert r.status_code == 200
    assert_loop_free(gw, lat)
    events = [e for e in r.content.split(b"\n\n") if e]
    assert orjson.loads(events[-2][6:])["error"]["code"] == "upstream_event_too_large"
    assert events[-1] == b"data: [DONE]" and b"bbox_2d" not in r.content  # no byte of the event went out
    assert engine.written < 64 * MiB  # read up to the cap (1 MiB), not to its end


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_unmappable_answers_leave_the_slot_free(env, stream):
    gw, _ = env
    for _ in range(4):  # one slot, no queue to speak of: a leak refuses the next one with 429
        r = ask(gw, "huge", stream)
        assert r.status_code == 200, r.text[:300]
        body = r.text
        assert "9" * 400 in body  # as the model wrote it
        if stream:
            assert body.endswith("data: [DONE]\n\n") and '"error"' not in body
        r = ask(gw, "odd index", stream)
        assert r.status_code == 200
        if stream:
            assert '"index":[1]' in r.text and r.text.endswith("data: [DONE]\n\n") and '"error"' not in r.text
    assert inflight_zero(gw)
    r = ask(gw, "answer 3")
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"].split(SEP)[2] == \
        mapped(the_map(r.headers), 2)

