"""Generate docs/CONFIG.md from the configuration model (``vlm_gateway/config.py``), and the
references of ``docgen_refs.py`` (docs/HEADERS.md, docs/METRICS.md).

    python -m vlm_gateway.docgen            # rewrite them
    python -m vlm_gateway.docgen --check    # exit 1 if one is out of date

Every key of every section is listed with its type, default, environment
variable and the comment written above it in config.py, so the reference cannot
drift from the code (a test runs ``--check``).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
import typing
from pathlib import Path
from typing import Any, Literal

from .config import ENV_PREFIX, GatewayConfig

DOC_PATH = Path(__file__).resolve().parent.parent / "docs" / "CONFIG.md"
_FIELD = re.compile(r"^\s+(\w+)\s*:\s*[^=]+(=|$)")

# Descriptions for keys that have no comment above them in config.py (a comment
# there wins). Keys that are not in the model are ignored, so this never drifts
# into documenting something that does not exist.
NOTES: dict[str, str] = {
    "server.host": "Address to bind; anything but loopback without API keys logs a warning.",
    "server.port": "TCP port.",
    "server.workers": "Worker processes, each with a listening socket of its own (SO_REUSEPORT: the kernel spreads connections evenly) under a supervisor that starts a dead one again; metrics switch to multi-process mode above 1.",
    "server.log_level": "Level of the gateway's log (request lines are info).",
    "server.log_format": "`json` writes one JSON object per line (for log shippers).",
    "upstream.connect_timeout_s": "TCP connect timeout to a backend; a timeout is retried on another backend.",
    "backends[].url": "Base URL of the OpenAI-compatible engine (with or without `/v1`).",
    "backends[].name": "Label in metrics, logs and the `x-vlm-gateway-backend` header; default host:port.",
    "backends[].api_key": "Sent upstream as `Authorization: Bearer`.",
    "backends[].engine": "Engine kind: picks the default load endpoints (docs/TRTLLM.md for trtllm).",
    "routing.policy": "Ranking policy among the backends that can serve a request.",
    "routing.health_interval_s": "Interval of the active `/health` probe of each backend.",
    "routing.scrape_interval_s": "Interval of the engine load scrape (running, waiting, KV use), per backend.",
    "routing.eject_base_s": "First ejection length; doubles on each further ejection.",
    "routing.eject_max_s": "Longest ejection.",
    "routing.max_queue": "Requests allowed to wait for a slot; beyond this they get 429 at once.",
    "routing.affinity_ttl_s": "How long a prefix -> backend affinity is remembered.",
    "routing.affinity_max_entries": "Affinity entries kept (LRU).",
    "images.enabled": "Rewrite `image_url` parts (off: images are forwarded untouched).",
    "images.max_long_side": "Image budget: the long side (px) images are downscaled to, snapped to the token grid (budget: fixed); with the legible budget the floor, and at or below it images pass through.",
    "images.min_pixels": "The model's min_pixels (Qwen-VL processor); smaller images are upscaled by the model anyway.",
    "images.max_pixels": "The model's max_pixels (Qwen-VL processor).",
    "images.detail_low_long_side": "Budget for `image_url.detail: low`.",
    "images.detail_high_long_side": "Budget for `image_url.detail: high`.",
    "images.url_mode": "http(s) image URLs: fetch them safely, pass them through to the engine, or refuse them.",
    "images.allow_private_networks": "Allow fetching from private/loopback addresses (internal image stores).",
    "images.allow_domains": "When non-empty, only these domains (and their subdomains) are fetched.",
    "images.deny_domains": "Domains never fetched.",
    "images.fetch_timeout_s": "Whole fetch of one image URL.",
    "images.max_fetch_bytes": "Byte cap of one fetched image, enforced while streaming.",
    "images.max_redirects": "Redirects followed per fetch (each target re-checked).",
    "images.max_source_pixels": "Decompression-bomb guard: checked on the declared size, again on the size the decoder really opens (every format, every GIF frame's canvas), and Pillow's own bomb check never below it (docs/IMAGES.md).",
    "images.trim_borders": "Trim uniform borders before resizing.",
    "images.trim_tolerance": "Colour distance still counted as the border colour.",
    "images.jpeg_quality": "Quality of re-encoded JPEGs.",
    "images.l1_redis_ttl_s": "TTL of rewritten images in Redis (when `redis_url` is set).",
    "images.max_queue": "Rewrite jobs allowed to wait for the pool.",
    "images.prescale_gap": "The cheap pre-shrink stops at this multiple of the target size; the final resample does the rest.",
    "cache.enabled": "L3 response cache on/off.",
    "cache.ttl_s": "Lifetime of a cached answer.",
    "cache.max_bytes": "In-process cache size bound.",
    "cache.max_entry_bytes": "Answers larger than this are not cached.",
    "cache.normalized": "Also match after normalising whitespace/case of the text.",
    "cache.semantic": "Semantic (embedding) cache level on/off.",
    "cache.semantic_threshold": "Cosine similarity needed for a semantic hit (0.95-1.0).",
    "cache.semantic_max_entries_per_partition": "Semantic index entries per (tenant, model, image) partition.",
    "cache.redis_timeout_s": "A slower Redis lookup counts as a miss (the request is not held up).",
    "auth.admin_key_sha256": "sha256 hex of the admin key guarding operational endpoints and /ui.",
    "auth.tenants[].name": "Tenant name (metrics/logs show a hash of it).",
    "auth.tenants[].models": "Models this tenant may use; empty = all.",
    "auth.tenants[].requests_per_minute": "0 = unlimited.",
    "auth.tenants[].concurrent_streams": "0 = unlimited.",
    "auth.tenants[].images_per_minute": "0 = unlimited.",
    "auth.tenants[].visual_tokens_per_minute": "0 = unlimited.",
    "auth.tenants[].max_tokens_cap": "Clamp `max_tokens` for this tenant; 0 = no clamp.",
    "limits.max_messages": "Messages per request.",
    "limits.max_images_per_request": "`image_url` parts per request.",
    "limits.max_total_image_bytes": "Sum of decoded image bytes per request.",
    "limits.max_tokens_cap": "Clamp `max_tokens` for everyone; 0 = no clamp.",
    "simulator.profile": "Timing profile of the built-in simulator.",
    "simulator.time_scale": "Multiply the simulator's timings (0.1 = ten times faster).",
}


def field_comments(cls: type) -> dict[str, str]:
    """Comment lines directly above each field of a dataclass, by field name."""
    out: dict[str, str] = {}
    pending: list[str] = []
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return out
    for line in lines[1:]:
        s = line.strip()
        if s.startswith("#"):
            pending.append(s.lstrip("#").strip())
            continue
        m = _FIELD.match(line)
        if m and not s.startswith(("def ", "@")):
            if pending:
                out[m.group(1)] = " ".join(pending)
        pending = []
    doc = inspect.getdoc(cls)
    if doc and not doc.startswith(cls.__name__ + "("):
        out["__doc__"] = doc
    return out


def type_name(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin is list:
        return f"list of {type_name(args[0])}"
    if origin is dict:
        return f"map of {type_name(args[0])} to {type_name(args[1])}"
    if origin in (typing.Union,) or type(tp).__name__ == "UnionType":
        return " or ".join(type_name(a) for a in args)
    if tp is Any:
        return "any"
    if dataclasses.is_dataclass(tp):
        return "section"
    return getattr(tp, "__name__", str(tp))


def default_text(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
    else:
        return "(required)"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, str):
        return f'`"{value}"`' if value else '`""` (empty)'
    if isinstance(value, (list, dict)) and not value:
        return "`[]`" if isinstance(value, list) else "`{}`"
    if isinstance(value, int) and value >= 1024 * 1024 and value % (1024 * 1024) == 0:
        return f"`{value}` ({value // (1024 * 1024)} MiB)"
    return f"`{value}`"


def _rows(cls: type, prefix: str, env_prefix: str | None) -> list[str]:
    hints = typing.get_type_hints(cls)
    comments = field_comments(cls)
    rows = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            continue  # its own section
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin is list and args and dataclasses.is_dataclass(args[0]):
            continue  # a list of sections, documented as its own table
        env = f"`{env_prefix}{f.name.upper()}`" if env_prefix else "–"
        desc = (comments.get(f.name) or NOTES.get(key, "")).replace("|", "\\|")
        rows.append(f"| `{key}` | {type_name(tp)} | {default_text(f)} | {env} | {desc} |")
    return rows


def _table(title: str, cls: type, prefix: str, env_prefix: str | None, intro: str = "") -> list[str]:
    out = [f"## `{title}`", ""]
    doc = field_comments(cls).get("__doc__")
    if doc:
        out += [doc, ""]
    if intro:
        out += [intro, ""]
    out += ["| Key | Type | Default | Environment | Description |", "|---|---|---|---|---|"]
    out += _rows(cls, prefix, env_prefix)
    return out + [""]


def render() -> str:
    hints = typing.get_type_hints(GatewayConfig)
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by `python -m vlm_gateway.docgen` from vlm_gateway/config.py; do not edit by hand. -->",
        "",
        "The gateway reads one YAML file (`vlm-gateway serve --config FILE` or `VLM_GATEWAY_CONFIG=FILE`).",
        "Every key has a default, so an empty file (or none) is valid. Environment variables",
        f"`{ENV_PREFIX}<SECTION>__<KEY>` override the file (values parsed as YAML scalars, e.g.",
        f"`{ENV_PREFIX}SERVER__PORT=9000`, `{ENV_PREFIX}IMAGES__ALLOW_DOMAINS='[cdn.example.com]'`).",
        "Unknown keys and wrong types are refused at start-up with the key's name (exit status 2).",
        "",
    ]
    top_scalars = []
    for f in dataclasses.fields(GatewayConfig):
        tp = hints[f.name]
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if dataclasses.is_dataclass(tp):
            lines += _table(f.name, tp, f"{f.name}.", f"{ENV_PREFIX}{f.name.upper()}__")
        elif origin is list and args and dataclasses.is_dataclass(args[0]):
            lines += _table(f"{f.name}[]", args[0], f"{f.name}[].", None,
                            intro=f"`{f.name}` is a list; each entry has these keys (set it in the file, "
                                  f"not through the environment).")
        else:
            top_scalars.append(f)
    # lists of sections nested inside sections (e.g. auth.tenants)
    for f in dataclasses.fields(GatewayConfig):
        tp = hints[f.name]
        if not dataclasses.is_dataclass(tp):
            continue
        sub_hints = typing.get_type_hints(tp)
        for sf in dataclasses.fields(tp):
            st = sub_hints[sf.name]
            o, a = typing.get_origin(st), typing.get_args(st)
            if o is list and a and dataclasses.is_dataclass(a[0]):
                lines += _table(f"{f.name}.{sf.name}[]", a[0], f"{f.name}.{sf.name}[].", None,
                                intro=f"`{f.name}.{sf.name}` is a list; each entry has these keys.")
    if top_scalars:
        comments = field_comments(GatewayConfig)
        lines += ["## Top-level keys", "", "| Key | Type | Default | Environment | Description |",
                  "|---|---|---|---|---|"]
        for f in top_scalars:
            desc = comments.get(f.name, "").replace("|", "\\|")
            lines.append(f"| `{f.name}` | {type_name(hints[f.name])} | {default_text(f)} | "
                         f"`{ENV_PREFIX}{f.name.upper()}` | {desc} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    from .docgen_refs import RENDERERS
    p = argparse.ArgumentParser(prog="python -m vlm_gateway.docgen", description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="fail if a committed file differs")
    p.add_argument("--output", default=str(DOC_PATH), help="where CONFIG.md goes")
    args = p.parse_args(argv)
    # CONFIG.md, then the references of docgen_refs.py (HEADERS.md, METRICS.md)
    docs = [(Path(args.output), render)] + [(path, fn) for path, fn in RENDERERS.items()]
    stale = []
    for path, fn in docs:
        text = fn()
        if args.check:
            if (path.read_text(encoding="utf-8") if path.exists() else "") != text:
                stale.append(path)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    for path in stale:
        print(f"{path} is out of date: run `python -m vlm_gateway.docgen`", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
