"""The simulator's API-server stage, as a client sees it over HTTP (vLLM 0.24's behaviour,
docs/benchmarks/gpu.md "Where the time goes inside vLLM 0.24"): a streaming answer's
headers leave only once the request's template and images are preprocessed, and while it
is there the scheduler's gauges do not count it; ``--api-servers N`` runs N API servers,
each with its own worker and processor cache, connections dealt to them in turn; a media
part's ``uuid`` is the item's identity in the processor and prefix caches."""

from __future__ import annotations

import asyncio
import base64
import subprocess
import sys
import threading
import time

import httpx
import pytest

from vlm_gateway.backends.sim.profiles import get_profile
from vlm_gateway.backends.sim.workload import make_jpeg
from waiting import wait_until

MODEL = "qwen3vl-sim"


def data_uri(w: int, h: int, seed: int) -> str:
    return "data:image/jpeg;base64," + base64.b64encode(make_jpeg(w, h, seed)).decode()


def body(uri: str | None = None, *, stream: bool = True, max_tokens: int = 2, uuid: str | None = None) -> dict:
    content: list[dict] = [{"type": "text", "text": "hi"}]
    if uri is not None:
        part = {"type": "image_url", "image_url": {"url": uri}}
        if uuid is not None:
            part["uuid"] = uuid
        content.insert(0, part)
    return {"model": MODEL, "stream": stream, "max_tokens": max_tokens, "ignore_eos": True,
            "messages": [{"role": "user", "content": content}]}


def metric(text: str, name: str) -> float:
    vals = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{")]
    assert vals, f"{name} not in the simulator's metrics"
    return sum(vals)


def test_stream_headers_leave_only_after_preprocessing(module_servers):
    """A 12 MP photo costs the h200 profile's API server ~0.7 s: the headers wait for it, the
    scheduler's gauges do not count it meanwhile, and a text request's headers come at once."""
    sim = module_servers.sim(profile="h200", echo=False)
    photo = data_uri(4032, 3024, 11)
    got: dict = {}

    def client() -> None:
        with httpx.stream("POST", sim.base_url + "/chat/completions", json=body(photo), timeout=60) as r:
            got["headers_at"] = time.monotonic()
            got["status"] = r.status_code
            got["text"] = r.read().decode()

    th = threading.Thread(target=client)
    th.start()
    wait_until(lambda: sim.sim_stats()["preprocessing"] == 1, "the request is in the API server")
    m = httpx.get(sim.url + "/metrics").text
    assert "headers_at" not in got                       # no headers while it is preprocessed
    assert metric(m, "vllm:num_requests_waiting") == 0   # vLLM's scheduler does not see it yet
    assert metric(m, "vllm:num_requests_running") == 0
    assert httpx.get(sim.url + "/load").json() == {"server_load": 1}   # its API server holds it
    wait_until(lambda: "headers_at" in got, "the stream's headers arrive", timeout=30)
    # the headers came when it left the API server: by then it was in the engine or done
    state = httpx.get(sim.url + "/sim/prompts").json()[-1]["state"]
    assert state in ("transfer", "waiting", "running", "done")
    th.join(30)
    assert got["status"] == 200 and "data: [DONE]" in got["text"]
    # vLLM's TTFT counts from the request's arrival, its time in the API server included
    m = httpx.get(sim.url + "/metrics").text
    p = get_profile("h200")
    api_s = p.cpu_base_s + 4032 * 3024 / 1e6 * (p.cpu_decode_s_per_mpx + p.cpu_preproc_s_per_mpx)
    assert metric(m, "vllm:time_to_first_token_seconds_sum") >= api_s
    assert metric(m, "vllm:request_queue_time_seconds_count") == 1
    assert metric(m, "vllm:request_prefill_time_seconds_sum") < api_s

    t0 = time.monotonic()
    with httpx.stream("POST", sim.base_url + "/chat/completions", json=body(), timeout=30) as r:
        text_headers_s = time.monotonic() - t0
        r.read()
    assert text_headers_s < api_s / 2                    # nothing to preprocess: headers at once


def test_client_leaving_during_preprocessing_aborts_there(module_servers):
    sim = module_servers.sim(profile="h200", echo=False)
    sim.sim_faults(reset=True)

    def client() -> None:
        try:
            httpx.post(sim.base_url + "/chat/completions", json=body(data_uri(4032, 3024, 12)), timeout=0.3)
        except httpx.ReadTimeout:
            pass

    th = threading.Thread(target=client)
    th.start()
    th.join(30)
    wait_until(lambda: sim.sim_stats()["aborted"] == 1, "the abandoned request is aborted")
    stats = sim.sim_stats()
    assert stats["preprocessing"] == 0 and stats["running"] == 0 and stats["finished"] == 0


async def _last_headers_s(base_url: str, uris: list[str], conc: int) -> float:
    """Seconds from the first send until the last stream's headers (the API servers'
    throughput): ``conc`` clients of one connection each, each sending its share in turn."""

    async def client(mine: list[str], t0: float) -> float:
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        last = 0.0
        async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=120) as c:
            for uri in mine:
                async with c.stream("POST", "/chat/completions", json=body(uri, max_tokens=1)) as r:
                    assert r.status_code == 200
                    last = time.monotonic() - t0
                    await r.aread()
        return last

    t0 = time.monotonic()
    return max(await asyncio.gather(*(client(uris[k::conc], t0) for k in range(conc))))


def test_two_api_servers_preprocess_twice_as_many_images(module_servers):
    """1080p images, the engine's share kept small (one output token): with two API servers
    the same load leaves the API stage in about half the time, half of it on each server."""
    uris = [data_uri(1920, 1080, 100 + i) for i in range(32)]
    # at a third of the speed, so that this machine's own per-request work stays small beside the model's
    one = module_servers.sim(profile="h200", echo=False, time_scale=3.0)
    two = module_servers.sim(profile="h200", echo=False, time_scale=3.0, extra_args=["--api-servers", "2"])
    assert httpx.get(two.url + "/sim/config").json()["api_servers"] == 2
    t1 = asyncio.run(_last_headers_s(one.base_url, uris[:16], 8))
    t2 = asyncio.run(_last_headers_s(two.base_url, uris[16:], 8))
    p = get_profile("h200")
    serial_s = 3.0 * 16 * (p.cpu_base_s + 1920 * 1080 / 1e6 * (p.cpu_decode_s_per_mpx + p.cpu_preproc_s_per_mpx))
    assert t1 >= 0.9 * serial_s                          # one server: one image after the other
    assert t1 / t2 >= 1.5, f"one API server {t1:.2f} s, two {t2:.2f} s"
    servers = [p["api_server"] for p in httpx.get(two.url + "/sim/prompts").json()]
    assert sorted(servers) == [0] * 8 + [1] * 8           # 8 connections dealt in turn, 2 requests each
    assert two.sim_stats()["api_servers"] == 2 and one.sim_stats()["api_servers"] == 1


def test_uuid_is_the_items_identity_in_both_caches(module_servers):
    """As in vLLM 0.24: a part's uuid, not its bytes, names the item, so a second image sent
    under the first one's uuid hits the processor cache and the prefix cache (the aliasing a
    gateway must never let a client choose), and the same bytes under no uuid miss."""
    sim = module_servers.sim(profile="fast", echo=False)
    a, b = data_uri(1920, 1080, 1), data_uri(1920, 1080, 2)
    with httpx.Client(base_url=sim.base_url, timeout=30) as c:
        def send(uri: str, uuid: str | None) -> dict:
            r = c.post("/chat/completions", json=body(uri, stream=False, uuid=uuid))
            assert r.status_code == 200, r.text
            return r.json()["usage"]

        def mm() -> tuple[float, float]:
            m = httpx.get(sim.url + "/metrics").text
            return metric(m, "vllm:mm_cache_queries_total"), metric(m, "vllm:mm_cache_hits_total")

        q0, h0 = mm()
        assert send(a, "screen-7")["prompt_tokens_details"]["cached_tokens"] == 0
        assert mm() == (q0 + 1, h0)
        aliased = send(b, "screen-7")                      # other pixels, same uuid
        assert mm() == (q0 + 2, h0 + 1)
        assert aliased["prompt_tokens_details"]["cached_tokens"] >= 2032
        assert send(a, None)["prompt_tokens_details"]["cached_tokens"] == 0   # identity: its bytes
        assert mm() == (q0 + 3, h0 + 1)
        send(a, None)
        assert mm() == (q0 + 4, h0 + 2)
    images = [p["images"][0] for p in httpx.get(sim.url + "/sim/prompts").json()[-4:]]
    assert [i.get("uuid") for i in images] == ["screen-7", "screen-7", None, None]
    assert images[0]["sha256"] != images[1]["sha256"] and images[0]["sha256"] == images[2]["sha256"]


def test_each_api_server_has_its_own_processor_cache(module_servers):
    sim = module_servers.sim(profile="fast", echo=False, extra_args=["--api-servers", "2"])
    uri = data_uri(768, 448, 5)

    def hits() -> float:
        return metric(httpx.get(sim.url + "/metrics").text, "vllm:mm_cache_hits_total")

    with httpx.Client(base_url=sim.base_url, timeout=30) as first, \
            httpx.Client(base_url=sim.base_url, timeout=30) as second:
        h0 = hits()
        first.post("/chat/completions", json=body(uri, stream=False))
        second.post("/chat/completions", json=body(uri, stream=False))    # the other server: a miss
        assert hits() == h0
        first.post("/chat/completions", json=body(uri, stream=False))     # its own cache: a hit
        assert hits() == h0 + 1
    servers = [p["api_server"] for p in httpx.get(sim.url + "/sim/prompts").json()[-3:]]
    assert servers[0] == servers[2] != servers[1]


@pytest.mark.parametrize("value", ["0", "-2"])
def test_api_servers_below_one_is_refused_before_listening(value):
    r = subprocess.run([sys.executable, "-m", "vlm_gateway", "sim", "--port", "1", "--api-servers", value],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith("vlm-gateway sim:") and "api_servers" in r.stderr
