"""The simulator as a client sees it: OpenAI API shape, token accounting from
real image headers (data URIs and http URLs), prefix-cache hits, queueing at
max_num_seqs, cancellation, vLLM's metric names and trtllm-serve's load formats, fault
modes, profiles."""

from __future__ import annotations

import base64
import http.server
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from vlm_gateway.backends.sim.profiles import get_profile, profile_names
from vlm_gateway.backends.sim.workload import make_jpeg
from waiting import wait_until

MODEL = "qwen3vl-sim"


def image_message(url: str, text: str = "hi") -> list[dict]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": text}]}]


def data_uri(w: int, h: int, seed: int) -> str:
    return "data:image/jpeg;base64," + base64.b64encode(make_jpeg(w, h, seed)).decode()


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    found, total = False, 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            found, total = True, total + float(line.rsplit(" ", 1)[1])
    assert found, f"{name} {labels} not in metrics"
    return total


@pytest.fixture(scope="module")
def fast_sim(module_servers):
    return module_servers.sim(profile="fast", echo=True)


@pytest.fixture(scope="module")
def client(fast_sim):
    return openai.OpenAI(base_url=fast_sim.base_url, api_key="sim", max_retries=0)


@pytest.fixture(scope="module")
def image_server():
    """A loopback HTTP server with one 1920x1080 JPEG at /screen.jpg."""
    body = make_jpeg(1920, 1080, 777)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path != "/screen.jpg":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "image/jpeg")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_usage_counts_real_visual_tokens_and_prefix_hits(fast_sim, client):
    uri = data_uri(1920, 1080, 1)
    r1 = client.chat.completions.create(model=MODEL, messages=image_message(uri), max_tokens=8)
    assert r1.usage.prompt_tokens == 2055                  # 13 text + 2040 visual + 2 markers, as vLLM
    assert r1.usage.completion_tokens == 8
    assert r1.usage.prompt_tokens_details.cached_tokens == 0
    r2 = client.chat.completions.create(model=MODEL, messages=image_message(uri, "hi again"), max_tokens=8)
    assert r2.usage.prompt_tokens_details.cached_tokens == 2032   # full blocks before the text
    r3 = client.chat.completions.create(model=MODEL, messages=image_message(data_uri(1920, 1080, 2)),
                                        max_tokens=8)
    assert r3.usage.prompt_tokens_details.cached_tokens == 0      # same size, other image
    text = httpx.get(fast_sim.url + "/metrics").text
    assert metric(text, "vllm:prefix_cache_hits_total") >= 2032
    assert metric(text, "vllm:prefix_cache_queries_total") >= 3 * 2055
    prompts = httpx.get(fast_sim.url + "/sim/prompts").json()
    assert prompts[-1]["images"][0] | {"sha256": ""} == {"width": 1920, "height": 1080, "tokens": 2042, "sha256": ""}


def test_http_image_url_is_fetched_and_measured(client, image_server):
    r = client.chat.completions.create(model=MODEL, messages=image_message(image_server + "/screen.jpg"),
                                       max_tokens=4)
    assert r.usage.prompt_tokens == 2055
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=image_message(image_server + "/missing.jpg"),
                                       max_tokens=4)


def test_bad_image_and_context_length_are_400(client):
    bad = "data:image/png;base64," + base64.b64encode(b"definitely not a png").decode()
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=image_message(bad), max_tokens=4)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x" * 200_000}],
                                       max_tokens=4)
    assert "maximum context length" in str(e.value)


def test_stream_echo_usage_and_completions(client):
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "marker-17 hello"}],
                                            max_tokens=6, stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True})
    text, usage, finish = "", None, None
    for ch in stream:
        if ch.choices:
            text += ch.choices[0].delta.content or ""
            finish = ch.choices[0].finish_reason or finish
        if ch.usage:
            usage = ch.usage
    assert text.startswith("marker-17 hello ")
    assert len(text.split()) == 6 and finish == "length"
    assert usage.completion_tokens == 6 and usage.prompt_tokens == 7 + 5 + 4
    comp = client.completions.create(model=MODEL, prompt="abcdefgh", max_tokens=3)
    assert comp.usage.prompt_tokens == 2 and len(comp.choices[0].text.split()) == 3
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_max_num_seqs_queues_and_cancel_frees_the_slot(module_servers):
    # rtx4060ti: one sequence at a time; 0.5x real time, ~14 ms a token
    sim = module_servers.sim(profile="rtx4060ti", echo=False, time_scale=0.5)
    c = openai.OpenAI(base_url=sim.base_url, api_key="sim", max_retries=0)
    long_stream = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=2000, stream=True)
    it = iter(long_stream)
    next(it), next(it)                                    # streaming: it holds the only slot
    done = []
    t = threading.Thread(target=lambda: done.append(
        c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4)))
    t.start()
    deadline = time.time() + 5
    while time.time() < deadline:
        m = httpx.get(sim.url + "/metrics").text
        if metric(m, "vllm:num_requests_waiting") == 1:
            break
        time.sleep(0.02)
    assert metric(m, "vllm:num_requests_running") == 1
    assert metric(m, "vllm:num_requests_waiting") == 1
    long_stream.close()                                   # the client goes away
    t.join(10)
    assert done and done[0].usage.completion_tokens == 4  # the waiting request got the slot
    stats = sim.sim_stats()
    assert stats["aborted"] == 1 and stats["finished"] == 1 and stats["running"] == 0
    m = httpx.get(sim.url + "/metrics").text
    assert metric(m, "vllm:request_success_total", finished_reason="abort") == 1
    assert metric(m, "vllm:request_success_total", finished_reason="length") == 1


def test_metric_names_vllm(fast_sim):
    vllm = httpx.get(fast_sim.url + "/metrics").text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
                 "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_bucket",
                 "vllm:e2e_request_latency_seconds_count"):
        assert f'{name}{{engine="0",model_name="{MODEL}"' in vllm, name
    assert httpx.get(fast_sim.url + "/prometheus/metrics").status_code == 404


def _families(text: str) -> dict[str, tuple[str, set]]:
    from prometheus_client.parser import text_string_to_metric_families
    return {f.name: (f.type, {tuple(sorted(s.labels)) for s in f.samples})
            for f in text_string_to_metric_families(text)}


FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("release", ["1.2", "1.3"])
def test_trtllm_mode_serves_trtllm_serves_formats(module_servers, release):
    """Every family, type and label key of the fixture built from that release's
    MetricsCollector (tests/fixtures/README.md); the simulator has no GPU, so no memory gauge."""
    trt = module_servers.sim(profile="fast", engine="trtllm", extra_args=["--trtllm-release", release])
    # before any request both endpoints answer at once: [] and request series at zero
    t0 = time.monotonic()
    assert httpx.get(trt.url + "/metrics").json() == []
    assert time.monotonic() - t0 < 1.0
    openai.OpenAI(base_url=trt.base_url, api_key="x").chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    text = httpx.get(trt.url + "/prometheus/metrics").text
    assert "vllm:" not in text
    want = _families((FIXTURES / f"trtllm-{release}-prometheus.txt").read_text())
    want.pop("trtllm_gpu_memory_usage_bytes", None)
    assert _families(text) == want
    labels = {"model_name": "undefined"} if release == "1.2" else {"model_name": MODEL}
    assert metric(text, "trtllm_time_to_first_token_seconds_count", **labels) == 1
    assert metric(text, "trtllm_request_success_total", finished_reason="length") == 1
    if release == "1.3":   # the collector logged the request's last step when it completed
        assert metric(text, "trtllm_num_requests_running") == 1
        assert metric(text, "trtllm_prompt_tokens_total") > 0
    # /metrics: JSON iteration statistics, answered 2 s after the last iteration, then drained
    t0 = time.monotonic()
    r = httpx.get(trt.url + "/metrics", timeout=10)
    assert time.monotonic() - t0 >= 1.9 and r.headers["content-type"] == "application/json"
    stats = r.json()
    assert stats and stats[-1]["numCompletedRequests"] == 1 and stats[-1]["numActiveRequests"] == 1
    assert httpx.get(trt.url + "/metrics").json() == []


def test_trtllm_iteration_statistics_wait_while_the_engine_is_busy(module_servers):
    """trtllm-serve's /metrics keeps collecting while iterations keep coming: a read started
    during a request returns only after the engine has been idle for 2 s."""
    trt = module_servers.sim(profile="fast", engine="trtllm", token_rate=20)
    c = openai.OpenAI(base_url=trt.base_url, api_key="x")
    c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "warm"}], max_tokens=1)
    httpx.get(trt.url + "/metrics", timeout=10)          # drain the warm-up
    done = {}

    def run():
        c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "long"}], max_tokens=40)
        done["t"] = time.monotonic()

    th = threading.Thread(target=run)
    th.start()
    wait_until(lambda: trt.sim_stats()["running"] == 1, "the long request is running in the engine")
    stats = httpx.get(trt.url + "/metrics", timeout=15).json()
    end = time.monotonic()
    th.join()
    assert end - done["t"] >= 1.9                         # answered 2 s after the last step
    assert len(stats) >= 30                               # one entry per decode step of the request
    assert stats[-1]["numCompletedRequests"] == 1


def test_faults(fast_sim, client):
    fast_sim.sim_faults(fail_next=2, fail_status=503)
    for _ in range(2):
        with pytest.raises(openai.InternalServerError) as e:
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert e.value.status_code == 503
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)

    fast_sim.sim_faults(malformed_next=1)
    r = httpx.post(fast_sim.base_url + "/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    with pytest.raises(ValueError):
        r.json()

    fast_sim.sim_faults(die_mid_stream=1)
    with pytest.raises((openai.APIError, httpx.HTTPError)):
        for _ in client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=20, stream=True):
            pass

    fast_sim.sim_faults(stall_next=1, stall_s=0.3)
    t = time.perf_counter()
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert time.perf_counter() - t >= 0.3

    fast_sim.sim_faults(refuse_connections=0.6)

    def refused() -> bool:
        try:
            httpx.get(fast_sim.url + "/health", timeout=1)
        except httpx.ConnectError:
            return True
        return False
    wait_until(refused, "the simulator refuses connections", timeout=0.6)
    deadline = time.time() + 5
    while time.time() < deadline:
        try:
            if httpx.get(fast_sim.url + "/health", timeout=1).status_code == 200:
                break
        except httpx.ConnectError:
            time.sleep(0.05)
    assert httpx.get(fast_sim.url + "/health").status_code == 200


def test_profiles():
    names = profile_names()
    for n in ("h200-qwen3vl-2b", "h200", "rtx4090d", "rtx3090", "a10g", "rtx4060ti", "fast"):
        assert n in names
    with pytest.raises(KeyError):
        get_profile("no-such-gpu")
    cal, alias, latest = get_profile("h200-qwen3vl-2b"), get_profile("h200"), get_profile("h200-vllm024-2026-11-30")
    assert alias.step_base_s == latest.step_base_s and alias.mm_cache_tokens == latest.mm_cache_tokens
    assert [get_profile(n).max_num_seqs for n in ("rtx4090d", "rtx3090", "a10g", "rtx4060ti")] == [4, 2, 3, 1]
    slow = get_profile("rtx3090")
    assert slow.prefill_s_per_ktok == pytest.approx(cal.prefill_s_per_ktok / 0.2)
    assert slow.cpu_preproc_s_per_mpx == cal.cpu_preproc_s_per_mpx      # same host CPU model
    assert get_profile("fast", time_scale=0.5, decode_tokens_per_s=20).step_base_s == pytest.approx(0.05)
    assert get_profile("fast", max_num_seqs=3).max_num_seqs == 3


def test_non_streaming_client_disconnect_aborts(module_servers):
    sim = module_servers.sim(profile="rtx4060ti", echo=False, time_scale=0.5)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(sim.base_url + "/chat/completions", timeout=0.3, json={
            "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2000})
    deadline = time.time() + 5
    while time.time() < deadline and sim.sim_stats()["aborted"] == 0:
        time.sleep(0.05)
    stats = sim.sim_stats()
    assert stats["aborted"] == 1 and stats["running"] == 0


def test_vllm_metric_names_and_labels_exist_in_a_real_vllm_scrape(fast_sim):
    """Every series the simulator writes in vLLM mode is one a real vLLM 0.24 writes,
    with the same label names."""
    import os
    import re

    def series(text: str) -> set[tuple[str, tuple[str, ...]]]:
        out = set()
        for line in text.splitlines():
            m = re.match(r"^([a-zA-Z_:][\w:]*)\{([^}]*)\}", line)
            if m:
                labels = tuple(sorted(k for k in re.findall(r'(\w+)="', m.group(2)) if k != "le"))
                out.add((m.group(1), labels))
        return out

    real_path = os.path.join(os.path.dirname(__file__), "fixtures", "vllm-0.24-metrics.txt")
    real = series(open(real_path).read())
    ours = series(httpx.get(fast_sim.url + "/metrics").text)
    assert ours and ours <= real, sorted(ours - real)
