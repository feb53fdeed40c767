"""The image stage of the chain (runs before routing).

For every image part (``image_url``, ``input_image``): resolve the source under
the media policy (``source.MediaSources``: data: URI, safe fetch with its bytes
counted and held, or a checked pass-through URL), hash the bytes actually used,
read the size from the header and refuse what must be refused (400 naming the
part). With ``images.enabled: false`` every policy is "off": nothing is
rewritten, but the sources are still resolved, checked and counted. Then
rewrite for the model's policy right away, so a broken image fails before any
response starts, and subscribe the request for ``before_send``, which
applies the rewrite for the chosen backend (capped by its profile's
``image_max_long_side``, and per image by the long side that keeps it within the
profile's ``image_max_pixels``: the engine would shrink anything larger itself). When
every backend serving the model shares its caps (``ImageCaps``), the first rewrite is
already capped and ``before_send`` only
applies it: one decode per image, not two; with mixed caps a backend whose cap
differs from none costs a second rewrite (at its own L1 key). Pass-through data:
images keep their original string byte for byte.

Each policy carries the model pool's SLO budget level of the moment (``backends/slo.py``,
applied per image by ``pressure.py`` after the budget's own decision);
``x-vlm-gateway-image-budget`` tells per image the decision and the level.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING

from ...core import headers as H
from ... import metrics
from ...config import GatewayConfig, ImagesConfig, SloConfig
from ...core.errors import BadRequest, GatewayError, Unavailable
from ...core.stage import Stage
from ...core.state import Slot
from ...lru import LRU
from ...vision_tokens import send_cap
from ..auth import TENANT
from ..grounding import plan as grounding
from .decode import ImageError, probe
from .encode import ENCODER, data_uri
from .fetch import FetchError, check_address
from .l1 import L1Cache
from .memory import DecodeLimits
from .policy import BELOW_FLOOR, POLICY_HEADER, Policy, parse_header, resolve
from .rewrite import Rewritten, rewrite, tokens
from .source import MediaSources, Source, as_error, content_hash

if TYPE_CHECKING:
    from ...backends.backend import Backend
    from ...core.request import ChatRequest, ImagePart

log = logging.getLogger("vlm_gateway.images")

TOKENS_HEADER = H.VISUAL_TOKENS.name
# per image, what was converted so the engine reads what a viewer shows (docs/IMAGES.md)
CONVERTED_HEADER = H.IMAGE_CONVERTED.name
# per image: the long-side decision (budget.Budget.header; "long_side=original" within the
# pass-through size) and the SLO budget level it was made under, entries joined by ", "
BUDGET_HEADER = H.IMAGE_BUDGET.name
_SMALL = 256 * 1024  # hash/decode bigger payloads in the pool
_VERIFIED_ENTRIES = 16384
OFF = Policy(enabled=False)


@dataclass(slots=True)
class ImagePlan:
    """Per request: each image's source, policy and (result, outcome) for the model's
    policy; ``counted`` once the metrics are counted (the first attempt)."""

    sources: list[Source]
    policies: list[Policy]
    results: list[tuple[Rewritten, str]]
    counted: bool = False


PLAN: Slot[ImagePlan] = Slot("images")


def _bad(part: "ImagePart", e: ImageError | FetchError) -> BadRequest:
    return as_error(part, e)


class ImageRewriter(Stage):
    name = "images"

    def __init__(self, cfg: ImagesConfig, sources: MediaSources, redis_url: str, redis_prefix: str,
                 slo_cfg: SloConfig | None = None, levels=None, caps=None) -> None:
        self.slo_cfg = slo_cfg or SloConfig()
        self.slo = levels  # the model pools' SLO budget levels (None: always full budgets)
        self.caps = caps    # the backends' shared image cap per model (None: capped per backend)
        self.cfg = cfg
        self.sources = sources
        self.pool = self.sources.pool
        self.fetcher = self.sources.fetcher
        self.l1 = L1Cache(cfg.l1_max_bytes, redis_url, cfg.l1_redis_ttl_s, redis_prefix=redis_prefix)
        # content hash|policy of data: images verified within budget (pass through without a new decode)
        self.verified: LRU[str, Rewritten] = LRU(max_entries=_VERIFIED_ENTRIES)

    @classmethod
    def from_config(cls, cfg: GatewayConfig, shared) -> "ImageRewriter":
        # installed even with images.enabled false: sources are still policed (policies "off")
        return cls(cfg.images, shared.sources, cfg.redis_url, cfg.redis_prefix, cfg.slo, shared.levels,
                   shared.caps)

    async def close(self) -> None:
        await self.l1.close()

    async def flush(self) -> dict[str, int | None]:
        return {"L1Cache.flush": await self.l1.flush()}

    # -- sources -------------------------------------------------------------------
    def _info(self, data: bytes):
        return content_hash(data), probe(data, self.cfg.max_source_pixels)

    async def _bytes_info(self, data: bytes):
        if len(data) <= _SMALL:
            return self._info(data)
        return await self.pool.run(self._info, data)

    async def source(self, part: "ImagePart", req: "ChatRequest") -> Source:
        srcs = self.sources
        url = part.url
        try:
            mode = srcs.url_mode(part, url)
            if mode == "data":  # decoded, hashed and probed in one pool job
                data, (h, header) = await srcs.decode_and(req, part, url, self._info)
                return Source("data", url, h, header, len(data), data)
            if mode == "passthrough":
                await check_address(url, self.fetcher.policy, part.kind)
                return Source("url_passthrough", url, "url:" + content_hash(url.encode()), None, 0)
            memo = srcs.memo.get(url)
            got = await srcs.fetch(req, part, url, etag=memo[0] if memo else "")
            if got.data is None and memo is not None:
                # 304: the origin says the body behind this strong ETag is unchanged
                return Source("url", url, memo[1], memo[2], memo[3])
            data = got.data or b""
            h, header = await self._bytes_info(data)
            srcs.memo.put(url, got.etag, h, header, len(data))
            return Source("url", url, h, header, len(data), data)
        except (ImageError, FetchError) as e:
            raise _bad(part, e) from None

    # -- rewriting -----------------------------------------------------------------
    async def rewritten(self, part: "ImagePart", src: Source, policy: Policy,
                        req: "ChatRequest | None" = None) -> tuple[Rewritten, str]:
        """(result, outcome). ``result.url`` None = send the original string."""
        r, outcome = await self._rewritten(part, src, policy, req)
        if (r.budget is not None and not policy.legible and r.budget.reason not in (policy.budget, "pressure")):
            # the fixed rule and a client's own size share cached bytes; the reason is this request's
            r = replace(r, budget=replace(r.budget, reason=policy.budget))
        return r, outcome

    async def _rewritten(self, part: "ImagePart", src: Source, policy: Policy,
                         req: "ChatRequest | None" = None) -> tuple[Rewritten, str]:
        header = src.header
        if src.kind == "url_passthrough":
            return Rewritten(None, b"", "", 0, 0, 0, 0, 0, 0, 0), "url_passthrough"
        assert header is not None
        key = f"{src.hash}|{policy.key}|{ENCODER}"
        verdict = self.verified.get(key) if src.kind == "data" else None
        if verdict is not None:  # verified before: the original string goes
            return replace(verdict, data=src.data or b""), "passthrough"
        hit = await self.l1.get(key)
        if hit is not None:
            if src.kind == "data" and hit.data == src.data:  # a fetched URL's inline copy of these bytes
                return replace(hit, url=None), "passthrough"
            return hit, "l1_hit"
        try:
            if src.data is None:  # revalidated (304) but its rewrite left L1: the body itself
                got = await (self.sources.fetch(req, part, src.url) if req is not None
                             else self.fetcher.get(src.url))
                data = got.data or b""
                h, header = await self._bytes_info(data)
                if h != src.hash:
                    # the URL's content changed since it was identified: never send other
                    # bytes under an identity the caches already used
                    self.sources.memo.forget(src.url)
                    raise Unavailable(f"The image at {part.param} changed while the request was handled; retry",
                                      param=part.param, code="image_changed", headers={"retry-after": "1"})
                src.data = data
            data = src.data
            # within budget too: verified (and converted where engines would read it wrong) off the loop
            r = await self.pool.run(partial(rewrite, limits=self._limits(part)), data, header, policy,
                                    self.cfg.max_source_pixels)
            if r.passthrough and src.kind == "url":  # URL within budget: its bytes, unchanged, inline
                r = replace(r, url=data_uri(data, r.mime))
                outcome = "passthrough"
            elif r.passthrough:  # the original string is sent; remember only the verdict
                self.verified.put(key, replace(r, data=b""))
                return r, "passthrough"
            else:
                metrics.REWRITE_SECONDS.observe(r.seconds)
                same_size = (r.width, r.height) in ((r.source_width, r.source_height), (r.source_height, r.source_width))
                outcome = "converted" if same_size and not r.trimmed else "rewritten"
        except (ImageError, FetchError) as e:
            raise _bad(part, e) from None
        await self.l1.put(key, r)
        return r, outcome

    def _limits(self, part: "ImagePart") -> DecodeLimits:
        """The memory a rewrite of ``part`` may hold: images.max_decode_bytes per image (more
        for a file that backs it), and the process's decode bound while it runs (503 past it,
        naming the part)."""
        budget = self.sources.budget
        c = self.cfg
        return DecodeLimits(c.max_decode_bytes, lambda n: budget.decoding(n, part.param), budget.decoded,
                            c.max_decode_bytes_large, c.max_decode_bytes_per_source_byte)

    # -- the stage -----------------------------------------------------------------
    async def __call__(self, req: "ChatRequest"):
        if not req.images:
            return None
        policy_header = parse_header(req.headers.get(POLICY_HEADER))
        tenant = req.state.get(TENANT)
        tenant_images = getattr(tenant, "images", None) or None
        policies = [resolve(self.cfg, req.model, policy_header, part.detail, tenant_images) if self.cfg.enabled
                    else OFF for part in req.images]
        level = self.slo.level(req.model) if self.slo is not None else 0
        if level:
            opted = policy_header == BELOW_FLOOR or bool(getattr(tenant, "images_below_floor", False))
            policies = [pol.under(level, self.slo_cfg, opted or part.detail == "low")
                        for pol, part in zip(policies, req.images)]
        sources = await _gather([self.source(p, req) for p in req.images])
        policies = grounding.gate_trim(self.cfg, req, sources, policies)  # no crop unless answers map back
        caps = self.caps.image_caps(req.model) if self.caps is not None else None
        if caps is not None:  # every backend for this model caps alike: rewrite once, already capped
            policies = [_capped(pol, src, *caps) for pol, src in zip(policies, sources)]
        for part, src, pol in zip(req.images, sources, policies):
            part.content_hash = src.hash
            part.source_bytes = src.size
            if src.header is not None:
                part.width, part.height = src.header.width, src.header.height
                part.tokens_before = tokens(src.header.width, src.header.height, pol)
        # rewrite now for the model's policy: errors surface before routing and the
        # before_send hook usually only applies these results
        done = await _gather([self.rewritten(p, s, pol, req) for p, s, pol in zip(req.images, sources, policies)])
        plan = ImagePlan(sources, policies, done)
        req.state[PLAN] = plan
        self._apply(req, [(pol, r) for pol, (r, _) in zip(policies, done)])
        req.subscribe(self)
        return None

    async def before_send(self, req: "ChatRequest", backend: "Backend") -> None:
        plan = req.state[PLAN]
        chosen = []
        outcomes = []
        for part, src, pol, (r, outcome) in zip(req.images, plan.sources, plan.policies, plan.results):
            eff = self.for_backend(pol, src, backend)
            if eff != pol:
                r, outcome = await self.rewritten(part, src, eff, req)
            chosen.append((eff, r))
            outcomes.append(outcome)
        self._apply(req, chosen)
        if not plan.counted:
            plan.counted = True
            self._count(req, [r for _, r in chosen], outcomes)

    @staticmethod
    def for_backend(pol: Policy, src: Source, backend: "Backend") -> Policy:
        """``pol`` under ``backend``'s profile caps: what ``before_send`` sends it (and what
        the /ui preview shows)."""
        return _capped(pol, src, backend.image_cap, backend.image_pixels)

    def _apply(self, req: "ChatRequest", chosen: list[tuple[Policy, Rewritten]]) -> None:
        plan = req.state[PLAN]
        before = after = 0
        for part, src, (_, r) in zip(req.images, plan.sources, chosen):
            part.set_url(src.url if r.url is None else r.url)
            part.tokens_after = r.tokens_after if src.header is not None else 0
            part.sent_width, part.sent_height = (r.width, r.height) if src.header is not None else (0, 0)
            before += part.tokens_before
            after += part.tokens_after
        req.response_headers[TOKENS_HEADER] = f"before={before};after={after}"
        notes = [f"{p.param}={','.join(r.conversions)}" for p, (_, r) in zip(req.images, chosen) if r.conversions]
        if notes:
            req.response_headers[CONVERTED_HEADER] = "; ".join(notes)
        else:
            req.response_headers.pop(CONVERTED_HEADER, None)
        budgets = []
        for p, (pol, r) in zip(req.images, chosen):
            p.degraded = r.budget is not None and r.budget.reason == "pressure"
            entry = r.budget.header(p.param) if r.budget is not None else f"{p.param};long_side=original"
            budgets.append(f"{entry};level={pol.level}")
        req.response_headers[BUDGET_HEADER] = ", ".join(budgets)
        grounding.record(req, [r for _, r in chosen], plan.sources)

    def _count(self, req: "ChatRequest", results: list[Rewritten], outcomes: list[str]) -> None:
        before = sum(p.tokens_before for p in req.images)
        after = sum(p.tokens_after for p in req.images)
        model = req.model
        metrics.VISUAL_TOKENS.labels(model, "before").inc(before)
        metrics.VISUAL_TOKENS.labels(model, "after").inc(after)
        metrics.VISUAL_TOKENS_SAVED.labels(model).inc(max(0, before - after))
        for part, r, outcome in zip(req.images, results, outcomes):
            metrics.IMAGES.labels(outcome).inc()
            if r.budget is not None:
                metrics.IMAGE_BUDGETS.labels(r.budget.cls, r.budget.reason).inc()
            if part.degraded:
                metrics.IMAGES_DEGRADED.labels(r.budget.cls if r.budget is not None else "unmeasured").inc()
            metrics.IMAGE_BYTES.labels("in").inc(part.source_bytes)
            metrics.IMAGE_BYTES.labels("out").inc(len(r.data) if r.url is not None else part.source_bytes)


def _capped(pol: Policy, src: Source, long_cap: int, pixels: int) -> Policy:
    """``pol`` under a backend's limits (``vision_tokens.send_cap``; an image of unknown
    size gets the long-side cap only)."""
    if src.header is None:
        return pol.capped(long_cap or None)
    return pol.capped(send_cap(src.header.width, src.header.height, long_cap, pixels, pol.grid_factor,
                               pol.min_pixels) or None)


async def _gather(coros):
    """Run concurrently; on failure raise the error of the first failing part (in order)."""
    if len(coros) == 1:
        return [await coros[0]]
    results = await asyncio.gather(*coros, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


__all__ = ["ImageRewriter", "ImagePlan", "PLAN", "GatewayError"]
