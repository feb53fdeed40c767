"""Read an engine's load endpoint into the few figures routing needs.

    running    sequences the engine is computing now
    waiting    requests queued in the engine
    kv_usage   KV-cache fraction in use, 0..1 (a 0..100 percentage is scaled down)
    prefix_hits / prefix_queries   prompt tokens served from the prefix cache / prompt
               tokens looked up (cumulative), when the engine exports them

Two formats, whichever the backend serves (``backends[].metrics_format``; ``auto``
decides by Content-Type, then by the body's shape):

- **Prometheus text** (vLLM, SGLang, trtllm-serve's ``/prometheus/metrics`` in
  releases with the iteration gauges): every quantity has several known names, the
  first one present wins, and values of one name are summed over label sets (several
  models, engine cores or multiprocess pids behind one endpoint).
- **TensorRT-LLM iteration statistics** (trtllm-serve's ``/metrics``: a JSON list of
  the executor's IterationStats, one per iteration since the previous call; the last
  one describes the engine)::

      running        = numActiveRequests - numCompletedRequests
      waiting        = numQueuedRequests
      kv_usage       = kvCacheStats.usedNumBlocks / kvCacheStats.maxNumBlocks
      prefix_hits    = kvCacheStats.reusedBlocks x tokensPerBlock
      prefix_queries = (reusedBlocks + missedBlocks) x tokensPerBlock   (block-granular)

  (the PyTorch executor counts the requests active when an iteration starts, so those
  that completed in it are still in numActiveRequests; after the last iteration of a
  burst the engine is idle). An empty list means no iteration ran since the last call:
  no new figures. The
  endpoint answers only once the engine has been without an iteration for two
  seconds, so its read runs in the background with its own, long timeout and says
  nothing while the engine is busy (the router then counts the gateway's own
  in-flight requests); the scrape loop keeps its pace meanwhile.

A backend may list several candidate endpoints (a trtllm backend without
``metrics_url``: ``/prometheus/metrics`` first, then ``/metrics``); the scraper uses
the first one that yields figures and stays on it until it fails with an HTTP or
format error (not a timeout: a busy trtllm-serve answers late), trying the preferred
ones again every ``PROBE_EVERY_S``. Where every field
comes from, per TensorRT-LLM release: docs/TRTLLM.md.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
import orjson



class Scraped(Protocol):
    """What the scraper reads of a backend (``backend.Backend``, which imports this module)."""

    name: str
    session: Any
    scrape_state: "ScrapeState"

log = logging.getLogger("vlm_gateway.scrape")

FORMATS = ("prometheus", "trtllm_json")
# trtllm-serve's /metrics waits 2 s for one more iteration before it answers
# (OpenAIServer.get_iteration_stats: get_stats_async(2)), and longer while the engine is busy.
JSON_TIMEOUT_S = 30.0
# while a backend is read from a fallback source, its preferred ones are tried again this often
# (trtllm-serve's Prometheus gauges appear only after the first request completes)
PROBE_EVERY_S = 10.0

# Prometheus names per quantity: vLLM V1 (and V0's older names), SGLang, TensorRT-LLM's
# MetricsCollector (tensorrt_llm/metrics/collector.py: trtllm_num_requests_* and the token
# counters from PR #12545, trtllm_kv_cache_utilization from PR #11243, 0..1,
# trtllm_prompt_cached_tokens_total from PR #12636).
NAMES: dict[str, tuple[str, ...]] = {
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs", "trtllm_num_requests_running",
                "vllm_num_requests_running"),
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "trtllm_num_requests_waiting",
                "vllm_num_requests_waiting"),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage",
                 "trtllm_kv_cache_utilization", "vllm_kv_cache_usage_perc"),
    "prefix_hits": ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits_total",
                    "trtllm_prompt_cached_tokens_total"),
    "prefix_queries": ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries",
                       "vllm:gpu_prefix_cache_queries_total", "trtllm_prompt_tokens_total"),
}
_WANTED = frozenset(n for names in NAMES.values() for n in names)


# -- Prometheus text -----------------------------------------------------------------------
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


# -- TensorRT-LLM iteration statistics -------------------------------------------------------
def _num(d: Any, key: str) -> float | None:
    v = d.get(key) if isinstance(d, dict) else None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def iteration_figures(stats: Any) -> dict[str, float] | None:
    """Figures of the latest IterationStats in trtllm-serve's /metrics body (a list, or one
    object); {} for an empty list (no iteration since the last call); None when the body is
    not iteration statistics."""
    if isinstance(stats, dict):
        stats = [stats]
    if not isinstance(stats, list):
        return None
    items = [s for s in stats if isinstance(s, dict)]
    if not items:
        return {} if not stats else None
    # one entry per iteration, oldest first; "iter" orders them where it is present
    last = max(enumerate(items), key=lambda e: (_num(e[1], "iter") or -1.0, e[0]))[1]
    out: dict[str, float] = {}
    running, waiting = _num(last, "numActiveRequests"), _num(last, "numQueuedRequests")
    if running is not None:
        out["running"] = max(0.0, running - (_num(last, "numCompletedRequests") or 0.0))
    if waiting is not None:
        out["waiting"] = waiting
    kv = last.get("kvCacheStats")
    if isinstance(kv, dict):
        used, total = _num(kv, "usedNumBlocks"), _num(kv, "maxNumBlocks")
        if used is not None and total:
            out["kv_usage"] = used / total
        reused, missed, per_block = _num(kv, "reusedBlocks"), _num(kv, "missedBlocks"), _num(kv, "tokensPerBlock")
        if reused is not None and missed is not None and per_block:
            out["prefix_hits"] = reused * per_block
            out["prefix_queries"] = (reused + missed) * per_block
    if not out and not any(k in last for k in ("iter", "iterLatencyMS", "kvCacheStats", "inflightBatchingStats")):
        return None
    return out


# -- format detection ----------------------------------------------------------------------
def detect(content_type: str, body: bytes) -> str | None:
    """'prometheus', 'trtllm_json' or None, from the Content-Type and then the body's shape."""
    ct = (content_type or "").split(";")[0].strip().lower()
    if ct == "application/json" or ct.endswith("+json"):
        return "trtllm_json"
    if ct.startswith("text/plain") or ct == "application/openmetrics-text":
        return "prometheus"
    head = body.lstrip()[:1]
    if head in (b"[", b"{"):
        return "trtllm_json"
    return "prometheus" if head else None


def decode(body: bytes, fmt: str) -> dict[str, float] | None:
    """Figures of one body in a known format; None when it is not that format or has none."""
    if fmt == "trtllm_json":
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        return iteration_figures(data)
    figures = extract(parse(body.decode("utf-8", "replace")))
    return figures or None


# -- one backend's sources -----------------------------------------------------------------
@dataclass
class Source:
    url: str
    fmt: str = "auto"      # auto | prometheus | trtllm_json
    slow: bool = False     # may be trtllm-serve's /metrics: read with JSON_TIMEOUT_S


@dataclass
class ScrapeState:
    """A backend's candidate endpoints and the one in use (``current``)."""
    sources: list[Source] = field(default_factory=list)
    current: int = 0
    seen_format: str = ""  # format of the last body read from ``current``
    announced: bool = False
    next_probe: float = 0.0
    pending: dict[int, asyncio.Future] = field(default_factory=dict)  # slow reads still running

    def cancel_pending(self, keep: int | None = None) -> None:
        for i in [i for i in self.pending if i != keep]:
            self.pending.pop(i).cancel()


def sources_for(engine: str, origin: str, metrics_url: str = "", metrics_format: str = "auto") -> list[Source]:
    """Candidate endpoints of a backend, preferred first."""
    if metrics_url:
        slow = metrics_format == "trtllm_json" or (metrics_format == "auto" and engine == "trtllm")
        return [Source(metrics_url, metrics_format, slow)]
    if engine == "trtllm":
        prom = Source(f"{origin}/prometheus/metrics", "prometheus")
        iters = Source(f"{origin}/metrics", "trtllm_json", slow=True)
        if metrics_format == "prometheus":
            return [prom]
        if metrics_format == "trtllm_json":
            return [iters]
        return [prom, iters]
    if engine in ("vllm", "sim"):
        return [Source(f"{origin}/metrics", metrics_format)]
    return []


class _Hard(Exception):
    """The endpoint answered, but with an HTTP error or a body in no known format."""


class _Pending(Exception):
    """A slow read is still running; its answer is taken at a later scrape."""


async def _read(b: Scraped, src: Source, timeout_s: float) -> dict[str, float]:
    """Figures from one source; {} when the source is valid but has nothing new.
    Raises _Hard, or asyncio.TimeoutError / aiohttp.ClientError / OSError."""
    assert b.session is not None
    t = max(timeout_s, JSON_TIMEOUT_S) if src.slow else timeout_s
    async with b.session.get(src.url, timeout=aiohttp.ClientTimeout(total=t)) as r:
        if r.status != 200:
            raise _Hard(f"HTTP {r.status}")
        raw = await r.read()
        ctype = r.headers.get("content-type", "")
    # the session does not decompress (it relays bodies as they are); engines send plain bodies
    fmt = src.fmt if src.fmt in FORMATS else detect(ctype, raw)
    figures = decode(raw, fmt) if fmt else None
    if figures is None:
        raise _Hard(f"no load figures in a {fmt or 'unknown'} body")
    b.scrape_state.seen_format = fmt or ""
    return figures


async def _read_source(b: Scraped, i: int, src: Source, timeout_s: float) -> dict[str, float]:
    """_read, except that a slow source's read runs on in the background: the scrape waits
    ``timeout_s`` for it and otherwise raises _Pending, so the loop keeps its pace (and can
    probe the other sources) while a busy trtllm-serve holds its /metrics answer."""
    if not src.slow:
        return await _read(b, src, timeout_s)
    st = b.scrape_state
    task = st.pending.get(i)
    if task is None:
        task = st.pending[i] = asyncio.ensure_future(_read(b, src, timeout_s))
    done, _ = await asyncio.wait({task}, timeout=timeout_s)
    if not done:
        raise _Pending
    del st.pending[i]
    return task.result()


async def scrape(b: Scraped, timeout_s: float) -> dict[str, float] | None:
    """One scrape of ``b``'s load endpoint; None when it failed or brought no new figures."""
    st = b.scrape_state
    if not st.sources or b.session is None:
        return None
    order = [st.current] + [i for i in range(len(st.sources)) if i != st.current]
    if st.current and time.monotonic() >= st.next_probe:
        order = list(range(len(st.sources)))      # preferred sources first again
        st.next_probe = time.monotonic() + PROBE_EVERY_S
    for i in order:
        src = st.sources[i]
        try:
            figures = await _read_source(b, i, src, timeout_s)
        except _Pending:
            return None
        except (asyncio.TimeoutError, aiohttp.ClientError, OSError):
            return None          # unreachable or busy: try again next time, same source
        except _Hard as e:
            log.debug("backend %s: %s from %s", b.name, e, src.url)
            continue
        if i != st.current or not st.announced:
            log.info("backend %s: engine load from %s (%s)", b.name, src.url, st.seen_format)
            st.current, st.announced = i, True
            st.cancel_pending(keep=i)
        return figures or None
    return None
