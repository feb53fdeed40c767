"""GPU profiles: what one engine on one GPU can take.

The shipped table lives in ``profiles.yaml`` next to this module; the gateway
config's ``profiles:`` section adds entries or overrides fields of shipped ones
(an entry may say ``base: NAME`` to start from another profile). The router reads
a profile to filter (images, pixels, context) and to normalise load
(``max_num_seqs``); ``vlm-gateway launch`` turns it into the engine command line.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import yaml

from ..config import ConfigError

# key -> (type, default). Types are checked so a typo in YAML fails at start-up.
FIELDS: dict[str, tuple[type, Any]] = {
    "engine": (str, "vllm"),
    "gpu": (str, ""),
    "max_num_seqs": (int, 0),
    "max_model_len": (int, 0),
    "image_max_long_side": (int, 0),
    "image_max_pixels": (int, 0),
    "max_images_per_prompt": (int, 0),
    "quantization": (str, ""),
    "dtype": (str, "auto"),
    "gpu_memory_utilization": (float, 0.9),
    "cpu_offload_gb": (float, 0.0),
    "enable_prefix_caching": (bool, True),
    "max_num_batched_tokens": (int, 0),
    "engine_flags": (list, []),
    "max_videos_per_prompt": (int, 1),
    "video_max_pixels": (int, 0),
}
ENGINES = ("vllm", "trtllm")
_PATH = os.path.join(os.path.dirname(__file__), "profiles.yaml")


@functools.lru_cache(maxsize=1)
def _shipped_raw() -> dict[str, dict[str, Any]]:
    with open(_PATH, encoding="utf-8") as f:
        return yaml.safe_load(f) or {}


def _check(name: str, entry: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in entry.items():
        if key == "base":
            continue
        if key not in FIELDS:
            raise ConfigError(f"profiles.{name}.{key}: unknown key; known: {', '.join(FIELDS)}")
        tp = FIELDS[key][0]
        if tp is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if tp is str and value is None:
            value = ""
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            raise ConfigError(f"profiles.{name}.{key}: expected {tp.__name__}, got {value!r}")
        if tp is list:
            value = [str(v) for v in value]
        out[key] = value
    if "engine" in out and out["engine"] not in ENGINES:
        raise ConfigError(f"profiles.{name}.engine: expected one of {', '.join(ENGINES)}, got {out['engine']!r}")
    return out


def _resolve(name: str, raw: dict[str, dict[str, Any]], seen: tuple[str, ...] = ()) -> dict[str, Any]:
    if name in seen:
        raise ConfigError(f"profiles.{name}.base: circular ({' -> '.join(seen + (name,))})")
    entry = raw.get(name)
    if not isinstance(entry, dict):
        raise ConfigError(f"profiles.{name}: expected a mapping, got {entry!r}")
    base = entry.get("base")
    resolved = {k: (list(v) if isinstance(v, list) else v) for k, (_, v) in FIELDS.items()}
    if base:
        if base not in raw:
            raise ConfigError(f"profiles.{name}.base: unknown profile {base!r}")
        resolved.update(_resolve(base, raw, seen + (name,)))
    resolved.update(_check(name, entry))
    resolved["name"] = name
    return resolved


def load_profiles(extra: dict[str, dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """Shipped profiles merged with ``extra`` (config ``profiles:``), fully resolved.

    An ``extra`` entry with the name of a shipped profile and no ``base`` overrides
    only the fields it names.
    """
    raw = {k: dict(v) for k, v in _shipped_raw().items()}
    for name, entry in (extra or {}).items():
        if not isinstance(entry, dict):
            raise ConfigError(f"profiles.{name}: expected a mapping, got {entry!r}")
        if name in raw and "base" not in entry:
            raw[name] = {**raw[name], **entry}
        else:
            raw[name] = dict(entry)
    return {name: _resolve(name, raw) for name in raw}


def get_profile(name: str, extra: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    profiles = load_profiles(extra)
    if name not in profiles:
        raise KeyError(f"unknown GPU profile {name!r}; known: {', '.join(sorted(profiles))}")
    return profiles[name]
