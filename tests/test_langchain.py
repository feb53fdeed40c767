"""LangChain's ChatOpenAI pointed at the gateway: image messages, invoke and stream.

A real gateway process in front of a simulator (echo mode: the reply starts with the
last user text, so the answer proves which request arrived)."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from conftest import SIM_MODEL
from images import data_uri, photo_jpeg

langchain_openai = pytest.importorskip("langchain_openai", reason="pip install langchain-openai")
from langchain_core.messages import HumanMessage  # noqa: E402


def photo_uri(width: int, height: int) -> str:
    return data_uri(photo_jpeg(width, height), "image/jpeg")


@pytest.fixture(scope="module")
def stack(module_servers):
    sim = module_servers.sim()
    gw = module_servers.gateway({}, backends=[sim])
    return sim, gw


def chat(gw, **kw):
    return langchain_openai.ChatOpenAI(base_url=gw.base_url, api_key="unused", model=SIM_MODEL,
                                       max_tokens=16, temperature=0, max_retries=0, **kw)


def image_message(text: str, uri: str) -> HumanMessage:
    return HumanMessage(content=[{"type": "text", "text": text},
                                 {"type": "image_url", "image_url": {"url": uri}}])


def last_image_url(sim) -> str:
    body = sim.sim_requests()[-1]
    parts = [p for m in body["messages"] if isinstance(m.get("content"), list) for p in m["content"]]
    urls = [p["image_url"]["url"] for p in parts if p.get("type") == "image_url"]
    assert len(urls) == 1
    return urls[0]


def test_invoke_with_image(stack):
    sim, gw = stack
    uri = photo_uri(640, 480)
    msg = chat(gw).invoke([image_message("langchain invoke marker", uri)])
    assert msg.content.startswith("langchain invoke marker")
    assert msg.usage_metadata["output_tokens"] == 16
    assert msg.usage_metadata["input_tokens"] > 300  # the image's visual tokens were counted upstream
    assert last_image_url(sim).startswith("data:image/")


def test_stream_with_image(stack):
    sim, gw = stack
    chunks = list(chat(gw, stream_usage=True).stream([image_message("langchain stream marker", photo_uri(800, 600))]))
    text = "".join(c.content for c in chunks if isinstance(c.content, str))
    assert text.startswith("langchain stream marker")
    assert sum(1 for c in chunks if c.content) >= 4  # token by token, not one blob
    usage = [c.usage_metadata for c in chunks if c.usage_metadata]
    assert usage and usage[-1]["output_tokens"] == 16


async def test_async_stream_and_batch(stack):
    sim, gw = stack
    llm = chat(gw)
    texts = [m.content for m in await llm.abatch([[image_message(f"batch item {i}", photo_uri(320, 240))]
                                                  for i in range(3)])]
    assert [t.split()[:3] for t in texts] == [["batch", "item", str(i)] for i in range(3)]
    got = ""
    async for c in llm.astream([image_message("async stream marker", photo_uri(320, 240))]):
        got += c.content
    assert got.startswith("async stream marker")


def test_large_image_reaches_engine_within_budget(stack):
    """A 4032x3024 photo through LangChain: the engine sees it at the gateway's budget."""
    sim, gw = stack
    msg = chat(gw).invoke([image_message("big photo", photo_uri(4032, 3024))])
    assert msg.content.startswith("big photo")
    sent = last_image_url(sim)
    w, h = Image.open(io.BytesIO(base64.b64decode(sent.split(",", 1)[1]))).size
    assert max(w, h) <= 768 and w % 32 == 0 and h % 32 == 0
