"""The simulator's /metrics in vLLM mode: Prometheus text with vLLM's metric names
and labels (``engine="0",model_name=...`` as vLLM 0.24 writes them; aborted
requests are ``vllm:request_success_total{finished_reason="abort"}`` as in vLLM).
TensorRT-LLM mode serves trtllm-serve's own formats instead (trtllm.py).

Written by hand rather than with prometheus_client so that a simulator running
inside the gateway process (the embedded default) never mixes its series into
the gateway's own registry. Latencies are in simulated seconds (wall time
divided by the profile's time scale), so a scaled run reports what the modelled
engine would. As in vLLM, TTFT and e2e count from the request's arrival at the API
server (its queue and preprocessing included), ``request_queue_time`` is the time in
the scheduler's waiting queue and ``request_prefill_time`` from scheduling to the first
token; ``mm_cache_*`` count processor-cache lookups per image, summed over the API
servers; ``num_requests_waiting`` is the scheduler's queue only.
"""

from __future__ import annotations

import bisect

# vLLM V1's buckets
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
               240.0, 480.0, 960.0, 1920.0, 7680.0)

# our name -> (vLLM name, type, help)
NAMES = {
    "running": ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches."),
    "waiting": ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed."),
    "kv_usage": ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage."),
    "pc_queries": ("vllm:prefix_cache_queries", "counter",
                   "Prefix cache queries, in terms of number of queried tokens."),
    "pc_hits": ("vllm:prefix_cache_hits", "counter", "Prefix cache hits, in terms of number of cached tokens."),
    "mm_queries": ("vllm:mm_cache_queries", "counter",
                   "Multi-modal cache queries, in terms of number of queried items."),
    "mm_hits": ("vllm:mm_cache_hits", "counter", "Multi-modal cache hits, in terms of number of cached items."),
    "prompt_tokens": ("vllm:prompt_tokens", "counter", "Number of prefill tokens processed."),
    "generation_tokens": ("vllm:generation_tokens", "counter", "Number of generation tokens processed."),
    "success": ("vllm:request_success", "counter", "Count of successfully processed requests."),
    "preemptions": ("vllm:num_preemptions", "counter", "Cumulative number of preemption from the engine."),
    "ttft": ("vllm:time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds."),
    "e2e": ("vllm:e2e_request_latency_seconds", "histogram", "Histogram of e2e request latency in seconds."),
    "queue": ("vllm:request_queue_time_seconds", "histogram",
              "Histogram of time spent in WAITING phase for request."),
    "prefill": ("vllm:request_prefill_time_seconds", "histogram",
                "Histogram of time spent in PREFILL phase for request."),
}


class Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, v)] += 1
        self.sum += v
        self.count += 1


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(engine, model: str) -> bytes:
    # the label set as vLLM 0.24 writes it (engine="0" first)
    lbl = f'engine="0",model_name="{_esc(model)}"'
    c = engine.cache
    values = {
        "running": len(engine.running), "waiting": len(engine.waiting), "kv_usage": c.usage(),
        "pc_queries": c.queries, "pc_hits": c.hits, "mm_queries": engine.mm_queries, "mm_hits": engine.mm_hits,
        "prompt_tokens": engine.prompt_tokens_total,
        "generation_tokens": engine.generation_tokens_total, "preemptions": 0,
    }
    # every request ends at max_tokens (finish_reason "length"); a client that went away is "abort"
    success = {"stop": 0, "length": engine.finished, "abort": engine.aborted, "error": 0}
    out: list[str] = []
    for key, (name, kind, help_) in NAMES.items():
        out.append(f"# HELP {name} {help_}")
        out.append(f"# TYPE {name} {kind}")
        if kind == "histogram":
            h: Histogram = {"ttft": engine.ttft, "e2e": engine.e2e, "queue": engine.queue_time,
                            "prefill": engine.prefill_time}[key]
            cum = 0
            for le, n in zip(h.buckets, h.counts):
                cum += n
                out.append(f'{name}_bucket{{{lbl},le="{le}"}} {cum}')
            out.append(f'{name}_bucket{{{lbl},le="+Inf"}} {h.count}')
            out.append(f"{name}_sum{{{lbl}}} {h.sum}")
            out.append(f"{name}_count{{{lbl}}} {h.count}")
        elif key == "success":
            for reason, n in success.items():
                out.append(f'{name}_total{{{lbl},finished_reason="{reason}"}} {float(n)}')
        elif kind == "counter":
            out.append(f"{name}_total{{{lbl}}} {float(values[key])}")
        else:
            out.append(f"{name}{{{lbl}}} {float(values[key])}")
    return ("\n".join(out) + "\n").encode()
