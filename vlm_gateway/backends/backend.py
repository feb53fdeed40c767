"""One upstream engine: its address, profile, pooled HTTP client and live state."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from ..config import BackendConfig, UpstreamConfig
from ..core.state import Slot
from .breaker import CircuitBreaker
from .scrape import ScrapeState, sources_for
from .stats import EngineStats
from .transport import TransportFactory


@dataclass(eq=False)
class Backend:
    name: str
    base_url: str  # ends with /v1
    engine: str = "openai"
    api_key: str = ""
    models: set[str] = field(default_factory=set)
    models_configured: bool = False
    profile: dict[str, Any] = field(default_factory=dict)
    metrics_url: str = ""
    # live state
    healthy: bool = True
    inflight: int = 0
    # passive ejection after consecutive failures (configured by the pool)
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)
    # Set by an operator (POST /admin/backends/{name}/drain): no new requests, in-flight ones finish.
    drained: bool = False
    # Set by discovery when the backend left its source: no new requests, removed once idle.
    departing: bool = False
    # the engine's load at the latest scrape (None before the first)
    stats: EngineStats | None = None
    # the HTTP client towards the engine (transport.py: aiohttp, or a scripted one in tests)
    session: Any = None
    # where the engine's load is read: candidate endpoints and formats (scrape.py)
    scrape_state: ScrapeState = field(default_factory=ScrapeState)
    # The simulator's timing profile, read from its /sim/config (engine "sim" only).
    sim_profile: str = ""

    @classmethod
    def from_config(cls, cfg: BackendConfig, index: int, profile: dict[str, Any] | None = None) -> "Backend":
        url = cfg.url.rstrip("/")
        if not url.endswith("/v1"):
            url += "/v1"
        parts = urlsplit(url)
        origin = f"{parts.scheme}://{parts.netloc}"
        sources = sources_for(cfg.engine, origin, cfg.metrics_url, cfg.metrics_format)
        return cls(name=cfg.name or f"{parts.netloc}", base_url=url, engine=cfg.engine, api_key=cfg.api_key,
                   models=set(cfg.models), models_configured=bool(cfg.models), profile=dict(profile or {}),
                   metrics_url=sources[0].url if sources else "", scrape_state=ScrapeState(sources))

    @property
    def origin(self) -> str:
        p = urlsplit(self.base_url)
        return f"{p.scheme}://{p.netloc}"

    @property
    def capacity(self) -> int:
        """Concurrent sequences the profile admits (0 = unbounded)."""
        return int(self.profile.get("max_num_seqs") or 0)

    @property
    def image_cap(self) -> int:
        """The profile's hard limit on an image's long side (0 = none)."""
        cap = self.profile.get("image_max_long_side")
        return int(cap) if isinstance(cap, (int, float)) and cap > 0 else 0

    @property
    def image_pixels(self) -> int:
        """The profile's pixel budget of one image (the engine's ``max_pixels``; 0 = none)."""
        px = self.profile.get("image_max_pixels")
        return int(px) if isinstance(px, (int, float)) and px > 0 else 0

    @property
    def available(self) -> bool:
        return self.healthy and not self.drained and not self.departing and self.breaker.is_available()

    @property
    def engine_load(self) -> dict[str, float]:
        """The latest scraped figures as a mapping ({} before the first scrape)."""
        return self.stats.figures() if self.stats is not None else {}

    @property
    def scraped_at(self) -> float:
        return self.stats.at if self.stats is not None else 0.0

    @property
    def ejected_until(self) -> float:
        """The breaker's clock time before which no request goes here (0: closed)."""
        return self.breaker.open_until

    async def start(self, cfg: UpstreamConfig, transport: "TransportFactory | None" = None) -> None:
        if transport is not None:
            self.session = transport(self, cfg)
            return
        connector = aiohttp.TCPConnector(limit=cfg.max_connections, limit_per_host=cfg.max_connections,
                                         ttl_dns_cache=60, keepalive_timeout=60, enable_cleanup_closed=True)
        headers = {"authorization": f"Bearer {self.api_key}"} if self.api_key else None
        self.session = aiohttp.ClientSession(connector=connector, headers=headers, auto_decompress=False,
                                             skip_auto_headers=("User-Agent",), raise_for_status=False)

    async def close(self) -> None:
        self.scrape_state.cancel_pending()
        if self.session is not None:
            await self.session.close()
            self.session = None

    def __repr__(self) -> str:
        return f"Backend({self.name})"


# the backend a request was last sent to (set by the relay for each attempt)
CHOSEN: Slot[Backend] = Slot("backend")
