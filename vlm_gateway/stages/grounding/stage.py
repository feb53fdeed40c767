"""The grounding stage (after the image stage, before the L3 lookup).

The image stage asks ``plan.gate_trim`` before it rewrites (no crop where answers
could not be mapped back) and ``plan.record``s the frames of what it sends. This stage
fixes the L3 frame key, counts the coordinate groups in the conversation (more than
``images.max_coordinate_groups`` while mapping is on: 400 ``too_many_coordinate_groups``,
before routing), and once a backend is chosen (``before_send``):

* derives each image's map under that backend's processor cap;
* rewrites coordinates in earlier turns (and the user's own text) from the client's
  frame into the frame the model sees, since the model reads them against the sent
  image; the client's text is restored first on a retry;
* installs the response transform when an answer can need mapping (at most
  ``max_coordinate_groups`` groups of the answer mapped); a request whose maps are all
  identities keeps the relay's plain byte path.

Counting and mapping a conversation that is long or holds many groups (``text.heavy``) runs on
the text thread, off the event loop.
"""

from __future__ import annotations

import logging
from typing import Iterator

from ... import metrics, offload
from ...backends.backend import Backend
from ...config import GatewayConfig
from ...core.errors import BadRequest
from ...core.request import ChatRequest
from ...core.stage import Stage
from .plan import HEADER, GroundingPlan, derive, for_backend
from .response import ResponseTransform
from .text import INLINE_CHARS, OFFLOAD_CHARS, Counts, Mapper, back, count_groups, forward, heavy

log = logging.getLogger("vlm_gateway.grounding")

_HISTORY_ROLES = ("user", "assistant")


class GroundingStage(Stage):
    name = "grounding"

    def __init__(self, max_groups: int = 10000) -> None:
        self.max_groups = max_groups

    @classmethod
    def from_config(cls, cfg: GatewayConfig, shared) -> "GroundingStage | None":
        return cls(cfg.images.max_coordinate_groups) if cfg.images.enabled else None

    async def __call__(self, req: ChatRequest):
        plan: GroundingPlan | None = req.grounding
        if plan is None:
            return None
        plan.frame_key = plan.key()
        req.subscribe(self)
        if plan.mapping and any(m is not None for m in plan.maps):
            texts = [t for *_, t in _history_texts(req)]
            if _heavy(texts):
                n = await offload.run(count_groups, texts, self.max_groups, refusable=True)
            else:
                n = count_groups(texts, self.max_groups)
            if n > self.max_groups:
                raise too_many(self.max_groups)
            plan.history_groups = n
        return None

    async def on_finish(self, req: ChatRequest) -> None:
        _count(req)

    async def before_send(self, req: ChatRequest, backend: Backend) -> None:
        plan: GroundingPlan = req.grounding
        cap = (backend.profile or {}).get("image_max_pixels")
        derive(req, plan, for_backend(plan.convention, int(cap) if isinstance(cap, int) else 0))
        plan.cacheable = plan.key() == plan.frame_key
        if plan.history_groups and _heavy([t for *_, t in _history_texts(req)]):
            await offload.run(history, req, plan, self.max_groups, refusable=True)
        else:
            history(req, plan, self.max_groups)
        if plan.needs_transform:
            attr = plan.attribution()
            counts = plan.counts = Counts(limit=self.max_groups)  # this answer's groups

            def over() -> None:  # a complete answer's header says so (a stream: an SSE comment too)
                req.response_headers[HEADER] = plan.state
                log.warning("request %s: the answer holds more than %d coordinate groups "
                            "(images.max_coordinate_groups); the rest is left as the model wrote it",
                            req.request_id, self.max_groups)
            req.response_transform = ResponseTransform(lambda: Mapper(attr, back, counts), counts=counts,
                                                       on_over=over)
        else:
            req.response_transform = None


def _heavy(texts: list[str]) -> bool:
    """Whether counting or mapping these texts is work for the text thread (``text.heavy``)."""
    total = sum(map(len, texts))
    if total <= INLINE_CHARS or total > OFFLOAD_CHARS:
        return total > INLINE_CHARS
    return heavy("\n".join(texts))


def _history_texts(req: ChatRequest) -> Iterator[tuple[int, int, int, str]]:
    """(message, part or -1, images before it, text) of every conversation text that may be
    mapped: user and assistant text at or after the first image."""
    positions = [p.message for p in req.images]
    for mi, msg in enumerate(req.body["messages"]):
        if not isinstance(msg, dict) or msg.get("role") not in _HISTORY_ROLES:
            continue
        upto = sum(1 for m in positions if m < mi or (m == mi and msg["role"] == "user"))
        if not upto:
            continue
        content = msg.get("content")
        if isinstance(content, str):
            yield mi, -1, upto, content
        elif isinstance(content, list):
            for pj, part in enumerate(content):
                text = part.get("text") if isinstance(part, dict) and part.get("type") == "text" else None
                if isinstance(text, str):
                    yield mi, pj, upto, text


def too_many(limit: int) -> BadRequest:
    return BadRequest(f"The conversation holds more than {limit} coordinate groups (boxes, points) to map into "
                      f"the frame of the images sent (images.max_coordinate_groups); send fewer, or send the "
                      f"request with '{HEADER}: off' to pass them to the model as written",
                      param="messages", code="too_many_coordinate_groups")


def history(req: ChatRequest, plan: GroundingPlan, limit: int = 0) -> None:
    """Coordinates in the conversation's text, client frame -> the model's frame; more than
    ``limit`` groups (0: no limit) is a 400 (the stage counted them before routing)."""
    messages = req.body["messages"]
    for mi, pj, text in plan.originals:  # what an earlier attempt rewrote
        if pj < 0:
            messages[mi]["content"] = text
        else:
            messages[mi]["content"][pj]["text"] = text
    plan.originals = []
    plan.history = Counts(limit=limit)
    if not plan.mapping or plan.history_groups == 0 or all(m is None for m in plan.maps):
        return
    for mi, pj, upto, text in list(_history_texts(req)):
        attr = plan.attribution(upto)
        if attr.common is not None and attr.common.identity:
            continue
        out = Mapper(attr, forward, plan.history).text(text)
        if plan.history.over:
            raise too_many(limit)
        if out != text:
            plan.originals.append((mi, pj, text))
            if pj < 0:
                messages[mi]["content"] = out
            else:
                messages[mi]["content"][pj]["text"] = out


def _count(req: ChatRequest) -> None:
    plan: GroundingPlan = req.grounding
    name = plan.convention.name
    for outcome, n in (("mapped", plan.counts.mapped), ("unattributed", plan.counts.unattributed),
                       ("unmappable", plan.counts.unmappable), ("history", plan.history.mapped),
                       ("history_unattributed", plan.history.unattributed),
                       ("history_unmappable", plan.history.unmappable)):
        if n:
            metrics.COORDINATES.labels(name, outcome).inc(n)
