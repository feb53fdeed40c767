"""The grounding stage (after the image stage, before the L3 lookup).

The image stage asks ``plan.gate_trim`` before it rewrites (no crop where answers
could not be mapped back) and ``plan.record``s the frames of what it sends. This stage
fixes the L3 frame key, and once a backend is chosen (``before_send``):

* derives each image's map under that backend's processor cap;
* rewrites coordinates in earlier turns (and the user's own text) from the client's
  frame into the frame the model sees, since the model reads them against the sent
  image; the client's text is restored first on a retry;
* installs the response transform when an answer can need mapping; a request whose
  maps are all identities keeps the relay's plain byte path.
"""

from __future__ import annotations

from ... import metrics
from ...backends.backend import Backend
from ...config import GatewayConfig
from ...core.request import ChatRequest
from ...core.stage import Stage
from .plan import GroundingPlan, derive, for_backend
from .response import ResponseTransform
from .text import Counts, Mapper, back, forward

_HISTORY_ROLES = ("user", "assistant")


class GroundingStage(Stage):
    name = "grounding"

    @classmethod
    def from_config(cls, cfg: GatewayConfig, shared) -> "GroundingStage | None":
        return cls() if cfg.images.enabled else None

    async def __call__(self, req: ChatRequest):
        plan: GroundingPlan | None = req.grounding
        if plan is None:
            return None
        plan.frame_key = plan.key()
        req.subscribe(self)
        return None

    async def on_finish(self, req: ChatRequest) -> None:
        _count(req)

    async def before_send(self, req: ChatRequest, backend: Backend) -> None:
        plan: GroundingPlan = req.grounding
        cap = (backend.profile or {}).get("image_max_pixels")
        derive(req, plan, for_backend(plan.convention, int(cap) if isinstance(cap, int) else 0))
        plan.cacheable = plan.key() == plan.frame_key
        history(req, plan)
        if plan.needs_transform:
            attr = plan.attribution()
            req.response_transform = ResponseTransform(lambda: Mapper(attr, back, plan.counts))
        else:
            req.response_transform = None


def history(req: ChatRequest, plan: GroundingPlan) -> None:
    """Coordinates in the conversation's text, client frame -> the model's frame."""
    messages = req.body["messages"]
    for mi, pj, text in plan.originals:  # what an earlier attempt rewrote
        if pj < 0:
            messages[mi]["content"] = text
        else:
            messages[mi]["content"][pj]["text"] = text
    plan.originals = []
    plan.history = Counts()
    if not plan.mapping:
        return
    positions = [p.message for p in req.images]
    for mi, msg in enumerate(messages):
        if msg.get("role") not in _HISTORY_ROLES:
            continue
        upto = sum(1 for m in positions if m < mi or (m == mi and msg["role"] == "user"))
        if not upto:
            continue
        attr = plan.attribution(upto)
        if attr.common is not None and attr.common.identity:
            continue
        content = msg.get("content")
        if isinstance(content, str):
            out = Mapper(attr, forward, plan.history).text(content)
            if out != content:
                plan.originals.append((mi, -1, content))
                msg["content"] = out
        elif isinstance(content, list):
            for pj, part in enumerate(content):
                text = part.get("text") if part.get("type") == "text" else None
                if isinstance(text, str):
                    out = Mapper(attr, forward, plan.history).text(text)
                    if out != text:
                        plan.originals.append((mi, pj, text))
                        part["text"] = out


def _count(req: ChatRequest) -> None:
    plan: GroundingPlan = req.grounding
    name = plan.convention.name
    for outcome, n in (("mapped", plan.counts.mapped), ("unattributed", plan.counts.unattributed),
                       ("history", plan.history.mapped), ("history_unattributed", plan.history.unattributed)):
        if n:
            metrics.COORDINATES.labels(name, outcome).inc(n)
