"""An engine's load as one scrape saw it (vLLM production-stack's ``EngineStats``).

``scrape.py`` reads the figures an engine reports (Prometheus text or trtllm-serve's
iteration statistics); the pool keeps the latest as ``Backend.stats``:

    running, waiting     sequences computing / queued in the engine
    kv_usage             KV-cache fraction in use, 0..1
    prefix_hits/queries  prompt tokens served from the prefix cache / prompt tokens
    inflight_at_scrape   the gateway's own in-flight count at the scrape (requests sent or
                         finished after it shift the figure: router/least_loaded.py)
    at                   monotonic time of the scrape

A figure the engine does not report is None.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

FIGURES = ("running", "waiting", "kv_usage", "prefix_hits", "prefix_queries")


@dataclass(frozen=True, slots=True)
class EngineStats:
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    prefix_hits: float | None = None
    prefix_queries: float | None = None
    inflight_at_scrape: float = 0.0
    at: float = 0.0

    @classmethod
    def from_figures(cls, figures: dict[str, float], inflight: int, at: float) -> "EngineStats":
        return cls(**{k: float(figures[k]) for k in FIGURES if k in figures},
                   inflight_at_scrape=float(inflight), at=at)

    def figures(self) -> dict[str, float]:
        """The reported figures and the in-flight count at the scrape (``/ui``)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "at"}
        return {k: v for k, v in out.items() if v is not None}
