#!/usr/bin/env python3
"""Generate grafana/dashboards/vlm-gateway.json.

Every panel query is written once here so the dashboard stays consistent (same
rate window, same aggregation labels). Run ``python grafana/build_dashboard.py``
after editing; a test checks the committed JSON matches this script's output and
evaluates every query against a real Prometheus scraping a running gateway.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "dashboards" / "vlm-gateway.json"
# The data source is a template variable: the dashboard imports into any Grafana and picks
# its default Prometheus (or the one chosen at the top), with no uid to match.
DS = {"type": "prometheus", "uid": "${datasource}"}
W = "[$__rate_interval]"  # Grafana picks a window of at least 4 scrape intervals
MODEL = 'model=~"$model"'      # the model and backend variables (All = every value)
BACKEND = 'backend=~"$backend"'


def rate(metric: str, by: str = "", where: str = "") -> str:
    sel = f"{metric}{{{where}}}" if where else metric
    agg = f"sum by ({by}) " if by else "sum "
    return f"{agg}(rate({sel}{W}))"


def quantile(q: float, hist: str, by: str, where: str = "") -> str:
    sel = f"{hist}_bucket{{{where}}}" if where else f"{hist}_bucket"
    return f"histogram_quantile({q}, sum by (le, {by}) (rate({sel}{W})))"


def ratio_by(hits: str, total: str, by: str) -> str:
    """hits/total per label value; a value with lookups but no hit yet reads 0, not absent."""
    return (f"(sum by ({by}) (rate({hits}{W})) or 0 * sum by ({by}) (rate({total}{W})))"
            f" / sum by ({by}) (rate({total}{W}))")


# L2 is the backends' prefix cache, reached by routing: its "hit" is a routing decision
# that followed the backend already holding the request's prefix.
_AFF = 'vlm_gateway_routing_decisions_total{outcome=~"affinity|home|affinity_overloaded|home_overloaded"}'
L2_AFFINITY = (f'label_replace((sum(rate(vlm_gateway_routing_decisions_total{{outcome="affinity"}}{W}))'
               f" or 0 * sum(rate({_AFF}{W}))) / sum(rate({_AFF}{W})), \"level\", \"l2\", \"\", \"\")")

CACHE_RATIO = ratio_by("vlm_gateway_cache_hits_total", "vlm_gateway_cache_lookups_total", "level")


def ENGINE(metric: str) -> str:
    """An engine load figure the gateway scraped (any engine, any load format)."""
    return f'max by (backend) (vlm_gateway_engine_metric{{metric="{metric}", {BACKEND}}})'

# (title, unit, [(expr, legend)], description)
ROWS: list[tuple[str, list[tuple[str, str, list[tuple[str, str]], str]]]] = [
    ("Traffic and errors", [
        ("Requests / s by route and status", "reqps",
         [(rate("vlm_gateway_requests_total", "route, status", MODEL), "{{route}} {{status}}")],
         "Completion requests answered by the gateway (499 = client closed the request)."),
        ("Error ratio", "percentunit",
         [(f'(sum(rate(vlm_gateway_requests_total{{status=~"5..", {MODEL}}}{W})) or vector(0))'
           f" / sum(rate(vlm_gateway_requests_total{{{MODEL}}}{W}))", "5xx"),
          (f'(sum(rate(vlm_gateway_requests_total{{status=~"4..", {MODEL}}}{W})) or vector(0))'
           f" / sum(rate(vlm_gateway_requests_total{{{MODEL}}}{W}))", "4xx")],
         "Share of requests answered with an error status (0 when there were none)."),
        ("Rejections / s by status and reason", "reqps",
         [(rate("vlm_gateway_rejections_total", "status, reason"), "{{status}} {{reason}}")],
         "Requests refused with an OpenAI-style error: 400/401/404/413/429/503/504, mid-stream errors."),
        ("Upstream retries / s", "reqps",
         [(rate("vlm_gateway_retries_total", "reason"), "{{reason}}")],
         "Attempts moved to another backend after a connect error or a 5xx before the first byte."),
    ]),
    ("Latency", [
        ("Request duration (client view)", "s",
         [(quantile(q, "vlm_gateway_request_duration_seconds", "route", MODEL), f"p{int(q * 100)} {{{{route}}}}")
          for q in (0.5, 0.95, 0.99)],
         "Whole request as the client sees it, from its first byte to the answer's last (upstream included), "
         "per route, for the chosen models."),
        ("Upstream time to first token", "s",
         [(quantile(q, "vlm_gateway_upstream_ttft_seconds", "backend", BACKEND), f"p{int(q * 100)} {{{{backend}}}}")
          for q in (0.5, 0.95, 0.99)],
         "From sending the request upstream to the first byte of the answer, per backend."),
        ("Gateway overhead", "s",
         [(quantile(q, "vlm_gateway_overhead_seconds", "route"), f"p{int(q * 100)} {{{{route}}}}")
          for q in (0.5, 0.99)],
         "Time spent in the gateway itself (parse, stages, rewrite, relay), upstream time excluded."),
        ("Upstream end-to-end", "s",
         [(quantile(q, "vlm_gateway_upstream_e2e_seconds", "backend", BACKEND), f"p{int(q * 100)} {{{{backend}}}}")
          for q in (0.5, 0.99)],
         "Whole upstream answer, first byte sent to last byte received."),
        ("Image rewrite time", "s",
         [(quantile(q, "vlm_gateway_image_rewrite_seconds", "instance"), f"p{int(q * 100)} {{{{instance}}}}")
          for q in (0.5, 0.99)],
         "Decode + trim + resize + encode of one image, off the event loop."),
    ]),
    ("Tokens and images", [
        ("Tokens / s", "short",
         [(rate("vlm_gateway_tokens_total", "kind", MODEL), "{{kind}}")],
         "Prompt and completion tokens reported by the upstream engines."),
        ("Visual tokens / s", "short",
         [(rate("vlm_gateway_visual_tokens_total", "stage", MODEL), "{{stage}}"),
          (rate("vlm_gateway_visual_tokens_saved_total", "", MODEL), "saved")],
         "Visual tokens the images would cost as sent (before), after the rewrite, and saved."),
        ("Visual tokens saved", "percentunit",
         [(f"sum(rate(vlm_gateway_visual_tokens_saved_total{{{MODEL}}}{W}))"
           f' / sum(rate(vlm_gateway_visual_tokens_total{{stage="before", {MODEL}}}{W}))', "saved / before")],
         "Share of visual tokens removed by the image rewrite."),
        ("Image bytes / s", "Bps",
         [(rate("vlm_gateway_image_bytes_total", "direction"), "{{direction}}")],
         "Source image bytes received (in) and rewritten bytes sent upstream (out)."),
        ("Coordinate groups / s", "short",
         [(rate("vlm_gateway_coordinates_total", "convention, outcome"), "{{convention}} {{outcome}}")],
         "Boxes and points in answers mapped back to the client's image (mapped) or left as the model "
         "wrote them (unattributed: several images, no Image N marker); history = mapped into the sent frame."),
    ]),
    ("SLO-aware image budgets", [
        ("Image budget level per model pool", "short",
         [("max by (pool) (vlm_gateway_image_budget_level)", "{{pool}}")],
         "0 = every image at its own budget; each level up sends smaller images (photos first, text "
         "never below its legibility floor unless opted in). Steps down when the TTFT percentile nears "
         "the target, back up with hysteresis (docs/TUNING.md)."),
        ("TTFT at the SLO percentile vs target", "s",
         [("max by (pool) (vlm_gateway_slo_ttft_seconds)", "measured {{pool}}"),
          ("max by (pool) (vlm_gateway_slo_ttft_target_seconds)", "target {{pool}}")],
         "The budget controller's own reading: the slo.percentile of the time to first token of requests "
         "sent since its last level change, and slo.ttft_ms."),
        ("Images sent below their budget", "percentunit",
         [(f"sum by (class) (rate(vlm_gateway_images_degraded_total{W}))"
           f" / ignoring(class) group_left sum(rate(vlm_gateway_images_total{W}))", "{{class}}")],
         "Share of images sent smaller than their own budget because of the budget level, by content class."),
    ]),
    ("Video", [
        ("Video prompt tokens / s", "short",
         [(rate("vlm_gateway_video_tokens_total", "stage", MODEL), "{{stage}}"),
          (rate("vlm_gateway_video_tokens_saved_total", "", MODEL), "saved")],
         "Prompt tokens the videos would cost as sent (before), after the rewrite (after: what the "
         "engine counts), and saved."),
        ("Video frames / s", "short",
         [(rate("vlm_gateway_video_frames_total", "direction"), "{{direction}}")],
         "Frames decoded by the gateway, sampled by the engine from the sources as sent (in) and from "
         "the rewritten videos (out)."),
        ("Video rewrite time", "s",
         [(quantile(q, "vlm_gateway_video_rewrite_seconds", "instance"), f"p{int(q * 100)} {{{{instance}}}}")
          for q in (0.5, 0.99)],
         "Decode + sample + dedupe + resize + encode of one video, in the video pool."),
        ("Videos / s by outcome", "ops",
         [(rate("vlm_gateway_videos_total", "outcome"), "{{outcome}}"),
          (f"sum(rate(vlm_gateway_video_rewrite_cpu_seconds_total{W}))"
           f" / sum(rate(vlm_gateway_video_source_seconds_total{W}))", "CPU s per video s")],
         "rewritten, l1_hit, forwarded (rewrite off), url_passthrough, refused; and the rewrite's CPU "
         "seconds per second of source video."),
    ]),
    ("Caches", [
        ("Cache hit ratio per level", "percentunit",
         [(CACHE_RATIO, "{{level}}"),
          (L2_AFFINITY, "l2 affinity")],
         "l1 rewritten images, l2 prefix affinity (share of affinity-policy routing decisions that "
         "followed the backend holding the prefix), l3_exact / l3_normalized / l3_semantic response cache."),
        ("Cache lookups / s per level", "ops",
         [(rate("vlm_gateway_cache_lookups_total", "level"), "lookups {{level}}"),
          (rate("vlm_gateway_cache_hits_total", "level"), "hits {{level}}")],
         "Lookups and hits per cache level."),
    ]),
    ("Backends, queue and routing", [
        ("Backend healthy", "short",
         [(f"min by (backend) (vlm_gateway_backend_healthy{{{BACKEND}}})", "{{backend}}")],
         "1 = healthy and not ejected; 0 = probe failed or circuit open."),
        ("In flight per backend", "short",
         [(f"sum by (backend) (vlm_gateway_backend_inflight{{{BACKEND}}})", "{{backend}}")],
         "Requests the gateway has outstanding on each backend (all workers)."),
        ("Backend load", "percentunit",
         [(f"max by (backend) (vlm_gateway_backend_load{{{BACKEND}}})", "{{backend}}")],
         "Normalised load used by the router (engine running+waiting and gateway in-flight over capacity)."),
        ("Queue depth", "short",
         [("sum(vlm_gateway_queue_depth)", "waiting for a slot")],
         "Requests waiting for a free backend slot (admission queue)."),
        ("Routing decisions / s", "ops",
         [(rate("vlm_gateway_routing_decisions_total", "policy, outcome"), "{{policy}} {{outcome}}")],
         "Router outcomes (affinity followed, load-balanced, ...)."),
        ("Circuit state", "short",
         [(f"max by (backend, state) (vlm_gateway_backend_circuit_state{{{BACKEND}}}) > 0", "{{backend}} {{state}}")],
         "Current circuit-breaker state per backend (closed, open, down)."),
    ]),
    ("Engines (load as the gateway scrapes it)", [
        ("Engine requests running", "short",
         [(ENGINE("running"), "{{backend}}")],
         "Requests each engine is computing, as the gateway last read them: vLLM num_requests_running, "
         "TensorRT-LLM's last iteration (numActiveRequests less the ones it completed) or "
         "trtllm_num_requests_running. A TensorRT-LLM /metrics read waits while the engine is busy: "
         "the line then stops until it idles (docs/TRTLLM.md)."),
        ("Engine requests waiting", "short",
         [(ENGINE("waiting"), "{{backend}}")],
         "Requests queued inside each engine (vLLM num_requests_waiting, TensorRT-LLM numQueuedRequests)."),
        ("Engine KV-cache usage", "percentunit",
         [(ENGINE("kv_usage"), "{{backend}}")],
         "Fraction of the engine's KV-cache blocks in use (TensorRT-LLM: usedNumBlocks / maxNumBlocks)."),
        ("Engine prefix-cache hit rate", "percentunit",
         [(f'max by (backend) (delta(vlm_gateway_engine_metric{{metric="prefix_hits", {BACKEND}}}{W}))'
           f' / max by (backend) (delta(vlm_gateway_engine_metric{{metric="prefix_queries", {BACKEND}}}{W}))',
           "{{backend}}")],
         "Prompt tokens served from the engine's prefix cache over tokens looked up (TensorRT-LLM's "
         "iteration statistics count whole blocks)."),
        ("Engine tokens / s", "short",
         [(f"sum by (instance) (rate(vllm:prompt_tokens_total{W}))"
           f" or sum by (instance) (rate(trtllm_prompt_tokens_total{W}))", "prompt {{instance}}"),
          (f"sum by (instance) (rate(vllm:generation_tokens_total{W}))"
           f" or sum by (instance) (rate(trtllm_generation_tokens_total{W}))", "generation {{instance}}")],
         "Prompt and generated tokens from each engine's own metrics (vLLM; trtllm-serve's "
         "/prometheus/metrics in releases that have token counters)."),
    ]),
]


def panel(pid: int, title: str, unit: str, targets: list[tuple[str, str]], desc: str, x: int, y: int) -> dict:
    return {
        "id": pid, "type": "timeseries", "title": title, "description": desc, "datasource": DS,
        "gridPos": {"h": 8, "w": 6, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit, "custom": {"lineWidth": 1, "fillOpacity": 10}},
                        "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"},
                    "tooltip": {"mode": "multi", "sort": "desc"}},
        "targets": [{"refId": chr(ord("A") + i), "datasource": DS, "expr": e, "legendFormat": leg}
                    for i, (e, leg) in enumerate(targets)],
    }


def build() -> dict:
    panels: list[dict] = []
    pid, y = 1, 0
    for row_title, row_panels in ROWS:
        panels.append({"id": pid, "type": "row", "title": row_title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        pid, y = pid + 1, y + 1
        for i, (title, unit, targets, desc) in enumerate(row_panels):
            if i and i % 4 == 0:
                y += 8
            panels.append(panel(pid, title, unit, targets, desc, (i % 4) * 6, y))
            pid += 1
        y += 8
    return {
        "id": None, "uid": "vlm-gateway", "title": "vlm-gateway", "tags": ["vlm-gateway", "vllm", "tensorrt-llm"],
        "timezone": "browser", "schemaVersion": 39, "version": 1, "editable": True,
        "refresh": "10s", "time": {"from": "now-1h", "to": "now"},
        "annotations": {"list": []}, "templating": {"list": variables()}, "panels": panels,
    }


def _label_variable(name: str, label: str, metric: str) -> dict:
    q = f"label_values({metric}, {name})"
    return {"name": name, "label": label, "type": "query", "datasource": DS, "definition": q,
            "query": {"query": q, "refId": f"{name}-values"}, "refresh": 2, "sort": 1, "regex": "",
            "includeAll": True, "multi": True, "allValue": ".*", "hide": 0, "options": [],
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]}}


def variables() -> list[dict]:
    """The data source (any Prometheus of the Grafana it is imported into), then the models
    and backends the gateway reports (All by default)."""
    return [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
         "refresh": 1, "regex": "", "hide": 0, "includeAll": False, "multi": False, "options": [],
         "current": {}},
        _label_variable("model", "Model", "vlm_gateway_requests_total"),
        _label_variable("backend", "Backend", "vlm_gateway_backend_healthy"),
    ]


def queries(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, expr) for every target of every panel."""
    return [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]


def as_sent(expr: str, rate_window: str, **values: str) -> str:
    """An expr as Grafana sends it to Prometheus: the rate window, and each variable at its
    value (All = its allValue, ``.*``)."""
    out = expr.replace("$__rate_interval", rate_window)
    for v in variables():
        if v["type"] == "query":
            out = out.replace(f"${v['name']}", values.get(v["name"], v["allValue"]))
    return out


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    text = render()
    if "--check" in sys.argv:
        sys.exit(0 if OUT.exists() and OUT.read_text() == text else 1)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT} ({len(queries(build()))} queries)")
