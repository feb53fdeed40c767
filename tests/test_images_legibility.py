"""Text stays legible through the gateway (a CI subset of benchmarks/quality.py).

One image per class of the generated corpus (tests/text_corpus.py) goes through a
running gateway (real OpenAI SDK over HTTP, default image settings: the legible
budget) to the simulator, which keeps what it received. The received image is
scaled back to the source size and a region of it is read by two independent OCR
readers (tesseract, RapidOCR); the recall of the words drawn in that region must
stay within 0.02 of what the readers get from the raw image. The same region sent
at the fixed 768 rule (the policy header) must lose text, so the check can fail.
"""

from __future__ import annotations

import base64
import io
import shutil
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from PIL import Image

import ocr_readers
import text_corpus
from conftest import SIM_MODEL
from vlm_gateway.stages.images.rewrite import rewrite_bytes

pytestmark = pytest.mark.skipif(shutil.which("tesseract") is None, reason="tesseract-ocr is not installed (.ci/run)")
TOLERANCE = 0.02
CROP = (720, 360)  # source px read per image: enough words, quick to read


@pytest.fixture(scope="module")
def env(module_servers):
    sim = module_servers.sim()
    gw = module_servers.gateway({}, backends=[sim])
    return sim, gw


@pytest.fixture(scope="module")
def corpus():
    return text_corpus.samples(1)


def received(sim) -> bytes:
    body = sim.sim_requests()[-1]
    url = [p["image_url"]["url"] for m in body["messages"] if isinstance(m.get("content"), list)
           for p in m["content"] if p.get("type") == "image_url"][0]
    return base64.b64decode(url.split(",", 1)[1])


def send(client, s: text_corpus.Sample, headers: dict | None = None):
    uri = f"data:{s.mime};base64,{base64.b64encode(s.data).decode()}"
    return client.chat.completions.with_raw_response.create(
        model=SIM_MODEL, max_tokens=4, extra_headers=headers or {},
        messages=[{"role": "user", "content": [{"type": "text", "text": "read the text"},
                                               {"type": "image_url", "image_url": {"url": uri}}]}])


def region(s: text_corpus.Sample) -> tuple[int, int, int, int]:
    """A CROP-sized window around the middle word drawn (inside the image; as wide as a
    narrow page)."""
    w, h = s.width_height
    cw, ch = (w if w <= 1280 else CROP[0]), min(CROP[1], h)  # narrow pages: whole lines
    _, (l, t, r, b) = s.boxes[len(s.boxes) // 2]
    x = min(max(0, (l + r) // 2 - cw // 2), w - cw)
    y = min(max(0, (t + b) // 2 - ch // 2), h - ch)
    return x, y, x + cw, y + ch


def source_view(sent: bytes, s: text_corpus.Sample, view: tuple[float, ...]) -> Image.Image:
    """The sent pixels on the source's canvas (the trimmed content box put back in place)."""
    src = Image.open(io.BytesIO(s.data)).convert("RGB")
    im = Image.open(io.BytesIO(sent)).convert("RGB")
    if not view:
        return im.resize(src.size, Image.Resampling.BICUBIC) if im.size != src.size else im
    box = tuple(round(v) for v in view[2:6])
    canvas = src.copy()  # outside the content box the trim only removed a flat border
    canvas.paste(im.resize((box[2] - box[0], box[3] - box[1]), Image.Resampling.BICUBIC), box[:2])
    return canvas


def test_text_stays_legible_through_the_gateway(env, corpus):
    sim, gw = env
    client = openai.OpenAI(base_url=gw.base_url, api_key="x")
    pool = ThreadPoolExecutor(2)
    checks, jobs = [], {}
    for s in corpus:
        raw = send(client, s)
        assert raw.parse().choices[0].message.content
        budget = raw.headers["x-vlm-gateway-image-budget"]
        sent = received(sim)
        before, after = (int(v.split("=")[1]) for v in raw.headers["x-vlm-gateway-visual-tokens"].split(";"))
        local = rewrite_bytes(s.data)  # the same code: the view of the source the output shows
        assert sent == (s.data if local.passthrough else local.data)
        if not s.words:  # a photo without text keeps the fixed rule's savings
            assert "class=no_text" in budget and after <= 0.05 * before, (s.name, budget, before, after)
            continue
        box = region(s)
        words = s.words_in(box)
        assert len(words) >= 3, (s.name, box)
        raw_im = Image.open(io.BytesIO(s.data)).convert("RGB").crop(box)
        sent_im = source_view(sent, s, local.view).crop(box)
        for rd in ocr_readers.READERS:
            jobs[(s.name, "raw", rd)] = pool.submit(ocr_readers.read, raw_im, rd, s.lang)
            jobs[(s.name, "sent", rd)] = pool.submit(ocr_readers.read, sent_im, rd, s.lang)
        checks.append((s, words, budget, before, after))
    # the check can fail: the fixed 768 rule makes small desktop text illegible
    ui = next(s for s in corpus if s.cls == "ui_1080")
    send(client, ui, {"x-vlm-gateway-image-policy": "768"})
    box = region(ui)
    small = source_view(received(sim), ui, rewrite_bytes(ui.data, _fixed_768()).view).crop(box)
    for rd in ocr_readers.READERS:
        jobs[(ui.name, "fixed", rd)] = pool.submit(ocr_readers.read, small, rd, ui.lang)
    failures = []
    for s, words, budget, before, after in checks:
        for rd in ocr_readers.READERS:
            r0 = ocr_readers.recall(words, jobs[(s.name, "raw", rd)].result())
            r1 = ocr_readers.recall(words, jobs[(s.name, "sent", rd)].result())
            if r1 < r0 - TOLERANCE:
                failures.append(f"{s.name} {rd}: raw {r0:.3f} sent {r1:.3f} ({budget}; tokens {before}->{after})")
    ui_words = ui.words_in(region(ui))
    for rd in ocr_readers.READERS:
        r0 = ocr_readers.recall(ui_words, jobs[(ui.name, "raw", rd)].result())
        r768 = ocr_readers.recall(ui_words, jobs[(ui.name, "fixed", rd)].result())
        assert r768 < r0 - 0.1, f"{rd} reads {ui.name} at 768 as well as raw ({r768:.3f} vs {r0:.3f})"
    pool.shutdown()
    assert not failures, "text lost:\n" + "\n".join(failures)


def _fixed_768():
    from vlm_gateway.stages.images.policy import Policy
    return Policy(budget="client")
