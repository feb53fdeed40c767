"""Value checks of the configuration model: the right type is not enough.

``check(cfg)`` walks every key of a built ``GatewayConfig`` and raises
``ConfigError("<key>: <what is wrong>")`` for the first bad value, so the CLI can
print one line and exit 2 before it listens. The rules, in order:

- every float is finite; every number is >= 0 unless ``RULES`` says more;
- ``RULES[key]`` (``backends[].url`` stands for every list entry) checks ranges,
  URLs, hosts, CIDRs and paths;
- ``_across`` checks what involves several keys (unique names, min <= max, per-model
  image overrides, per-process rate limits with several workers and no Redis).

Every string, list and map key of the model is in ``RULES``, in ``FREE`` (any value
of the right type is valid there) or in ``NAMED_ABOVE``: names a layer above defines
(routing policies, GPU and simulator profiles), which that layer checks after this
module (``backends/config_names.py``; ``vlm_gateway.load_config`` runs both); a test
walks the model and gives every key a wrong value.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import re
import typing
from typing import Any, Callable
from urllib.parse import urlsplit

from .config import _COORDINATE_KEYS, IMAGE_OVERRIDE_KEYS, ConfigError, GatewayConfig, ImagesConfig, _convert
from .redis_keys import PREFIX_RE

# (value, whole config) -> what is wrong, or None
Rule = Callable[[Any, GatewayConfig], "str | None"]

_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9_-]{1,63}(?<!-)$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


# -- rule builders ------------------------------------------------------------------------

def at_least(lo: float) -> Rule:
    return lambda v, cfg: None if v >= lo else f"must be >= {lo:g}, got {v!r}"


def above(lo: float) -> Rule:
    return lambda v, cfg: None if v > lo else f"must be > {lo:g}, got {v!r}"


def within(lo: float, hi: float) -> Rule:
    return lambda v, cfg: None if lo <= v <= hi else f"must be within [{lo:g}, {hi:g}], got {v!r}"


def each(rule: Rule) -> Rule:
    """A rule for every item of a list value, naming the bad item."""
    def check(values: list, cfg) -> str | None:
        for i, v in enumerate(values):
            problem = rule(v, cfg)
            if problem:
                return f"item {i} ({v!r}): {problem}"
        return None
    return check


def is_hostname(name: str) -> bool:
    name = name.rstrip(".")
    return bool(name) and len(name) <= 253 and all(_HOST_LABEL.match(p) for p in name.split("."))


def is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
        return True
    except ValueError:
        return False


def host(v: str, cfg) -> str | None:
    if is_ip(v) or is_hostname(v):
        return None
    return f"expected an IP address or a host name (no scheme, no port), got {v!r}"


def http_url(v: str, cfg, optional: bool = False) -> str | None:
    if optional and v == "":
        return None
    try:
        p = urlsplit(v)
        port = p.port  # raises on a bad port
    except ValueError as e:
        return f"not a valid URL ({e}): {v!r}"
    if p.scheme not in ("http", "https") or not p.hostname:
        return f"expected an http(s) URL such as http://gpu1:8000/v1, got {v!r}"
    if p.username or p.password:
        return "must not hold credentials (the backend's key goes in api_key)"
    if p.query or p.fragment:
        return f"must not have a query or fragment, got {v!r}"
    if host(p.hostname, cfg) or (port is not None and not 0 < port < 65536):
        return f"bad host or port in {v!r}"
    return None


def redis_url(v: str, cfg) -> str | None:
    if v == "":
        return None
    try:
        p = urlsplit(v)
        port = p.port
    except ValueError as e:
        return f"not a valid URL ({e}): {v!r}"
    if p.scheme in ("redis", "rediss"):
        if not p.hostname or host(p.hostname, cfg):
            return f"no valid host in {v!r}"
        if port is not None and not 0 < port < 65536:
            return f"bad port in {v!r}"
        db = p.path.lstrip("/")
        if db and not db.isdigit():
            return f"the path must be a database number (redis://host:6379/0), got {v!r}"
        return None
    if p.scheme == "unix":
        return None if p.path else f"expected unix:///path/to/redis.sock, got {v!r}"
    return f"expected redis://host:port/db, rediss://... or unix:///path, got {v!r}"


def header_safe(v: str, cfg) -> str | None:
    if _CONTROL.search(v):
        return "must not contain control characters (it is sent in an HTTP header)"
    try:
        v.encode("latin-1")
    except UnicodeEncodeError:
        return "must be Latin-1 text (it is sent in an HTTP header)"
    return None


def backend_name(v: str, cfg) -> str | None:
    if v == "":
        return None
    if len(v) > 64:
        return "at most 64 characters"
    return header_safe(v, cfg) or (None if v.strip() == v else "no leading or trailing spaces")


def tenant_name(v: str, cfg) -> str | None:
    if not v:
        return "required"
    if _CONTROL.search(v) or "{" in v or "}" in v:
        return "no control characters or braces (it is part of Redis keys)"
    return None


def sha256_hex(v: str, cfg, optional: bool = False) -> str | None:
    if optional and v == "":
        return None
    if len(v) == 64 and all(c in "0123456789abcdefABCDEF" for c in v):
        return None
    return "must be a 64-char sha256 hex digest (vlm-gateway hash-key KEY)"


def non_empty_names(values: list, cfg) -> str | None:
    return each(lambda v, c: None if v.strip() else "must not be empty")(values, cfg)


def cidr(v: str, cfg) -> str | None:
    try:
        ipaddress.ip_network(v, strict=False)
        return None
    except ValueError:
        return "expected an address or network such as 10.0.0.0/8 or fd00::/8"


def domain(v: str, cfg) -> str | None:
    bare = v[2:] if v.startswith("*.") else v.lstrip(".")
    return None if is_hostname(bare) else "expected a domain such as example.com or *.example.com (no scheme, no path)"


def allowed_host(v: str, cfg) -> str | None:
    if v == "*":
        return None
    bare = v[2:] if v.startswith("*.") else v
    return None if (is_ip(bare) or is_hostname(bare)) else \
        "expected a host name, *.domain or * (no scheme, no port)"


def allowed_origin(v: str, cfg) -> str | None:
    if v == "*":
        return None
    try:
        p = urlsplit(v)
        p.port
    except ValueError:
        return "not a valid origin"
    if p.scheme not in ("http", "https") or not p.hostname or p.path not in ("",) or p.query or p.fragment:
        return "expected scheme://host[:port] such as https://app.example.com, or *"
    return None


_K8S_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")   # DNS-1035 label (Service, port name)
_K8S_NS = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")     # DNS-1123 label (namespace)


def k8s_name(pattern: "re.Pattern[str]", max_len: int = 63) -> Rule:
    def check(v: str, cfg) -> str | None:
        if v == "" or (len(v) <= max_len and pattern.match(v)):
            return None
        return f"not a valid Kubernetes name (lower-case letters, digits and '-', at most {max_len}), got {v!r}"
    return check


def dns_name(v: str, cfg) -> str | None:
    name = v.rstrip(".")
    if v == "" or is_hostname(name):
        return None
    return f"expected a DNS name, got {v!r}"


def nameserver(v: str, cfg) -> str | None:
    if v.startswith("["):
        hostpart, _, port = v[1:].partition("]")
        port = port[1:] if port.startswith(":") else port
    elif v.count(":") == 1:
        hostpart, _, port = v.partition(":")
    else:
        hostpart, port = v, ""
    if (is_ip(hostpart) or is_hostname(hostpart)) and (not port or (port.isdigit() and 0 < int(port) < 65536)):
        return None
    return f"expected host or host:port, got {v!r}"


def existing_file(what: str) -> Rule:
    def check(v: str, cfg) -> str | None:
        return None if v == "" or os.path.isfile(v) else f"no such file {v!r} ({what})"
    return check


def pid_directory(v: str, cfg) -> str | None:
    """Empty, or a directory that exists or can be made in an existing one."""
    if not v:
        return None
    p = os.path.abspath(v)
    if os.path.isdir(p) or (not os.path.exists(p) and os.path.isdir(os.path.dirname(p))):
        return None
    return f"must be a directory (or one to create in an existing directory), got {v!r}"


def model_dir(v: str, cfg) -> str | None:
    if v == "":
        return None
    if not os.path.isdir(v):
        return f"no such directory: {v!r}"
    missing = [f for f in ("model.safetensors", "tokenizer.json") if not os.path.isfile(os.path.join(v, f))]
    return f"{', '.join(missing)} missing in {v!r}" if missing else None


def level_scales(v: list, cfg) -> str | None:
    """slo.*_scales: one factor per level, each in (0, 1], never growing with the level."""
    if not v:
        return "at least one level"
    if len(v) > 16:
        return f"at most 16 levels, got {len(v)}"
    for i, x in enumerate(v):
        if not 0 < x <= 1:
            return f"item {i} ({x!r}): must be within (0, 1]"
        if i and x > v[i - 1]:
            return f"item {i} ({x!r}): must not be larger than the level before ({v[i - 1]!r})"
    return None


def image_overrides(v: dict, cfg) -> str | None:
    """images.models: {model: {key: value}}, a tenant's images: {key: value}; checked in ``_across``
    against the images rules."""
    return None


RULES: dict[str, Rule] = {
    "server.host": host,
    "server.port": within(1, 65535),
    "server.workers": within(1, 1024),
    "server.pid_dir": pid_directory,
    "server.max_body_bytes": at_least(1),
    "server.keepalive_interval_s": above(0),
    "server.allowed_hosts": each(allowed_host),
    "server.allowed_origins": each(allowed_origin),
    "server.header_timeout_s": above(0),
    "server.max_header_bytes": at_least(1024),
    "server.body_timeout_s": above(0),
    "server.max_connections": lambda v, c: None if v == 0 or v >= 16 else f"must be 0 (automatic) or >= 16, got {v}",
    "server.keep_alive_timeout_s": above(0),
    "server.send_timeout_s": above(0),
    "upstream.connect_timeout_s": above(0),
    "upstream.read_timeout_s": above(0),
    "upstream.total_timeout_s": above(0),
    "upstream.max_connections": at_least(1),
    "upstream.max_response_bytes": at_least(1024),
    "upstream.max_sse_event_bytes": at_least(1024),
    "backends[].url": http_url,
    "backends[].name": backend_name,
    "backends[].api_key": header_safe,
    "backends[].models": non_empty_names,
    "backends[].metrics_url": lambda v, c: http_url(v, c, optional=True),
    "routing.max_retries": within(0, 16),
    "routing.health_interval_s": above(0),
    "routing.scrape_interval_s": above(0),
    "routing.eject_after_failures": at_least(1),
    "routing.eject_base_s": above(0),
    "routing.affinity_max_load": above(0),
    "routing.affinity_min_match": within(0, 1),
    "routing.affinity_ttl_s": above(0),
    "routing.affinity_max_entries": at_least(1),
    "images.max_long_side": at_least(1),
    "images.grid_factor": within(1, 1024),
    "images.min_pixels": at_least(1),
    "images.max_pixels": at_least(1),
    "images.detail_low_long_side": at_least(1),
    "images.detail_high_long_side": at_least(1),
    "images.allow_networks": each(cidr),
    "images.allow_domains": each(domain),
    "images.deny_domains": each(domain),
    "images.fetch_timeout_s": above(0),
    "images.max_fetch_bytes": at_least(1),
    "images.max_source_pixels": at_least(1),
    "images.max_decode_bytes": at_least(0),
    "images.max_decode_bytes_large": at_least(0),
    "images.max_decode_bytes_per_source_byte": at_least(0),
    "images.max_decode_bytes_in_flight": at_least(0),
    "images.trim_tolerance": within(0, 255),
    "images.jpeg_quality": within(1, 100),
    "images.prescale_gap": at_least(1.0),
    "images.text_max_long_side": at_least(1),
    "images.legible_text_px": within(1, 64),
    "images.legible_dense_px": within(1, 64),
    "images.photo_long_side": at_least(0),
    "images.max_queue_wait_ms": at_least(0),
    "images.max_threads_per_image": within(1, 64),
    "images.max_coordinate_groups": at_least(1),
    "images.l1_redis_ttl_s": at_least(1),
    "images.models": image_overrides,
    "cache.ttl_s": at_least(1),
    "cache.max_entry_bytes": at_least(1),
    "cache.semantic_threshold": within(0.95, 1.0),
    "cache.semantic_max_entries_per_partition": at_least(1),
    "cache.redis_timeout_s": above(0),
    "cache.semantic_max_entries": at_least(1),
    "cache.semantic_hnsw_above": at_least(1),
    "cache.semantic_model_dir": model_dir,
    "cache.semantic_max_queue": at_least(1),
    "auth.tenants[].name": tenant_name,
    "auth.tenants[].key_sha256": sha256_hex,
    "auth.tenants[].models": non_empty_names,
    "auth.tenants[].cache_scope": lambda v, c: None if not _CONTROL.search(v) else "no control characters",
    "auth.tenants[].images": image_overrides,
    "auth.admin_key_sha256": lambda v, c: sha256_hex(v, c, optional=True),
    "limits.max_messages": at_least(1),
    "slo.ttft_ms": above(0),
    "slo.window_s": above(0),
    "slo.min_samples": at_least(1),
    "slo.interval_s": above(0),
    "slo.down_at": above(0),
    "slo.early_at": above(0),
    "slo.kv_high": within(0, 1),
    "slo.up_at": above(0),
    "slo.up_hold_s": above(0),
    "slo.up_hold_max_s": above(0),
    "slo.photo_scales": level_scales,
    "slo.text_scales": level_scales,
    "slo.photo_floor_long_side": at_least(1),
    "simulator.time_scale": above(0),
    "simulator.port": within(0, 65535),
    "redis_url": redis_url,
    "discovery[].dns_name": dns_name,
    "discovery[].port": within(0, 65535),
    "discovery[].interval_s": above(0),
    "discovery[].nameservers": each(nameserver),
    "discovery[].service": k8s_name(_K8S_NAME),
    "discovery[].namespace": k8s_name(_K8S_NS),
    "discovery[].port_name": k8s_name(_K8S_NAME, 15),
    "discovery[].kubeconfig": existing_file("a kubeconfig"),
    "discovery[].path": lambda v, c: None if v.startswith("/") else f"must start with /, got {v!r}",
    "discovery[].models": non_empty_names,
    "discovery[].api_key": header_safe,
    "video.fps": above(0),
    "video.min_fps": above(0),
    "video.max_frames": at_least(2),
    "video.max_long_side": lambda v, c: None if v == 0 or v >= 32 else f"must be 0 (the image budget) or >= 32, got {v}",
    "video.crf": within(0, 51),
    "video.dedupe_pixel_delta": within(0, 255),
    "video.dedupe_changed_fraction": lambda v, c: None if 0 <= v < 1 else f"must be within [0, 1), got {v:g}",
    "video.max_duration_s": above(0),
    "video.max_source_frames": above(0),
    "video.max_frame_pixels": above(0),
    "video.max_decoded_pixels": above(0),
    "video.max_decode_s": above(0),
    "video.decode_threads": within(0, 16),
    "video.tokenizer": existing_file("the served model's tokenizer.json"),
    "video.engine_fps": above(0),
    "video.engine_max_frames": above(0),
    "video.engine_max_pixels": above(0),
    "video.engine_min_pixels": above(0),
    "redis_prefix": lambda v, c: None if _prefix_ok(v) else
    "1-64 letters, digits, '_', '.' or '-' (no ':', no glob characters), got " + repr(v),
}

# String/list/map keys where any value of the right type is valid, and why.
FREE: dict[str, str] = {
    "server.log_level": "a Literal: the type check lists the choices",
    "server.log_format": "a Literal",
    "backends[].engine": "a Literal",
    "images.url_mode": "a Literal",
    "images.resample": "a Literal",
    "images.budget": "a Literal",
    "cache.mode": "a Literal",
    "discovery[].kind": "a Literal",
    "discovery[].address_family": "a Literal",
    "discovery[].scheme": "a Literal",
    "discovery[].engine": "a Literal",
    "discovery[].metrics_format": "a Literal",
    "video.plan": "a Literal",
    "slo.percentile": "a Literal",
}

# Keys whose valid values a layer above defines; that layer checks them after ``check``
# (backends/config_names.py, called by ``vlm_gateway.load_config``).
NAMED_ABOVE: dict[str, str] = {
    "routing.policy": "a registered routing policy (backends/router)",
    "backends[].profile": "a GPU profile, shipped or under profiles (backends/profiles.py)",
    "discovery[].profile": "a GPU profile",
    "profiles": "GPU profile entries (backends/profiles.py)",
    "simulator.profile": "a simulator profile (backends/sim/profiles.yaml)",
}


def _prefix_ok(v: str) -> bool:
    return bool(PREFIX_RE.match(v))


# -- walking ------------------------------------------------------------------------------

def leaves(obj: Any, path: str = "") -> typing.Iterator[tuple[str, str, Any]]:
    """(key with indices, key pattern with [], value) of every non-section key."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        key = f"{path}.{f.name}" if path else f.name
        if dataclasses.is_dataclass(value):
            yield from leaves(value, key)
        elif isinstance(value, list) and value and all(dataclasses.is_dataclass(v) for v in value):
            for i, item in enumerate(value):
                yield from leaves(item, f"{key}[{i}]")
        else:
            yield key, re.sub(r"\[\d+\]", "[]", key), value


def check(cfg: GatewayConfig) -> None:
    for key, pattern, value in leaves(cfg):
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{key}: must be a finite number, got {value!r}")
        rule = RULES.get(pattern)
        if rule is not None:
            problem = rule(value, cfg)
            if problem:
                raise ConfigError(f"{key}: {problem}")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
            raise ConfigError(f"{key}: must be >= 0, got {value!r}")
    _across(cfg)


def _images(ic, key: str) -> None:
    """Image budget relations, for the global section and each per-model override."""
    if ic.max_long_side < ic.grid_factor:
        raise ConfigError(f"{key}max_long_side: must be >= {key}grid_factor ({ic.grid_factor}), got {ic.max_long_side}")
    for k in ("detail_low_long_side", "detail_high_long_side", "text_max_long_side", "photo_long_side"):
        if getattr(ic, k) < ic.grid_factor and not (k == "photo_long_side" and ic.photo_long_side == 0):
            raise ConfigError(f"{key}{k}: must be >= {key}grid_factor ({ic.grid_factor}), got {getattr(ic, k)}")
    if ic.max_pixels < ic.min_pixels:
        raise ConfigError(f"{key}max_pixels: must be >= {key}min_pixels ({ic.min_pixels}), got {ic.max_pixels}")


def _image_overrides(cfg: GatewayConfig, over, base: str, extra_keys: tuple[str, ...]) -> None:
    """A mapping of image keys over the global section (images.models.NAME, a tenant's images)."""
    hints = typing.get_type_hints(ImagesConfig)
    if not isinstance(over, dict):
        raise ConfigError(f"{base}: expected a mapping of image keys, got {over!r}")
    values = {}
    for k, v in over.items():
        if k in extra_keys:  # the model's grounding keys: config._validate_model_coordinates
            continue
        if k not in IMAGE_OVERRIDE_KEYS:
            raise ConfigError(f"{base}.{k}: not a per-{'model' if extra_keys else 'tenant'} image key; allowed: "
                              f"{', '.join((*IMAGE_OVERRIDE_KEYS, *extra_keys))}")
        values[k] = _convert(hints[k], v, f"{base}.{k}")
        problem = RULES.get(f"images.{k}", at_least(0))(values[k], cfg) \
            if not isinstance(values[k], (bool, str)) else None
        if problem:
            raise ConfigError(f"{base}.{k}: {problem}")
    _images(dataclasses.replace(cfg.images, **values), f"{base}.")


def _across(cfg: GatewayConfig) -> None:
    _images(cfg.images, "images.")
    for model, over in cfg.images.models.items():
        _image_overrides(cfg, over, f"images.models.{model}", _COORDINATE_KEYS)
    for i, t in enumerate(cfg.auth.tenants):
        if t.images:
            _image_overrides(cfg, t.images, f"auth.tenants[{i}].images", ())
    if cfg.routing.eject_max_s < cfg.routing.eject_base_s:
        raise ConfigError(f"routing.eject_max_s: must be >= routing.eject_base_s ({cfg.routing.eject_base_s:g}), "
                          f"got {cfg.routing.eject_max_s:g}")
    _slo(cfg.slo)
    names: dict[str, int] = {}
    for i, b in enumerate(cfg.backends):
        name = b.name or urlsplit(b.url).netloc
        if name in names:
            raise ConfigError(f"backends[{i}].name: {name!r} is already the name of backends[{names[name]}] "
                              "(names label metrics, logs and admin routes)")
        names[name] = i
    tenants: dict[str, int] = {}
    for i, t in enumerate(cfg.auth.tenants):
        if t.name in tenants:
            raise ConfigError(f"auth.tenants[{i}].name: duplicate tenant name {t.name!r}")
        tenants[t.name] = i
    per_process_limits(cfg)


def _slo(s) -> None:
    """The controller's thresholds must leave a band between stepping up and stepping down."""
    if s.up_at >= s.down_at:
        raise ConfigError(f"slo.up_at: must be < slo.down_at ({s.down_at:g}), got {s.up_at:g}")
    if s.early_at > s.down_at:
        raise ConfigError(f"slo.early_at: must be <= slo.down_at ({s.down_at:g}), got {s.early_at:g}")
    if s.up_hold_max_s < s.up_hold_s:
        raise ConfigError(f"slo.up_hold_max_s: must be >= slo.up_hold_s ({s.up_hold_s:g}), got {s.up_hold_max_s:g}")
    if len(s.text_scales) != len(s.photo_scales):
        raise ConfigError(f"slo.text_scales: one factor per level of slo.photo_scales ({len(s.photo_scales)}), "
                          f"got {len(s.text_scales)}")


def per_process_limits(cfg: GatewayConfig) -> None:
    """Several workers without Redis: each worker would keep its own buckets and slots,
    so every per-tenant limit would be multiplied by the worker count. Refused (rather
    than divided: a client on one keep-alive connection stays on one worker and would
    get only limit/workers)."""
    if cfg.server.workers <= 1 or cfg.redis_url:
        return
    for i, t in enumerate(cfg.auth.tenants):
        for k in ("requests_per_minute", "images_per_minute", "visual_tokens_per_minute", "concurrent_streams"):
            if getattr(t, k):
                raise ConfigError(
                    f"server.workers: {cfg.server.workers} workers without redis_url would each count "
                    f"auth.tenants[{i}].{k} on their own ({cfg.server.workers}x the limit); "
                    "set redis_url to share the limits, or server.workers: 1")
