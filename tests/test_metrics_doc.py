"""docs/METRICS.md against what a running gateway exports: the reference is generated from
vlm_gateway/metrics.py, every vlm_gateway family on a real /metrics (one worker and two) is
in it with its type and labels, no `*_created` series is written, the saved tokens are a
metric of their own (so a plain sum() of a family never counts a token twice), and the
client-view request duration is there per route and model."""

from __future__ import annotations

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from conftest import SIM_MODEL
from images import data_uri, photo_jpeg
from vlm_gateway.docgen_refs import METRICS_PATH, exported_names, gateway_metrics, render_metrics


def test_metrics_doc_is_generated_from_the_code():
    assert METRICS_PATH.read_text() == render_metrics(), "regenerate with: python -m vlm_gateway.docgen"


def _families(url: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text)}


def _value(fams: dict, family: str, sample: str, **labels) -> float:
    return sum(s.value for s in fams[family].samples
               if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()))


def _check(fams: dict) -> None:
    documented = {m._name: m for m in gateway_metrics()}
    ours = {n: f for n, f in fams.items() if n.startswith("vlm_gateway_")}
    assert ours, "the gateway exported no metric"
    for name, fam in ours.items():
        m = documented.get(name)
        assert m is not None, f"{name} is exported but not in metrics.py / docs/METRICS.md"
        assert fam.type == m._type, (name, fam.type, m._type)
        for s in fam.samples:
            assert not s.name.endswith("_created"), s.name
            assert s.name in exported_names(m), (name, s.name)
            assert set(s.labels) - {"le"} <= set(m._labelnames), (s.name, s.labels)
    # nothing else in the exposition carries a _created series either (process/python collectors)
    assert not [s.name for f in fams.values() for s in f.samples if s.name.endswith("_created")]


def _traffic(gw) -> int:
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    photo = data_uri(photo_jpeg(1600, 1200), "image/jpeg")
    n = 0
    for i in range(3):
        client.chat.completions.create(model=SIM_MODEL, max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "text", "text": f"photo {i}"}, {"type": "image_url", "image_url": {"url": photo}}]}])
        n += 1
    client.completions.create(model=SIM_MODEL, prompt="hi", max_tokens=2)
    return n


def test_a_running_gateway_exports_what_the_reference_says(servers):
    sim = servers.sim()
    gw = servers.gateway({}, backends=[sim])
    chats = _traffic(gw)
    fams = _families(gw.url)
    _check(fams)
    before = _value(fams, "vlm_gateway_visual_tokens", "vlm_gateway_visual_tokens_total", stage="before")
    after = _value(fams, "vlm_gateway_visual_tokens", "vlm_gateway_visual_tokens_total", stage="after")
    saved = _value(fams, "vlm_gateway_visual_tokens_saved", "vlm_gateway_visual_tokens_saved_total")
    assert before > after > 0 and saved == before - after
    # only the two stages in the family: a sum over it counts each token as sent once and as rewritten once
    assert {s.labels["stage"] for s in fams["vlm_gateway_visual_tokens"].samples} == {"before", "after"}
    dur = "vlm_gateway_request_duration_seconds"
    assert _value(fams, dur, dur + "_count", route="chat", model=SIM_MODEL) == chats
    assert _value(fams, dur, dur + "_count", route="completions", model=SIM_MODEL) == 1
    assert _value(fams, dur, dur + "_sum", route="chat", model=SIM_MODEL) > 0


def test_two_workers_export_no_created_series_either(servers):
    sim = servers.sim()
    gw = servers.gateway({}, backends=[sim], workers=2)
    _traffic(gw)
    _check(_families(gw.url))
