"""Read an engine's Prometheus ``/metrics`` into the few load figures routing needs.

Engines rename metrics between versions, so every quantity has several known
names; the first one present wins, and values of one name are summed over its
label sets (several models or engine cores behind one endpoint).

    running    sequences being computed now
    waiting    sequences queued in the engine
    kv_usage   KV-cache fraction in use, 0..1 (a 0..100 percentage is scaled down)
    prefix_hits / prefix_queries   prefix-cache counters (tokens), when exported
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import aiohttp

if TYPE_CHECKING:
    from .backend import Backend

NAMES: dict[str, tuple[str, ...]] = {
    "running": ("vllm:num_requests_running", "trtllm_num_requests_running", "trtllm:num_requests_running",
                "sglang:num_running_reqs", "vllm_num_requests_running"),
    "waiting": ("vllm:num_requests_waiting", "trtllm_num_requests_waiting", "trtllm:num_requests_waiting",
                "sglang:num_queue_reqs", "vllm_num_requests_waiting"),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "trtllm_kv_cache_utilization",
                 "trtllm:kv_cache_utilization", "sglang:token_usage", "vllm_kv_cache_usage_perc"),
    "prefix_hits": ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits", "trtllm_prefix_cache_hits_total",
                    "trtllm_prefix_cache_hits", "vllm:gpu_prefix_cache_hits_total"),
    "prefix_queries": ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries",
                       "trtllm_prefix_cache_queries_total", "trtllm_prefix_cache_queries",
                       "vllm:gpu_prefix_cache_queries_total"),
}
_WANTED = frozenset(n for names in NAMES.values() for n in names)


def parse(text: str, wanted: frozenset[str] = _WANTED) -> dict[str, float]:
    """Sum of the samples of each wanted metric name in a text exposition."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        space = line.find(" ")
        if brace != -1 and (space == -1 or brace < space):
            name = line[:brace]
            rest = line[line.rfind("}") + 1:]
        else:
            name, rest = line[:space], line[space:]
        if name not in wanted:
            continue
        try:
            value = float(rest.split()[0])
        except (IndexError, ValueError):
            continue
        if value != value:  # NaN
            continue
        out[name] = out.get(name, 0.0) + value
    return out


def extract(samples: dict[str, float]) -> dict[str, float]:
    """Known-name lookup: {running, waiting, kv_usage, prefix_hits, prefix_queries} (present ones only)."""
    out: dict[str, float] = {}
    for quantity, names in NAMES.items():
        for n in names:
            if n in samples:
                out[quantity] = samples[n]
                break
    kv = out.get("kv_usage")
    if kv is not None and kv > 1.0:
        out["kv_usage"] = kv / 100.0
    return out


async def scrape(b: "Backend", timeout_s: float) -> dict[str, float] | None:
    """One scrape of ``b.metrics_url``; None when it failed or exposed none of the names."""
    if not b.metrics_url or b.session is None:
        return None
    try:
        async with b.session.get(b.metrics_url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            if r.status != 200:
                return None
            raw = await r.read()
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return None
    # the session does not decompress (it relays bodies as they are); engines send plain text
    figures = extract(parse(raw.decode("utf-8", "replace")))
    return figures or None
