"""Fuzzing over real HTTP: request bodies generated from the gateway's own
``/openapi.json`` schemas (mutated and unconstrained too), raw junk bytes, and
hostile image payloads through the full path (parse -> limits -> image stage).
The gateway must answer every one with a non-5xx status in time, in OpenAI's
error shape when it refuses, and stay alive with no internal error logged."""

from __future__ import annotations

import base64
import functools
import io
import struct
import zlib

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from conftest import SIM_MODEL

SETTINGS = settings(max_examples=120, deadline=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def gw(module_servers):
    sim = module_servers.sim()
    g = module_servers.gateway({"limits": {"max_tokens_cap": 32}, "cache": {"mode": "always"},
                                "images": {"url_mode": "fetch", "fetch_timeout_s": 1.0}},
                               backends=[sim])
    yield g
    assert g.proc.poll() is None, "the gateway died during fuzzing"
    log = g.output()
    assert "Traceback" not in log and "unexpected error" not in log, log[-4000:]


@pytest.fixture(scope="module")
def http(gw):
    with httpx.Client(base_url=gw.url, timeout=15) as c:
        yield c


@pytest.fixture(scope="module")
def spec(http):
    return http.get("/openapi.json").json()


def check(r: httpx.Response) -> None:
    assert r.status_code < 500, (r.status_code, r.text[:500])
    if r.status_code >= 400:
        err = r.json()["error"]
        assert isinstance(err["message"], str) and isinstance(err["type"], str)


# -- a small JSON-schema -> hypothesis translation (the subset openapi.py uses) ----------

def _resolve(spec: dict, s: dict) -> dict:
    while "$ref" in s:
        node = spec
        for part in s["$ref"].lstrip("#/").split("/"):
            node = node[part]
        s = node
    return s


json_scalars = st.none() | st.booleans() | st.integers(-2**63, 2**63) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40)
any_json = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4) |
                        st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=12)


def from_schema(spec: dict, s: dict, depth: int = 0) -> st.SearchStrategy:
    s = _resolve(spec, s)
    if depth > 6:
        return json_scalars
    if "const" in s:
        return st.just(s["const"])
    if "enum" in s:
        return st.sampled_from(s["enum"])
    if "oneOf" in s:
        return st.one_of([from_schema(spec, x, depth + 1) for x in s["oneOf"]])
    t = s.get("type")
    if isinstance(t, list):
        return st.one_of([from_schema(spec, {**s, "type": x}, depth) for x in t])
    if t == "string":
        return st.text(min_size=s.get("minLength", 0), max_size=60)
    if t == "integer":
        return st.integers(min_value=s.get("minimum", -2**40), max_value=2**40)
    if t == "number":
        return st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6)
    if t == "boolean":
        return st.booleans()
    if t == "null":
        return st.none()
    if t == "array":
        items = from_schema(spec, s.get("items", {}), depth + 1) if "items" in s else any_json
        return st.lists(items, min_size=s.get("minItems", 0), max_size=4)
    if t == "object":
        props = s.get("properties", {})
        req = [k for k in s.get("required", []) if k in props]
        opt = {k: from_schema(spec, v, depth + 1) for k, v in props.items() if k not in req}
        return st.fixed_dictionaries({k: from_schema(spec, props[k], depth + 1) for k in req}, optional=opt)
    return any_json


def mutated(base: st.SearchStrategy) -> st.SearchStrategy:
    """Valid-shaped bodies with one field replaced by anything (wrong types, nulls, huge numbers)."""
    def mutate(pair):
        body, (key, value) = pair
        if isinstance(body, dict) and body:
            k = key if key in body else sorted(body)[0]
            body = {**body, k: value}
        return body
    return st.tuples(base, st.tuples(st.text(max_size=12), any_json)).map(mutate)


def test_openapi_describes_the_api(spec):
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models"} <= set(spec["paths"])


@pytest.mark.parametrize("path,schema", [("/v1/chat/completions", "ChatCompletionRequest"),
                                         ("/v1/completions", "CompletionRequest")])
def test_schema_generated_bodies(http, spec, path, schema):
    s = spec["components"]["schemas"][schema]
    # the model field is mostly the served one, so requests get past the model check
    s = {**s, "properties": {**s["properties"], "model": {"oneOf": [{"const": SIM_MODEL}, {"type": "string"}]}}}
    strategy = from_schema(spec, s)

    @SETTINGS
    @given(strategy | mutated(strategy))
    def run(body):
        check(http.post(path, json=body))
    run()


@SETTINGS
@given(any_json)
def test_arbitrary_json(http, body):
    check(http.post("/v1/chat/completions", json=body))


@SETTINGS
@given(st.binary(max_size=300), st.sampled_from(["application/json", "text/plain", "", "multipart/form-data"]))
def test_raw_bytes(http, raw, ctype):
    check(http.post("/v1/chat/completions", content=raw, headers={"content-type": ctype} if ctype else {}))


def test_other_methods_and_paths(http, spec):
    for path in spec["paths"]:
        for method in ("GET", "POST", "PUT", "DELETE", "PATCH"):
            r = http.request(method, path.replace("{name}", "x"), content=b"{}")
            assert r.status_code < 500 or (path == "/ready" and r.status_code == 503), (method, path, r.status_code)


# -- hostile images through the full HTTP path ------------------------------------------

def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_header_only(w: int, h: int) -> bytes:
    """A PNG that claims w x h pixels (a decompression bomb's header) with almost no data."""
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 64)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat) + _png_chunk(b"IEND", b"")


def bomb_png() -> bytes:
    """A real 12000 x 12000 all-zero PNG: small on the wire, 432 MB decoded."""
    row = b"\x00" + b"\x00" * (12000 * 3)
    comp = zlib.compressobj(9)
    data = b"".join(comp.compress(row) for _ in range(12000)) + comp.flush()
    ihdr = struct.pack(">IIBBBBB", 12000, 12000, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", data) + _png_chunk(b"IEND", b"")


def _img(fmt: str, size=(64, 64), mode="RGB", **kw) -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, 128).save(buf, fmt, **kw)
    return buf.getvalue()


def _uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


@functools.lru_cache(maxsize=1)
def hostile_corpus() -> dict[str, str | dict]:
    good = _img("PNG")
    gif = io.BytesIO()
    frames = [Image.new("P", (256, 256), i) for i in range(200)]
    frames[0].save(gif, "GIF", save_all=True, append_images=frames[1:])
    return {
        "bomb_header": _uri(png_header_only(100_000, 100_000)),
        "bomb_real": _uri(bomb_png()),
        "zero_size_header": _uri(png_header_only(0, 0)),
        "truncated_png": _uri(good[: len(good) // 2]),
        "garbage_bytes": _uri(b"\x00\xff" * 500),
        "empty_payload": "data:image/png;base64,",
        "bad_base64": "data:image/png;base64,!!!not*base64***",
        "bad_padding": "data:image/png;base64," + base64.b64encode(good).decode()[:-3],
        "no_comma": "data:image/png;base64" + base64.b64encode(good).decode(),
        "svg_script": _uri(b'<svg xmlns="http://www.w3.org/2000/svg" onload="alert(1)"><script>1</script></svg>',
                           "image/svg+xml"),
        "wrong_mime": _uri(good, "image/jpeg"),
        "text_mime": _uri(good, "text/html"),
        "many_frame_gif": _uri(gif.getvalue(), "image/gif"),
        "one_by_one": _uri(_img("PNG", (1, 1))),
        "extreme_aspect": _uri(_img("PNG", (20000, 1))),
        "cmyk_jpeg": _uri(_img("JPEG", (64, 64), "CMYK"), "image/jpeg"),
        "sixteen_bit": _uri(_img("PNG", (64, 64), "I;16")),
        "gray_alpha": _uri(_img("PNG", (64, 64), "LA")),
        "tiff": _uri(_img("TIFF"), "image/tiff"),
        "file_url": "file:///etc/passwd",
        "private_ip": "http://127.0.0.1:1/x.png",
        "metadata_ip": "http://169.254.169.254/latest/meta-data/",
        "ipv6_loopback": "http://[::1]:1/a.png",
        "gopher": "gopher://127.0.0.1:6379/_FLUSHALL",
        "javascript": "javascript:alert(1)",
        "huge_url": "https://example.invalid/" + "a" * 100_000,
        "unicode_host": "http://ex\u0430mple.invalid/a.png",
        "non_string_detail": {"url": _uri(good), "detail": "ultra"},
    }


@pytest.mark.parametrize("name", sorted(hostile_corpus()))
def test_hostile_images(http, name):
    iu = hostile_corpus()[name]
    part = {"type": "image_url", "image_url": iu if isinstance(iu, dict) else {"url": iu}}
    for stream in (False, True):
        body = {"model": SIM_MODEL, "stream": stream, "max_tokens": 2,
                "messages": [{"role": "user", "content": [{"type": "text", "text": "what is this"}, part]}]}
        r = http.post("/v1/chat/completions", json=body)
        check(r)
        if name in ("file_url", "private_ip", "metadata_ip", "ipv6_loopback", "gopher", "javascript", "bomb_header",
                    "bomb_real", "garbage_bytes", "bad_base64", "empty_payload"):
            assert r.status_code in (400, 413, 415, 422), (name, r.status_code, r.text[:300])
