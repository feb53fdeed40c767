"""Every Prometheus metric the gateway exports, in one place.

Names are prefixed ``vlm_gateway_``; labels are bounded (model, backend, route,
status, level, reason, state) and never carry user data. With several workers the
CLI sets ``PROMETHEUS_MULTIPROC_DIR`` before this module is imported, and
``render()`` aggregates the workers' files. Every gauge uses a ``live*`` mode so
the files of a worker that died (and was replaced) are dropped at the next render
instead of holding a stale in-flight count or health flag.
"""

from __future__ import annotations

import os

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram,
                               disable_created_metrics, generate_latest)

# no `*_created` gauge beside every counter and histogram (a sample per series that no query uses)
disable_created_metrics()
MULTIPROC = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))

_FAST = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
_SLOW = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


def _gauge(name: str, doc: str, labels: tuple[str, ...] = (), mode: str = "livesum") -> Gauge:
    return Gauge(name, doc, labels, multiprocess_mode=mode)


REQUESTS = Counter("vlm_gateway_requests_total", "Requests by route, model and status",
                   ("route", "model", "status"))
# the client's view, upstream included: first byte of the request -> last byte of the answer
REQUEST_DURATION = Histogram("vlm_gateway_request_duration_seconds",
                             "Whole request as the client sees it, from its first byte to the answer's last, "
                             "by route and model (model: a served one, else other)", ("route", "model"),
                             buckets=_SLOW)
OVERHEAD = Histogram("vlm_gateway_overhead_seconds", "Time spent in the gateway, upstream excluded",
                     ("route",), buckets=_FAST)
OVERHEAD_PHASE = Histogram("vlm_gateway_overhead_phase_seconds",
                           "Gateway time from a request's first byte to its first byte upstream, by phase: "
                           "receive, parse, queue, media, route, other, and gateway (the whole)",
                           ("route", "phase"), buckets=_FAST + (2.5, 10.0))
UPSTREAM_TTFT = Histogram("vlm_gateway_upstream_ttft_seconds", "Upstream time to first token",
                          ("backend",), buckets=_SLOW)
UPSTREAM_E2E = Histogram("vlm_gateway_upstream_e2e_seconds", "Upstream end-to-end time",
                         ("backend",), buckets=_SLOW)
TOKENS = Counter("vlm_gateway_tokens_total", "Prompt/completion tokens reported by upstreams",
                 ("model", "kind"))
VISUAL_TOKENS = Counter("vlm_gateway_visual_tokens_total",
                        "Visual tokens of images as the client sent them (stage=before) and as rewritten "
                        "(stage=after)", ("model", "stage"))
VISUAL_TOKENS_SAVED = Counter("vlm_gateway_visual_tokens_saved_total",
                              "Visual tokens the image rewrite removed (before - after)", ("model",))
IMAGE_BYTES = Counter("vlm_gateway_image_bytes_total", "Image bytes in (source) and out (sent)",
                      ("direction",))
IMAGES = Counter("vlm_gateway_images_total", "Images handled by outcome", ("outcome",))
# class: text | dense_text | no_text | unmeasured; reason: budget.REASONS (both bounded)
IMAGE_BUDGETS = Counter("vlm_gateway_image_budgets_total", "Long-side decisions for images over the pass-through size",
                        ("class", "reason"))
REWRITE_SECONDS = Histogram("vlm_gateway_image_rewrite_seconds", "Image rewrite time (decode+resize+encode)",
                            buckets=_FAST[3:] + (2.5,))
CACHE_LOOKUPS = Counter("vlm_gateway_cache_lookups_total", "Cache lookups per level", ("level",))
CACHE_HITS = Counter("vlm_gateway_cache_hits_total", "Cache hits per level", ("level",))
# L3 entries held in process (l3_local: exact+normalised LRU, l3_semantic: index); replicas
# each hold a copy of the semantic index, so the aggregate is the largest live worker.
CACHE_ENTRIES = _gauge("vlm_gateway_cache_entries", "L3 cache entries held in process per level",
                       ("level",), mode="livemax")
# min over workers: a backend any live worker has ejected shows as unhealthy
BACKEND_HEALTHY = _gauge("vlm_gateway_backend_healthy", "1 when the backend is healthy",
                         ("backend",), mode="livemin")
BACKEND_STATE = _gauge("vlm_gateway_backend_circuit_state",
                       "Circuit state per backend (1 for the current state)", ("backend", "state"), mode="livemax")
BACKEND_INFLIGHT = _gauge("vlm_gateway_backend_inflight", "Requests in flight per backend", ("backend",))
BACKEND_LOAD = _gauge("vlm_gateway_backend_load", "Normalised load per backend (0..1+)", ("backend",),
                      mode="livemax")
ENGINE_METRIC = _gauge("vlm_gateway_engine_metric",
                       "Engine load figures as scraped (running, waiting, kv_usage, prefix_hits, prefix_queries)",
                       ("backend", "metric"), mode="livemostrecent")
# SLO-aware image budgets (backends/slo.py): per model pool, livemax = the most cautious worker
IMAGE_BUDGET_LEVEL = _gauge("vlm_gateway_image_budget_level",
                            "Image budget level per model pool (0 = full budgets; higher = smaller images)",
                            ("pool",), mode="livemax")
SLO_TTFT = _gauge("vlm_gateway_slo_ttft_seconds",
                  "Time to first token at the SLO percentile, as the budget controller measured it last",
                  ("pool",), mode="livemax")
SLO_TARGET = _gauge("vlm_gateway_slo_ttft_target_seconds", "Time-to-first-token target of the budget controller",
                    ("pool",), mode="livemax")
IMAGES_DEGRADED = Counter("vlm_gateway_images_degraded_total",
                          "Images sent smaller than their own budget because of the budget level, by class",
                          ("class",))
QUEUE_DEPTH = _gauge("vlm_gateway_queue_depth", "Requests waiting for a backend slot")
REJECTIONS = Counter("vlm_gateway_rejections_total", "Rejected requests by status and reason",
                     ("status", "reason"))
RETRIES = Counter("vlm_gateway_retries_total", "Upstream attempts retried on another backend", ("reason",))
ROUTING = Counter("vlm_gateway_routing_decisions_total", "Routing decisions by policy and outcome",
                  ("policy", "outcome"))
COORDINATES = Counter("vlm_gateway_coordinates_total",
                      "Coordinate groups: in answers mapped to the client's frame or left unattributed; "
                      "in the conversation mapped to the model's frame (history)", ("convention", "outcome"))
RATE_LIMITED = Counter("vlm_gateway_rate_limited_total",
                       "Requests refused by a per-tenant rate limit, by limit "
                       "(requests, images, tokens, concurrency)", ("limit",))
RATELIMIT_FALLBACKS = Counter("vlm_gateway_ratelimit_redis_failures_total",
                              "Redis failures that switched rate limits to in-process buckets")
CONNECTIONS_CLOSED = Counter("vlm_gateway_client_connections_closed_total",
                             "Client connections closed by the gateway's guards, by reason (header_timeout, "
                             "body_timeout, headers_too_large, send_timeout, bad_request, evicted, full, rebalance: after a "
                             "response, to even out connections over the workers)", ("reason",))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_dead_workers(path: str) -> list[int]:
    """Remove the live-gauge files of worker processes that no longer exist
    (uvicorn replaces a crashed worker; its files would otherwise stay)."""
    from prometheus_client import multiprocess
    dead = set()
    for name in os.listdir(path):
        if name.startswith("gauge_live") and name.endswith(".db"):
            try:
                pid = int(name[:-3].rsplit("_", 1)[1])
            except (IndexError, ValueError):
                continue
            if pid not in dead and not _pid_alive(pid):
                dead.add(pid)
    for pid in dead:
        multiprocess.mark_process_dead(pid, path)
    return sorted(dead)


def render() -> tuple[bytes, str]:
    if MULTIPROC:
        from prometheus_client import multiprocess
        reap_dead_workers(os.environ["PROMETHEUS_MULTIPROC_DIR"])
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return generate_latest(), CONTENT_TYPE_LATEST
MEDIA_BYTES_IN_FLIGHT = _gauge("vlm_gateway_media_bytes_in_flight",
                               "Media bytes held for requests in flight (fetch buffers, decoded sources)")
DECODE_BYTES_IN_FLIGHT = _gauge("vlm_gateway_decode_bytes_in_flight",
                                "Memory the image decodes running now hold, as estimated before each decode")
MEDIA_PARTS = Counter("vlm_gateway_media_parts_total", "Non-image media parts by kind and outcome",
                      ("kind", "outcome"))
VIDEOS = Counter("vlm_gateway_videos_total", "Video parts by outcome (rewritten, shared, l1_hit, forwarded, url_passthrough, refused)",
                 ("outcome",))
VIDEO_FRAMES = Counter("vlm_gateway_video_frames_total",
                       "Video frames: decoded by the gateway, sampled by the engine from the source as sent (in) "
                       "and from the rewritten video (out)", ("direction",))
VIDEO_TOKENS = Counter("vlm_gateway_video_tokens_total",
                       "Prompt tokens of video parts as sent (stage=before) and as rewritten (stage=after)",
                       ("model", "stage"))
VIDEO_TOKENS_SAVED = Counter("vlm_gateway_video_tokens_saved_total",
                             "Prompt tokens the video rewrite removed (before - after)", ("model",))
VIDEO_REWRITE_SECONDS = Histogram("vlm_gateway_video_rewrite_seconds",
                                  "Video rewrite wall time (decode, sample, dedupe, resize, encode)",
                                  buckets=_SLOW)
VIDEO_REWRITE_CPU = Counter("vlm_gateway_video_rewrite_cpu_seconds_total",
                            "CPU seconds of video rewrites (the decode thread's)")
VIDEO_SECONDS = Counter("vlm_gateway_video_source_seconds_total", "Seconds of source video rewritten")

# Backend discovery: backends each source lists now, and membership changes.
DISCOVERY_BACKENDS = _gauge("vlm_gateway_discovery_backends", "Backends a discovery source lists now",
                            ("source",), mode="livemax")
DISCOVERY_CHANGES = Counter("vlm_gateway_discovery_changes_total",
                            "Backends added, drained (left their source) and removed (drained and idle)",
                            ("source", "change"))
DISCOVERY_ERRORS = Counter("vlm_gateway_discovery_errors_total",
                           "Failed discovery lookups or watches (the last answer is kept)", ("source",))


def forget_backend(name: str) -> None:
    """Drop a removed backend's series, so that departed engines do not linger in the dashboard."""
    for g in (BACKEND_HEALTHY, BACKEND_INFLIGHT, BACKEND_LOAD):
        try:
            g.remove(name)
        except KeyError:
            pass
    for g, labels in ((BACKEND_STATE, ("closed", "open", "half_open", "down")),
                      (ENGINE_METRIC, ("running", "waiting", "kv_usage", "prefix_hits", "prefix_queries"))):
        for second in labels:
            try:
                g.remove(name, second)
            except KeyError:
                pass
