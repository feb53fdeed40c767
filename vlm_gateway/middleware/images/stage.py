"""The image stage of the chain (runs before routing).

For every ``image_url`` part: resolve the source (data: URI or safe fetch), hash
it, read its size from the header and refuse what must be refused (400 naming
the part). Then rewrite for the model's policy right away, so a broken image
fails before any response starts, and register a ``before_send`` hook that
applies the rewrite for the chosen backend (capped by its profile's
``image_max_long_side``; L1 makes a second rewrite cheap). Pass-through data:
images keep their original string byte for byte.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from ... import metrics
from ...proxy.errors import BadRequest, GatewayError
from .decode import MIME, ImageError, probe
from .encode import data_uri
from .fetch import Fetcher, FetchError, FetchPolicy
from .l1 import L1Cache
from .policy import POLICY_HEADER, Policy, parse_header, resolve
from .pool import BoundedPool
from .rewrite import Rewritten, needs_rewrite, rewrite, tokens
from .source import Source, UrlMemo, content_hash, decode_data_uri

if TYPE_CHECKING:
    from ...backends.backend import Backend
    from ...proxy.gateway import Gateway
    from ...proxy.request import ChatRequest, ImagePart

log = logging.getLogger("vlm_gateway.images")

TOKENS_HEADER = "x-vlm-gateway-visual-tokens"
_SMALL = 256 * 1024  # hash/decode bigger payloads in the pool


def _bad(part: "ImagePart", e: ImageError | FetchError) -> BadRequest:
    return BadRequest(f"Invalid image at {part.param}: {e}", param=part.param, code=e.code)


class ImageRewriter:
    def __init__(self, gw: "Gateway") -> None:
        cfg = gw.cfg.images
        self.cfg = cfg
        self.pool = BoundedPool(cfg.pool_workers, cfg.max_queue)
        self.l1 = L1Cache(cfg.l1_max_bytes, gw.cfg.redis_url, cfg.l1_redis_ttl_s, redis_prefix=gw.cfg.redis_prefix)
        self.fetcher = Fetcher(FetchPolicy(cfg.fetch_timeout_s, cfg.max_fetch_bytes, cfg.max_redirects,
                                           cfg.allow_private_networks, list(cfg.allow_networks),
                                           list(cfg.allow_domains), list(cfg.deny_domains)))
        self.urls = UrlMemo(cfg.url_cache_ttl_s)

    async def close(self) -> None:
        await self.fetcher.close()
        await self.l1.close()
        self.pool.close()

    # -- sources -------------------------------------------------------------------
    async def _bytes_info(self, data: bytes):
        if len(data) <= _SMALL:
            return content_hash(data), probe(data, self.cfg.max_source_pixels)
        return await self.pool.run(lambda: (content_hash(data), probe(data, self.cfg.max_source_pixels)))

    async def source(self, part: "ImagePart") -> Source:
        url = part.url
        try:
            if url[:5].lower() == "data:":
                if len(url) <= _SMALL:
                    data = decode_data_uri(url)
                else:
                    data = await self.pool.run(decode_data_uri, url)
                h, header = await self._bytes_info(data)
                return Source("data", url, h, header, len(data), data)
            if not url.lower().startswith(("http://", "https://")):
                raise ImageError("image_url.url must be a data: URI or an http(s) URL", "invalid_image_url")
            mode = self.cfg.url_mode
            if mode == "reject":
                raise ImageError("this gateway accepts images only as data: URIs", "image_url_not_allowed")
            if mode == "passthrough":
                return Source("url_passthrough", url, "url:" + content_hash(url.encode()), None, 0)
            memo = self.urls.get(url)
            if memo is not None:
                return Source("url", url, memo[0], memo[1], memo[2])
            data = await self.fetcher.fetch(url)
            h, header = await self._bytes_info(data)
            self.urls.put(url, h, header, len(data))
            return Source("url", url, h, header, len(data), data)
        except (ImageError, FetchError) as e:
            raise _bad(part, e) from None

    # -- rewriting -----------------------------------------------------------------
    async def rewritten(self, part: "ImagePart", src: Source, policy: Policy) -> tuple[Rewritten, str]:
        """(result, outcome). ``result.url`` None = send the original string."""
        header = src.header
        if src.kind == "url_passthrough":
            return Rewritten(None, b"", "", 0, 0, 0, 0, 0, 0, 0), "url_passthrough"
        assert header is not None
        if src.kind == "data" and not needs_rewrite(header, policy):
            before = tokens(header.width, header.height, policy)
            return Rewritten(None, src.data or b"", MIME[header.format], header.width, header.height,
                             header.width, header.height, src.size, before, before), "passthrough"
        key = f"{src.hash}|{policy.key}"
        hit = await self.l1.get(key)
        if hit is not None:
            return hit, "l1_hit"
        try:
            if src.data is None:  # a remembered URL whose rewrite left L1
                src.data = await self.fetcher.fetch(src.url)
                if content_hash(src.data) != src.hash:
                    src.hash = content_hash(src.data)
                    src.header = header = await self.pool.run(probe, src.data, self.cfg.max_source_pixels)
                    self.urls.put(src.url, src.hash, header, len(src.data))
                    key = f"{src.hash}|{policy.key}"
            data = src.data
            if not needs_rewrite(header, policy):  # URL within budget: its bytes, unchanged, inline
                r = Rewritten(data_uri(data, MIME[header.format]), data, MIME[header.format], header.width,
                              header.height, header.width, header.height, len(data),
                              tokens(header.width, header.height, policy), 0)
                r.tokens_after = r.tokens_before
                outcome = "passthrough"
            else:
                r = await self.pool.run(rewrite, data, header, policy)
                metrics.REWRITE_SECONDS.observe(r.seconds)
                outcome = "rewritten"
        except (ImageError, FetchError) as e:
            raise _bad(part, e) from None
        await self.l1.put(key, r)
        return r, outcome

    # -- the stage -----------------------------------------------------------------
    async def __call__(self, req: "ChatRequest"):
        if not req.images:
            return None
        policy_header = parse_header(req.headers.get(POLICY_HEADER))
        policies = []
        for part in req.images:
            iu = part.part.get("image_url")
            detail = iu.get("detail") if isinstance(iu, dict) else None
            policies.append(resolve(self.cfg, req.model, policy_header, detail))
        sources = await _gather([self.source(p) for p in req.images])
        for part, src, pol in zip(req.images, sources, policies):
            part.content_hash = src.hash
            part.source_bytes = src.size
            if src.header is not None:
                part.width, part.height = src.header.width, src.header.height
                part.tokens_before = tokens(src.header.width, src.header.height, pol)
        # rewrite now for the model's policy: errors surface before routing and the
        # before_send hook usually only applies these results
        done = await _gather([self.rewritten(p, s, pol) for p, s, pol in zip(req.images, sources, policies)])
        plan = {"sources": sources, "policies": policies, "results": done, "applied": None, "counted": False}
        req.state["images"] = plan
        self._apply(req, [(pol, r) for pol, (r, _) in zip(policies, done)])
        req.before_send.append(self.before_send)
        return None

    async def before_send(self, req: "ChatRequest", backend: "Backend") -> None:
        plan = req.state["images"]
        cap = (backend.profile or {}).get("image_max_long_side")
        cap = int(cap) if isinstance(cap, (int, float)) and cap > 0 else None
        chosen = []
        outcomes = []
        for part, src, pol, (r, outcome) in zip(req.images, plan["sources"], plan["policies"], plan["results"]):
            eff = pol.capped(cap)
            if eff != pol:
                r, outcome = await self.rewritten(part, src, eff)
            chosen.append((eff, r))
            outcomes.append(outcome)
        self._apply(req, chosen)
        if not plan["counted"]:
            plan["counted"] = True
            self._count(req, [r for _, r in chosen], outcomes)

    def _apply(self, req: "ChatRequest", chosen: list[tuple[Policy, Rewritten]]) -> None:
        plan = req.state["images"]
        before = after = 0
        for part, src, (_, r) in zip(req.images, plan["sources"], chosen):
            url = src.url if r.url is None else r.url
            iu = part.part.get("image_url")
            if isinstance(iu, dict):
                iu["url"] = url
            else:
                part.part["image_url"] = url
            part.tokens_after = r.tokens_after if src.header is not None else 0
            before += part.tokens_before
            after += part.tokens_after
        req.response_headers[TOKENS_HEADER] = f"before={before};after={after}"

    def _count(self, req: "ChatRequest", results: list[Rewritten], outcomes: list[str]) -> None:
        before = sum(p.tokens_before for p in req.images)
        after = sum(p.tokens_after for p in req.images)
        model = req.model
        metrics.VISUAL_TOKENS.labels(model, "before").inc(before)
        metrics.VISUAL_TOKENS.labels(model, "after").inc(after)
        metrics.VISUAL_TOKENS.labels(model, "saved").inc(max(0, before - after))
        for part, r, outcome in zip(req.images, results, outcomes):
            metrics.IMAGES.labels(outcome).inc()
            metrics.IMAGE_BYTES.labels("in").inc(part.source_bytes)
            metrics.IMAGE_BYTES.labels("out").inc(len(r.data) if r.url is not None else part.source_bytes)


async def _gather(coros):
    """Run concurrently; on failure raise the error of the first failing part (in order)."""
    if len(coros) == 1:
        return [await coros[0]]
    results = await asyncio.gather(*coros, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


def make(gw: "Gateway"):
    if not gw.cfg.images.enabled:
        return None
    rewriter = ImageRewriter(gw)
    gw.image_rewriter = rewriter
    gw.closers.append(rewriter.close)
    gw.cache_flushers.append(rewriter.l1.flush)  # POST /admin/cache/flush
    return rewriter


async def start(gw: "Gateway") -> None:
    return None


__all__ = ["ImageRewriter", "make", "start", "GatewayError"]
