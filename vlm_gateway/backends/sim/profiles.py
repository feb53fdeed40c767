"""Simulator timing profiles (minimal set; see profiles.yaml)."""

from __future__ import annotations

from dataclasses import replace

from .engine import SimProfile

PROFILES = {
    "h200-qwen3vl-2b": SimProfile(name="h200-qwen3vl-2b", max_num_seqs=256, ttft_base_s=0.03,
                                  prefill_tokens_per_s=12000.0, decode_tokens_per_s=250.0),
    "fast": SimProfile(name="fast", max_num_seqs=1024, ttft_base_s=0.0, prefill_tokens_per_s=1e12,
                       decode_tokens_per_s=1e6),
}


def get_profile(name: str, time_scale: float = 1.0, decode_tokens_per_s: float | None = None) -> SimProfile:
    if name not in PROFILES:
        raise KeyError(f"unknown simulator profile {name!r}; known: {', '.join(sorted(PROFILES))}")
    p = replace(PROFILES[name], time_scale=time_scale)
    if decode_tokens_per_s:
        p = replace(p, decode_tokens_per_s=decode_tokens_per_s)
    return p
