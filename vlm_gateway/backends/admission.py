"""Admission: may this backend take this request, and is there a slot for it now?

``ProfileFilter`` is a pool filter ((req, backend) -> reason or None) that applies
the backend's GPU profile:

- number of images <= ``max_images_per_prompt``, of videos <= ``max_videos_per_prompt``
  (the engine is started with these limits: ``vlm-gateway launch``);
- every image, at the size the image stage sends it to this backend, within
  ``image_max_pixels``: the size its rewrite before routing chose (the legibility-aware
  budget's own decision, already capped when every backend of the model caps alike),
  brought under this backend's limits (``vision_tokens.send_cap``: its
  ``image_max_long_side`` and pixel budget) on the token grid when it is larger; an image the stage has not sized is taken at the model's fixed long side
  (min(images budget, profile cap), the budget as ``policy.model_settings`` resolves it
  for the model and tenant); an image of unknown size (no image stage) is not checked;
- estimated prompt tokens (text ~4 bytes a token and the chat template's tokens,
  ``vision_tokens``; visual tokens after rewrite, a rewritten video's count included)
  + ``max_tokens`` <= ``max_model_len``.

``Slots`` is the bounded admission queue: a request whose candidates are all at
their profile's ``max_num_seqs`` waits (FIFO wake-up) up to
``routing.queue_timeout_s``, then gets 429 with Retry-After; more than
``routing.max_queue`` waiting requests are refused at once.
"""

from __future__ import annotations

import asyncio
import collections
import math
from typing import TYPE_CHECKING

from .. import metrics
from ..core.clock import Clock, monotonic
from ..core.errors import RateLimited
from ..core.state import Slot
from ..stages.auth import TENANT
from ..stages.images.policy import model_settings
from ..vision_tokens import (MARKER_TOKENS, TEMPLATE_TOKENS_PER_MESSAGE, TEMPLATE_TOKENS_PER_REQUEST,
                             estimate_prompt_tokens, estimate_text_tokens, send_cap, target_size,
                             visual_tokens)

if TYPE_CHECKING:
    from ..config import GatewayConfig
    from ..core.request import ChatRequest
    from .backend import Backend


# the prompt's estimated text tokens (counted once per request)
TEXT_TOKENS: Slot[int] = Slot("est_text_tokens")


def text_tokens(req: "ChatRequest") -> int:
    """Estimated text tokens of the prompt (chat template included); cached."""
    cached = req.state.get(TEXT_TOKENS)
    if cached is not None:
        return cached
    if req.route == "chat":
        n = TEMPLATE_TOKENS_PER_REQUEST
        for msg in req.body.get("messages") or ():
            if not isinstance(msg, dict):
                continue
            n += TEMPLATE_TOKENS_PER_MESSAGE
            c = msg.get("content")
            if isinstance(c, str):
                n += estimate_text_tokens(c)
            elif isinstance(c, list):
                for p in c:
                    if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str):
                        n += estimate_text_tokens(p["text"])
    else:
        n = estimate_prompt_tokens(req.body.get("prompt"))
    req.state[TEXT_TOKENS] = n
    return n


def completion_budget(req: "ChatRequest") -> int:
    v = req.body.get("max_completion_tokens") or req.body.get("max_tokens")
    return v if isinstance(v, int) and v > 0 else 0


class ProfileFilter:
    def __init__(self, cfg: "GatewayConfig") -> None:
        self.images = cfg.images

    def _budget(self, req: "ChatRequest") -> tuple[int, int, int, int]:
        """(max_long_side, grid factor, min_pixels, max_pixels) of the image stage for the
        request's model and tenant."""
        tenant = req.state.get(TENANT)
        s = model_settings(self.images, req.model, getattr(tenant, "images", None) or None)
        return int(s["max_long_side"]), int(s["grid_factor"]), int(s["min_pixels"]), int(s["max_pixels"])

    def __call__(self, req: "ChatRequest", b: "Backend") -> str | None:
        p = b.profile
        if not p:
            return None
        max_images = int(p.get("max_images_per_prompt") or 0)
        if max_images and len(req.images) > max_images:
            return (f"{len(req.images)} images exceed the {max_images}-image limit of backend "
                    f"{b.name} ({p.get('name', 'profile')})")
        videos = [m for m in req.media if m.kind == "video"]
        max_videos = int(p.get("max_videos_per_prompt", 1) or 0)
        if len(videos) > max_videos:
            return (f"{len(videos)} video{'s' if len(videos) != 1 else ''} exceed the {max_videos}-video limit of "
                    f"backend {b.name} ({p.get('name', 'profile')})")
        long_side, factor, min_px, max_px = self._budget(req)
        prof_long = b.image_cap
        prof_px = b.image_pixels
        rewrite = self.images.enabled
        if prof_long:
            long_side = min(long_side, prof_long) if rewrite else prof_long
        vis = 0
        for img in req.images:
            if not img.width or not img.height:
                continue  # size unknown without the image stage
            if rewrite and img.sent_width:
                w, h = img.sent_width, img.sent_height
                cap = send_cap(w, h, prof_long, prof_px, factor, min_px)
                if cap and max(w, h) > cap:  # rewritten again under this backend's limits
                    w, h = target_size(w, h, cap, factor, min_px)
            elif rewrite:
                w, h = target_size(img.width, img.height, long_side, factor, min_px)
            else:
                w, h = img.width, img.height
                if prof_long and max(w, h) > prof_long:
                    return (f"image {img.param} is {w}x{h}, above the {prof_long} px long side of backend "
                            f"{b.name}")
            if prof_px and w * h > prof_px:
                return f"image {img.param} at {w}x{h} exceeds the {prof_px}-pixel budget of backend {b.name}"
            try:
                vis += visual_tokens(w, h, factor, min_px, min(max_px, prof_px) if prof_px else max_px) \
                    + MARKER_TOKENS
            except ValueError as e:
                return f"image {img.param}: {e}"
        vis += sum(v.tokens_after for v in videos)
        max_len = int(p.get("max_model_len") or 0)
        if max_len:
            need = text_tokens(req) + vis + completion_budget(req)
            if need > max_len:
                return (f"about {need} tokens (prompt + max_tokens) exceed the {max_len}-token context of "
                        f"backend {b.name}")
        return None


class Slots:
    """Waiters for a free backend slot, woken in arrival order on every release."""

    def __init__(self, timeout_s: float, max_queue: int, clock: Clock = monotonic) -> None:
        self.timeout = timeout_s
        self.max_queue = max_queue
        self.clock = clock
        self._waiters: collections.deque[asyncio.Future] = collections.deque()

    def __len__(self) -> int:
        return len(self._waiters)

    def retry_after(self) -> str:
        return str(max(1, math.ceil(min(self.timeout, 5.0))))

    def reject(self, why: str) -> RateLimited:
        return RateLimited(f"Every backend that can serve this request is at capacity ({why}); retry shortly",
                           code="backends_busy", headers={"retry-after": self.retry_after()},
                           reason="queue_timeout" if why == "queue timeout" else "queue_full")

    async def wait(self, try_take, deadline: float):
        """Wait until ``try_take()`` returns a backend, or raise 429 at ``deadline``."""
        if len(self._waiters) >= self.max_queue:
            raise self.reject("queue full")
        loop = asyncio.get_running_loop()
        metrics.QUEUE_DEPTH.inc()
        try:
            while True:
                left = deadline - self.clock()
                if left <= 0:
                    raise self.reject("queue timeout")
                fut = loop.create_future()
                self._waiters.append(fut)
                try:
                    # re-check periodically too: health changes and scrapes also free capacity
                    await asyncio.wait_for(asyncio.shield(fut), min(left, 0.25))
                except asyncio.TimeoutError:
                    pass
                finally:
                    if not fut.done():
                        fut.cancel()
                    try:
                        self._waiters.remove(fut)
                    except ValueError:
                        pass
                b = try_take()
                if b is not None:
                    return b
        finally:
            metrics.QUEUE_DEPTH.dec()

    def wake(self) -> None:
        for fut in self._waiters:
            if not fut.done():
                fut.set_result(None)
