"""The stage chain: the one explicit list of stages, in order, and what they share.

    STAGES = Auth -> RateLimit -> Limits -> MediaStage (video, audio, embeddings)
             -> ImageRewriter (L1) -> GroundingStage -> ResponseCache (L3)

Each entry is a ``Stage`` class (``core/stage.py``) whose ``from_config(cfg, shared)``
takes its config section and the shared parts and returns the stage, or None when
config switches it off. ``Shared`` holds what several stages use: the process's bound
on media bytes in flight, the one media source policy (fetcher, pool, URL memo) and the
model pools' SLO budget levels (``BudgetLevels``: the backends' controllers, read by the
image stage) and the backends' image caps (``ImageCaps``: the long side every backend
serving a model caps images at, so that the image stage rewrites once, before routing).
The chain runs the hooks of the stages a request subscribed to and, when the request
ends, gives back the media bytes it held.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol, TypeVar

from ..config import GatewayConfig
from ..core.request import ChatRequest
from ..core.stage import Reply, Stage
from .auth import Auth
from .cache.stage import ResponseCache
from .grounding.stage import GroundingStage
from .images.inflight import MediaBudget
from .images.media import MediaStage
from .images.source import MediaSources
from .images.stage import ImageRewriter
from .limits import Limits
from .ratelimit import RateLimit

log = logging.getLogger("vlm_gateway.stages")

STAGES: tuple[type, ...] = (Auth, RateLimit, Limits, MediaStage, ImageRewriter, GroundingStage, ResponseCache)

S = TypeVar("S", bound=Stage)


class BudgetLevels(Protocol):
    def level(self, model: str) -> int:
        """The model pool's SLO budget level now (0: full budgets)."""


class FullBudgets:
    def level(self, model: str) -> int:
        return 0


class ImageCaps(Protocol):
    def image_caps(self, model: str) -> tuple[int, int] | None:
        """The profile (``image_max_long_side``, ``image_max_pixels``) every backend serving
        ``model`` shares (0: no limit), or None when they differ or none is known (the caps
        are applied per backend)."""


class UnknownCaps:
    def image_caps(self, model: str) -> tuple[int, int] | None:
        return None


@dataclass(slots=True)
class Shared:
    """Parts several stages share, one per process."""

    budget: MediaBudget
    sources: MediaSources
    levels: BudgetLevels
    caps: ImageCaps = UnknownCaps()


class Chain:
    def __init__(self, cfg: GatewayConfig, levels: BudgetLevels | None = None, caps: ImageCaps | None = None) -> None:
        budget = MediaBudget(cfg.limits, cfg.images)
        self.shared = Shared(budget, MediaSources(cfg.images, cfg.limits, budget, cfg.server.workers), levels or FullBudgets(),
                             caps or UnknownCaps())
        built = (cls.from_config(cfg, self.shared) for cls in STAGES)
        self.stages: list[Stage] = [s for s in built if s is not None]

    def find(self, cls: type[S]) -> S | None:
        """The installed stage of this class (None when config switched it off)."""
        return next((s for s in self.stages if isinstance(s, cls)), None)

    # -- per request -------------------------------------------------------------------
    async def run(self, req: ChatRequest) -> Reply | None:
        for stage in self.stages:
            reply = await stage(req)
            if reply is not None:
                return reply
        return None

    @staticmethod
    async def before_send(req: ChatRequest, backend) -> None:
        for s in req.hooks:
            await s.before_send(req, backend)

    @staticmethod
    async def complete(req: ChatRequest, completion: dict) -> None:
        """Every subscriber's ``on_complete``: a failing one is logged (the client has its
        answer either way), the others still run."""
        for s in req.hooks:
            try:
                await s.on_complete(req, completion)
            except Exception:
                log.exception("on_complete of %s failed (request %s)", type(s).__name__, req.request_id)

    def pending(self, req: ChatRequest) -> bool:
        """Whether ``finish`` has anything to do for this request."""
        return bool(req.hooks) or req.media_bytes.held > 0

    async def finish(self, req: ChatRequest) -> None:
        """Once when the request ends, however it ends: every subscriber's ``on_finish``
        (a failing one is logged, the others still run), then the media bytes it held."""
        try:
            for s in req.hooks:
                try:
                    await s.on_finish(req)
                except Exception:
                    log.exception("on_finish of %s failed (request %s)", type(s).__name__, req.request_id)
        finally:
            self.shared.budget.release(req)

    # -- per process -------------------------------------------------------------------
    async def start(self) -> None:
        for s in self.stages:
            await s.start()

    async def close(self) -> None:
        for s in reversed(self.stages):
            try:
                await s.close()
            except Exception:  # pragma: no cover - best effort on shutdown
                log.exception("error while closing stage %s", s.name)
        await self.shared.sources.close()

    async def flush(self) -> dict[str, int | None]:
        """``POST /admin/cache/flush``: what each cache forgot, by name."""
        out: dict[str, int | None] = {"MediaSources.flush": self.shared.sources.flush()}
        for s in self.stages:
            out.update(await s.flush())
        return out
