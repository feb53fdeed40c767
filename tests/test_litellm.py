"""LiteLLM with the gateway: (a) the litellm SDK as a client of the gateway;
(b) our image stage inside LiteLLM as a callback, in-process with the Router and
in a real LiteLLM proxy process. The simulator records what reached the engine."""

from __future__ import annotations

import base64
import io
import os
import subprocess
import sys

import httpx
import pytest
import yaml
from PIL import Image

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # else importing litellm goes online
os.environ.setdefault("LITELLM_TELEMETRY", "False")

litellm = pytest.importorskip("litellm", reason="pip install 'vlm-gateway[litellm]'")
# litellm's own pydantic models warn at import/first use; not ours to fix
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
from conftest import SIM_MODEL, free_port, wait_http  # noqa: E402
from images import photo_jpeg  # noqa: E402

from vlm_gateway.integrations.litellm_hook import ImageRewriteHook  # noqa: E402


def uri(data: bytes) -> str:
    return "data:image/jpeg;base64," + base64.b64encode(data).decode()


def messages(text: str, image_uri: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": text},
                                         {"type": "image_url", "image_url": {"url": image_uri}}]}]


def received_size(sim) -> tuple[int, int]:
    body = sim.sim_requests()[-1]
    urls = [p["image_url"]["url"] for m in body["messages"] if isinstance(m.get("content"), list)
            for p in m["content"] if p.get("type") == "image_url"]
    assert len(urls) == 1
    return Image.open(io.BytesIO(base64.b64decode(urls[0].split(",", 1)[1]))).size


@pytest.fixture(scope="module")
def stack(module_servers):
    sim = module_servers.sim()
    gw = module_servers.gateway({}, backends=[sim])
    return sim, gw


@pytest.fixture
def callbacks():
    saved = list(litellm.callbacks)
    yield litellm.callbacks
    litellm.callbacks[:] = saved


# -- (a) litellm as a client of the gateway -------------------------------------------------

def test_sdk_completion_through_gateway(stack):
    sim, gw = stack
    r = litellm.completion(model=f"openai/{SIM_MODEL}", api_base=gw.base_url, api_key="unused",
                           messages=messages("litellm sdk marker", uri(photo_jpeg(640, 480))), max_tokens=12,
                           temperature=0)
    assert r.choices[0].message.content.startswith("litellm sdk marker")
    assert r.usage.completion_tokens == 12 and r.usage.prompt_tokens > 300


def test_sdk_streaming_through_gateway(stack):
    sim, gw = stack
    stream = litellm.completion(model=f"openai/{SIM_MODEL}", api_base=gw.base_url, api_key="unused",
                                messages=messages("litellm stream marker", uri(photo_jpeg(800, 600))),
                                max_tokens=12, stream=True)
    pieces = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
    assert len(pieces) >= 4
    assert "".join(pieces).startswith("litellm stream marker")


async def test_sdk_async_through_gateway(stack):
    sim, gw = stack
    r = await litellm.acompletion(model=f"openai/{SIM_MODEL}", api_base=gw.base_url, api_key="unused",
                                  messages=messages("litellm async marker", uri(photo_jpeg(320, 240))), max_tokens=8)
    assert r.choices[0].message.content.startswith("litellm async marker")


# -- (b) our image stage inside LiteLLM ------------------------------------------------------

def router_for(sim):
    return litellm.Router(model_list=[{"model_name": "vlm", "litellm_params": {
        "model": f"openai/{SIM_MODEL}", "api_base": sim.base_url, "api_key": "unused"}}], num_retries=0)


async def test_router_hook_rewrites_large_image_before_engine(stack, callbacks):
    sim, _ = stack
    hook = ImageRewriteHook({"images": {"max_long_side": 768}})
    callbacks.append(hook)
    src = photo_jpeg(4032, 3024)
    r = await router_for(sim).acompletion(model="vlm", messages=messages("router marker", uri(src)),
                                          max_tokens=8)
    assert r.choices[0].message.content.startswith("router marker")
    w, h = received_size(sim)
    assert (w, h) == (768, 576)  # 4032x3024 at a 768 budget on the 32 px grid
    assert hook.stats["rewritten"] == 1
    assert hook.stats["tokens_before"] == 11844 and hook.stats["tokens_after"] == 432
    assert hook.stats["bytes_after"] < len(src)
    # the engine counted the rewritten image's tokens, not the original's
    assert r.usage.prompt_tokens < 1000

    # same image again: served from the hook's cache, same bytes sent (engine prefix cache hits)
    first = sim.sim_requests()[-1]["messages"][0]["content"][1]["image_url"]["url"]
    await router_for(sim).acompletion(model="vlm", messages=messages("again", uri(src)), max_tokens=4)
    assert hook.stats["cache_hits"] == 1
    assert sim.sim_requests()[-1]["messages"][0]["content"][1]["image_url"]["url"] == first


async def test_router_hook_detail_low_and_small_images_pass(stack, callbacks):
    sim, _ = stack
    hook = ImageRewriteHook({"images": {"max_long_side": 768, "detail_low_long_side": 448}})
    callbacks.append(hook)
    msgs = messages("low detail", uri(photo_jpeg(1920, 1080)))
    msgs[0]["content"][1]["image_url"]["detail"] = "low"
    await router_for(sim).acompletion(model="vlm", messages=msgs, max_tokens=4)
    assert max(received_size(sim)) <= 448
    small = uri(photo_jpeg(320, 240))
    await router_for(sim).acompletion(model="vlm", messages=messages("small", small), max_tokens=4)
    assert sim.sim_requests()[-1]["messages"][0]["content"][1]["image_url"]["url"] == small  # untouched


async def test_router_hook_refuses_broken_image(stack, callbacks):
    sim, _ = stack
    callbacks.append(ImageRewriteHook())
    before = len(sim.sim_requests())
    with pytest.raises(litellm.BadRequestError):
        await router_for(sim).acompletion(model="vlm", max_tokens=4, messages=messages(
            "broken", "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\nnot really").decode()))
    assert len(sim.sim_requests()) == before  # nothing reached the engine


@pytest.mark.slow  # the LiteLLM proxy takes 10-30 s to start on a 2-core box
def test_litellm_proxy_with_hook(stack, tmp_path):
    """A real LiteLLM proxy process configured with our callback."""
    pytest.importorskip("fastapi", reason="pip install 'litellm[proxy]'")
    openai = pytest.importorskip("openai")
    sim, _ = stack
    gw_cfg = tmp_path / "gateway.yaml"
    gw_cfg.write_text(yaml.safe_dump({"images": {"max_long_side": 512}}))
    cfg = tmp_path / "litellm.yaml"
    cfg.write_text(yaml.safe_dump({
        "model_list": [{"model_name": "vlm", "litellm_params": {
            "model": f"openai/{SIM_MODEL}", "api_base": sim.base_url, "api_key": "unused"}}],
        "litellm_settings": {"callbacks": "vlm_gateway.integrations.litellm_hook.proxy_handler_instance"},
    }))
    port = free_port()
    log = tmp_path / "litellm.log"
    env = {**os.environ, "LITELLM_MASTER_KEY": "sk-test-master", "VLM_GATEWAY_CONFIG": str(gw_cfg),
           "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False"}
    env.pop("DATABASE_URL", None)
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "litellm.proxy.proxy_cli", "--config", str(cfg),
                                 "--host", "127.0.0.1", "--port", str(port)],
                                stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/health/liveliness", proc, timeout=90, log=str(log))
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-test-master", max_retries=0)
        r = client.chat.completions.create(model="vlm", max_tokens=6,
                                           messages=messages("proxy marker", uri(photo_jpeg(1920, 1080))))
        assert r.choices[0].message.content.startswith("proxy marker")
        assert received_size(sim) == (512, 288)
        bad = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=30,
                         headers={"authorization": "Bearer sk-test-master"},
                         json={"model": "vlm", "messages": messages("x", "data:image/png;base64,AAAA")})
        assert bad.status_code == 400, bad.text
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_core_never_imports_litellm():
    code = ("import sys; import vlm_gateway.cli, vlm_gateway.proxy.app, vlm_gateway.stages.chain, "
            "vlm_gateway.integrations; "
            "from vlm_gateway.proxy.app import create_app; create_app(); "
            "assert not [m for m in sys.modules if m.startswith('litellm')], 'litellm imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
