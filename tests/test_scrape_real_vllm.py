"""The router's scraper against a real vLLM 0.24 /metrics scrape (Qwen3-VL-2B
architecture on an H200, captured by benchmarks/gpu; the engine was idle, so the
values are zero — the second test sets values on the real lines)."""

from __future__ import annotations

import re
from pathlib import Path

from vlm_gateway.backends.scrape import extract, parse

REAL = (Path(__file__).parent / "fixtures" / "vllm-0.24-metrics.txt").read_text()


def test_every_routing_quantity_is_found_in_a_real_scrape():
    got = extract(parse(REAL))
    assert got == {"running": 0.0, "waiting": 0.0, "kv_usage": 0.0, "prefix_hits": 0.0, "prefix_queries": 0.0}


def _set(text: str, name: str, value: str) -> str:
    # replace the value of the real sample line of ``name`` (labels kept as vLLM wrote them)
    new, n = re.subn(rf"^({re.escape(name)}\{{[^}}]*\}}) \S+$", rf"\g<1> {value}", text, flags=re.M)
    assert n == 1, name
    return new


def test_values_on_the_real_lines_are_read():
    text = REAL
    for name, value in [("vllm:num_requests_running", "7.0"), ("vllm:num_requests_waiting", "3.0"),
                        ("vllm:kv_cache_usage_perc", "0.42"), ("vllm:prefix_cache_hits_total", "1.2e+04"),
                        ("vllm:prefix_cache_queries_total", "2.4e+04")]:
        text = _set(text, name, value)
    got = extract(parse(text))
    assert got == {"running": 7.0, "waiting": 3.0, "kv_usage": 0.42, "prefix_hits": 12000.0,
                   "prefix_queries": 24000.0}
    # *_created companions and *_by_reason series must not be mistaken for the totals
    assert "vllm:prefix_cache_hits_created" in REAL and "num_requests_waiting_by_reason" in REAL
