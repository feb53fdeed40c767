"""Simulator profiles, read from profiles.yaml (shipped with the package)."""

from __future__ import annotations

import os
from dataclasses import replace
from functools import lru_cache

import yaml

from .engine import SimProfile

PROFILES_PATH = os.path.join(os.path.dirname(__file__), "profiles.yaml")
# engine-step constants a profile's `speed` divides
GPU_KEYS = ("step_base_s", "step_seq_s", "kv_read_s_per_ktok", "prefill_s_per_ktok", "vit_s_per_ktok",
            "vit_quad_s_per_ktok2")


def _resolve(raw: dict, name: str, seen: tuple = ()) -> dict:
    if name in seen:
        raise ValueError(f"simulator profile {name!r}: base cycle {' -> '.join(seen + (name,))}")
    entry = dict(raw[name])
    base = entry.pop("base", None)
    speed = float(entry.pop("speed", 1.0))
    merged = {**(_resolve(raw, base, seen + (name,)) if base else {}), **entry}
    if speed != 1.0:
        for k in GPU_KEYS:
            if k in merged and k not in entry:
                merged[k] = merged[k] / speed
    return merged


@lru_cache(maxsize=1)
def load_profiles(path: str = PROFILES_PATH) -> dict[str, SimProfile]:
    with open(path) as f:
        raw = yaml.safe_load(f) or {}
    return {name: SimProfile.from_dict(name, _resolve(raw, name)) for name in raw}


def profile_names() -> list[str]:
    return sorted(load_profiles())


def get_profile(name: str, time_scale: float = 1.0, decode_tokens_per_s: float | None = None,
                max_num_seqs: int | None = None) -> SimProfile:
    """A copy of profile ``name`` (KeyError if unknown) at ``time_scale``; a
    ``decode_tokens_per_s`` sets the single-sequence decode rate, ``max_num_seqs``
    the concurrent sequences."""
    profiles = load_profiles()
    if name not in profiles:
        raise KeyError(f"unknown simulator profile {name!r}; known: {', '.join(sorted(profiles))}")
    if time_scale <= 0:
        raise ValueError("time_scale must be positive")
    p = replace(profiles[name], time_scale=time_scale, name=name)
    if decode_tokens_per_s:
        p = replace(p, decode_tokens_per_s=decode_tokens_per_s)   # __post_init__ sets step_base_s
    if max_num_seqs:
        p = replace(p, max_num_seqs=max_num_seqs)
    return p
