"""The simulator's TensorRT-LLM surfaces: what trtllm-serve (PyTorch backend, started
with ``enable_iter_perf_stats: true`` and ``return_perf_metrics: true`` as
``vlm-gateway launch`` writes them) shows a gateway, per release line.

``GET /metrics`` (every release): the executor's IterationStats as JSON, one entry per
engine step since the previous call, with the keys of
cpp/tensorrt_llm/executor/jsonSerialization.cpp and the values the PyTorch executor
sets (tensorrt_llm/_torch/pyexecutor/py_executor.py ``_update_iter_stats``)::

    numActiveRequests  = requests running (admitted)      numQueuedRequests = waiting
    kvCacheStats       = blocks of the simulated pool (used = held by requests),
                         reusedBlocks / missedBlocks = prompt blocks found / not found
                         in the prefix cache, cumulative, cacheHitRate = their ratio
    inflightBatchingStats = this step's context (prefill) and generation sequences

served with trtllm-serve's timing (tensorrt_llm/executor/result.py ``IterationResult``,
read by ``OpenAIServer.get_iteration_stats`` with a 2 s timeout): ``[]`` at once before
the first request and after a read that ran dry, until a request is submitted; else the
queued entries plus every entry that arrives less than ``WAIT_S`` after the previous
one, so a read returns only after the engine has been idle for ``WAIT_S``.

``GET /prometheus/metrics``:

- release ``1.2`` (the stable line): MetricsCollector's five request series
  (``trtllm_`` names) with the labels it hard-coded then (``model_name="undefined"``,
  ``engine_type="undefined"``);
- release ``1.3`` (pre-releases with PR #12545 and #12636): ``trtllm_`` names with the
  model's labels, token counters, and the iteration gauges. Those are set by the
  server's stats collector, which starts draining at a request's completion and logs
  each entry until ``COLLECTOR_WAIT_S`` passes without one, so they freeze at the last
  step before an idle spell (``trtllm_num_requests_running`` keeps that step's count).
  Gauges carry a ``pid`` label, as prometheus_client's multiprocess mode writes them.

Latencies are in simulated seconds (wall time divided by the time scale).
"""

from __future__ import annotations

import asyncio
import datetime
import os
from collections import deque

from .metrics_text import E2E_BUCKETS, TTFT_BUCKETS, Histogram, _esc
from .prompt import BLOCK_SIZE

RELEASES = ("1.2", "1.3")
WAIT_S = 2.0               # OpenAIServer.get_iteration_stats: get_stats_async(2)
COLLECTOR_WAIT_S = 0.5     # OpenAIServer._iteration_stats_collector_loop: get_stats_async(timeout=0.5)
MAX_ENTRIES = 1000         # bound of the stats queue kept between reads
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0)
QUEUE_BUCKETS = E2E_BUCKETS


class IterationLog:
    """trtllm-serve's iteration-statistics queue and its read timing."""

    def __init__(self) -> None:
        self.entries: deque[dict] = deque(maxlen=MAX_ENTRIES)
        self.started = False     # a request was ever submitted
        self.done = False        # the last read ran dry; reset by the next submission
        self._arrived = asyncio.Event()

    def submitted(self) -> None:
        self.started = True
        self.done = False

    def record(self, entry: dict) -> None:
        self.entries.append(entry)
        self._arrived.set()

    async def read(self, wait_s: float = WAIT_S) -> list[dict]:
        out: list[dict] = []
        if not self.started:
            return out
        while not self.done:
            if self.entries:
                out.append(self.entries.popleft())
                continue
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), wait_s)
            except asyncio.TimeoutError:
                self.done = True
        return out


class TrtllmSurface:
    """Iteration statistics and Prometheus series of one simulated trtllm-serve."""

    def __init__(self, engine, release: str = "1.2") -> None:
        if release not in RELEASES:
            raise ValueError(f"unknown TensorRT-LLM release line {release!r}; known: {', '.join(RELEASES)}")
        self.engine = engine
        self.release = release
        self.log = IterationLog()
        self.iter = 0
        self.gauges: dict[str, float] = {}       # the collector's last logged values (release 1.3)
        self._collector_until = -1.0             # loop time the collector's drain runs until
        self.reset()

    def reset(self) -> None:
        self.tpot = Histogram(TPOT_BUCKETS)
        self.queue = Histogram(QUEUE_BUCKETS)
        self.cached_tokens_total = 0
        self.completed_total = 0

    # -- engine hooks -------------------------------------------------------------------
    def submitted(self) -> None:
        self.log.submitted()

    def finished(self, job, now: float, scale: float) -> None:
        """A request completed: per-request series, and the collector wakes up."""
        if job.generated > 1 and job.t_first is not None:
            self.tpot.observe((now - job.t_first) / scale / (job.generated - 1))
        self.queue.observe(max(0.0, (job.t_admitted or job.t_arrival) - job.t_arrival) / scale)
        self.cached_tokens_total += job.cached_tokens
        self._collector_until = max(self._collector_until, now + COLLECTOR_WAIT_S)

    def step(self, *, running: int, waiting: int, admitted: int, completed: int, decode: int,
             prefill: int, prefill_tokens: int, latency_s: float, now: float) -> None:
        """One engine step ended: its IterationStats entry."""
        self.iter += 1
        c = self.engine.cache
        reused = c.hits // BLOCK_SIZE
        missed = max(0, -(-c.queries // BLOCK_SIZE) - reused)
        entry = {
            "timestamp": datetime.datetime.now().strftime("%m-%d-%Y %H:%M:%S.%f"),
            "iter": self.iter,
            "iterLatencyMS": latency_s * 1000.0,
            "newActiveRequestsQueueLatencyMS": 0.0,
            "numNewActiveRequests": admitted,
            "numActiveRequests": running,
            "numQueuedRequests": waiting,
            "numCompletedRequests": completed,
            "maxNumActiveRequests": self.engine.profile.max_num_seqs,
            "maxBatchSizeStatic": 0, "maxBatchSizeTunerRecommended": 0, "maxBatchSizeRuntime": 0,
            "maxNumTokensStatic": 0, "maxNumTokensTunerRecommended": 0, "maxNumTokensRuntime": 0,
            "gpuMemUsage": 0, "cpuMemUsage": 0, "pinnedMemUsage": 0,   # no GPU behind the simulator
            "kvCacheStats": {
                "maxNumBlocks": c.capacity, "freeNumBlocks": c.capacity - c.active, "usedNumBlocks": c.active,
                "tokensPerBlock": BLOCK_SIZE, "allocTotalBlocks": reused + missed, "allocNewBlocks": missed,
                "reusedBlocks": reused, "missedBlocks": missed,
                "cacheHitRate": reused / (reused + missed) if reused + missed else 0.0,
            },
            "staticBatchingStats": {"numScheduledRequests": 0, "numContextRequests": 0, "numCtxTokens": 0,
                                    "numGenTokens": 0, "emptyGenSlots": 0},
            "inflightBatchingStats": {"numScheduledRequests": decode + prefill, "numContextRequests": prefill,
                                      "numGenRequests": decode, "numPausedRequests": 0,
                                      "numCtxTokens": prefill_tokens, "microBatchId": 0,
                                      "avgNumDecodedTokensPerIter": 0.0},
            "specDecodingStats": None,
        }
        self.log.record(entry)
        if self.release != "1.2" and now <= self._collector_until:
            self._log_gauges(entry)
            self._collector_until = now + COLLECTOR_WAIT_S
        self.completed_total += completed

    def _log_gauges(self, e: dict) -> None:
        kv, ifb = e["kvCacheStats"], e["inflightBatchingStats"]
        self.gauges = {
            "num_requests_running": e["numActiveRequests"], "num_requests_waiting": e["numQueuedRequests"],
            "max_num_active_requests": e["maxNumActiveRequests"],
            "iteration_latency_seconds": e["iterLatencyMS"] / 1000.0,
            "kv_cache_utilization": kv["usedNumBlocks"] / kv["maxNumBlocks"] if kv["maxNumBlocks"] else 0.0,
            "kv_cache_hit_rate": kv["cacheHitRate"],
            "kv_cache_max_blocks": kv["maxNumBlocks"], "kv_cache_free_blocks": kv["freeNumBlocks"],
            "kv_cache_used_blocks": kv["usedNumBlocks"], "kv_cache_tokens_per_block": kv["tokensPerBlock"],
            "num_context_requests": ifb["numContextRequests"], "num_generation_requests": ifb["numGenRequests"],
            "num_paused_requests": ifb["numPausedRequests"], "num_scheduled_requests": ifb["numScheduledRequests"],
            "_reused": kv["reusedBlocks"], "_missed": kv["missedBlocks"],
        }

    # -- HTTP bodies --------------------------------------------------------------------
    def render_prometheus(self, model: str) -> bytes:
        """/prometheus/metrics as prometheus_client's multiprocess collector writes it:
        labels sorted, counters named with ``_total``, a histogram's sum before its buckets."""
        eng = self.engine
        if self.release == "1.2":
            prefix, base = "trtllm_", {"engine_type": "undefined", "model_name": "undefined"}
        else:
            prefix, base = "trtllm_", {"engine_type": "trtllm", "model_name": model}
        out: list[str] = []

        def lbl(**extra) -> str:
            return ",".join(f'{k}="{_esc(str(v))}"' for k, v in sorted({**base, **extra}.items()))

        def family(name: str, kind: str, help_: str) -> str:
            full = prefix + name
            out.append(f"# HELP {full} {help_}")
            out.append(f"# TYPE {full} {kind}")
            return full

        def hist(name: str, help_: str, h: Histogram) -> None:
            full = family(name, "histogram", help_)
            out.append(f"{full}_sum{{{lbl()}}} {h.sum}")
            cum = 0
            for le, n in zip(h.buckets, h.counts):
                cum += n
                out.append(f"{full}_bucket{{{lbl(le=float(le))}}} {float(cum)}")
            out.append(f"{full}_bucket{{{lbl(le='+Inf')}}} {float(h.count)}")
            out.append(f"{full}_count{{{lbl()}}} {float(h.count)}")

        full = family("request_success_total", "counter", "Count of successfully processed requests.")
        out.append(f"{full}{{{lbl(finished_reason='length')}}} {float(eng.finished)}")
        hist("e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", eng.e2e)
        hist("time_to_first_token_seconds", "Histogram of time to first token in seconds.", eng.ttft)
        hist("time_per_output_token_seconds", "Histogram of time per output token in seconds.", self.tpot)
        hist("request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", self.queue)
        if self.release == "1.2":
            return ("\n".join(out) + "\n").encode()
        g = self.gauges
        counters = [("prompt_tokens_total", eng.prompt_tokens_total,
                     "Cumulative number of prompt (input) tokens processed."),
                    ("generation_tokens_total", eng.generation_tokens_total,
                     "Cumulative number of generation (output) tokens produced."),
                    ("prompt_cached_tokens_total", self.cached_tokens_total,
                     "Process-lifetime total prompt tokens served from KV cache."),
                    ("num_requests_completed_total", self.completed_total,
                     "Total number of completed requests across iterations")]
        if g:
            counters += [("kv_cache_reused_blocks_total", g["_reused"],
                          "Cumulative number of KV cache blocks reused (cache hits)"),
                         ("kv_cache_missed_blocks_total", g["_missed"],
                          "Cumulative number of KV cache blocks missed (cache misses)")]
        for name, value, help_ in counters:
            full = family(name, "counter", help_)
            out.append(f"{full}{{{lbl()}}} {float(value)}")
        pid = os.getpid()
        for name, value in g.items():
            if not name.startswith("_"):
                full = family(name, "gauge", GAUGE_HELP[name])
                out.append(f"{full}{{{lbl(pid=pid)}}} {float(value)}")
        return ("\n".join(out) + "\n").encode()


# help texts of tensorrt_llm/metrics/collector.py
GAUGE_HELP = {
    "num_requests_running": "Number of active requests", "num_requests_waiting": "Number of queued requests",
    "max_num_active_requests": "Maximum number of active requests",
    "iteration_latency_seconds": "Iteration latency in seconds",
    "kv_cache_utilization": "KV cache utilization", "kv_cache_hit_rate": "KV cache hit rate",
    "kv_cache_max_blocks": "Maximum number of KV cache blocks", "kv_cache_free_blocks": "Number of free KV cache blocks",
    "kv_cache_used_blocks": "Number of used KV cache blocks",
    "kv_cache_tokens_per_block": "Number of tokens per KV cache block",
    "num_context_requests": "Number of context (prefill) requests",
    "num_generation_requests": "Number of generation (decode) requests",
    "num_paused_requests": "Number of paused requests", "num_scheduled_requests": "Number of scheduled requests",
}
