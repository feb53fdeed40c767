"""Request limits checked before any media is decoded or fetched: number of
messages, media parts per kind (images -- image_url, input_image and allowed
image_embeds --, videos, audios), the inline bytes of every media part per kind
(data: payloads, input_audio, image_embeds; fetched bodies are added to the same
totals as they stream, see ``images.inflight``), image_embeds unless allowed, the
engine extras that change how media are read (``mm_processor_kwargs``,
``media_io_kwargs``: pixel budgets, video frames) unless allowed -- and, while the
video rewrite is on, even when allowed, the parts of them that reach video sampling
or the video processor in a request with a video (the rewrite's frame limits and
token counts hold only for the engine's own settings) --, and the max_tokens cap
(per tenant, else global). Each refusal is a 4xx that names the limit; the body size itself is refused earlier with 413 by the endpoint.
Pixels per image are checked by the image stage once the header is read
(``images.max_source_pixels``).

A request that leaves ``max_tokens`` out gets the cap written in, so the engine's
own default (often the whole context) cannot exceed it.
"""

from __future__ import annotations

from ..core import headers as H
from ..config import GatewayConfig, LimitsConfig
from ..core.errors import BadRequest
from ..core.request import ChatRequest
from ..core.stage import Stage
from .auth import TENANT
from .images.inflight import MediaBudget
from .images.source import inline_size, payload_bytes


def inline_bytes(url: str) -> int:
    """Decoded size of a ``data:`` URL's payload, from its length (no decoding)."""
    return payload_bytes(url) if url[:5].lower() == "data:" else 0


# kind -> (what, its count limit); image embeddings count as images
# vLLM request extras that change how the engine reads media: a client could raise the
# pixel budget (max_pixels) or the frames sampled past the gateway's limits
MEDIA_KWARGS = ("mm_processor_kwargs", "media_io_kwargs")
# mm_processor_kwargs keys that reach only other modalities' processors (transformers merges
# every other key, flat ones included, into the video processor's kwargs too)
NON_VIDEO_PROCESSOR_KEYS = frozenset({"images_kwargs", "audio_kwargs", "text_kwargs"})
VIDEO_POLICY_HEADER = H.VIDEO_POLICY.name
_COUNTS = {"image": ("images", "max_images_per_request"), "embeds": ("images", "max_images_per_request"),
           "video": ("videos", "max_videos_per_request"), "audio": ("audios", "max_audios_per_request")}


class Limits(Stage):
    name = "limits"

    def __init__(self, limits: LimitsConfig, allow_embeds: bool, video_rewrite: bool, budget: MediaBudget) -> None:
        self.lim = limits
        self.allow_embeds = allow_embeds
        self.video_rewrite = video_rewrite
        self.budget = budget

    @classmethod
    def from_config(cls, cfg: GatewayConfig, shared) -> "Limits":
        return cls(cfg.limits, cfg.images.allow_image_embeds, cfg.video.enabled, shared.budget)

    async def __call__(self, req: ChatRequest):
        lim, allow_embeds, video_rewrite, budget = self.lim, self.allow_embeds, self.video_rewrite, self.budget
        if req.route == "chat" and lim.max_messages and len(req.body["messages"]) > lim.max_messages:
            raise BadRequest(f"Too many messages: {len(req.body['messages'])} > limit max_messages "
                             f"({lim.max_messages})", param="messages", code="too_many_messages")
        if not req.media:
            return self._tokens(req)
        if not lim.allow_media_kwargs:  # (without media parts they change nothing)
            for k in MEDIA_KWARGS:
                if req.body.get(k) is not None:
                    raise BadRequest(f"'{k}' changes how the engine reads images and video past this gateway's "
                                     "limits and is refused with media parts; set limits.allow_media_kwargs: "
                                     "true (VLM_GATEWAY_LIMITS__ALLOW_MEDIA_KWARGS=true) to forward it",
                                     param=k, code="unsupported_parameter")
        elif video_rewrite and any(p.kind == "video" for p in req.media) and \
                (req.headers.get(VIDEO_POLICY_HEADER) or "").strip().lower() != "off":
            self._video_kwargs(req)
        counts: dict[str, int] = {}
        for p in req.media:
            if p.kind == "embeds" and not allow_embeds:
                raise BadRequest(f"{p.param}: image_embeds parts are refused by default (the gateway cannot check "
                                 "tensors: no pixel or token limit applies to them); set "
                                 "images.allow_image_embeds: true (VLM_GATEWAY_IMAGES__ALLOW_IMAGE_EMBEDS=true) "
                                 "to accept them", param=p.param, code="image_embeds_not_allowed")
            what, key = _COUNTS[p.kind]
            n = counts[what] = counts.get(what, 0) + 1
            cap = getattr(lim, key)
            if cap and n > cap:
                total = sum(1 for q in req.media if _COUNTS[q.kind][0] == what)
                raise BadRequest(f"Too many {what}: {total} > limit {key} ({cap})", param="messages",
                                 code=f"too_many_{what}")
        for p in req.media:  # inline bytes, before anything is decoded (fetched bodies add later)
            budget.count(req, p, inline_size(p))
        return self._tokens(req)

    @staticmethod
    def _video_kwargs(req: ChatRequest) -> None:
        touched = []
        mio = req.body.get("media_io_kwargs")
        if mio is not None and (not isinstance(mio, dict) or mio.get("video") is not None):
            touched.append("media_io_kwargs.video" if isinstance(mio, dict) else "media_io_kwargs")
        mpk = req.body.get("mm_processor_kwargs")
        if isinstance(mpk, dict):
            touched += [f"mm_processor_kwargs.{k}" for k in mpk if k not in NON_VIDEO_PROCESSOR_KEYS]
        elif mpk is not None:
            touched.append("mm_processor_kwargs")
        if touched:
            raise BadRequest(f"'{touched[0]}' would change how the engine samples or sizes video frames; the "
                             "gateway rewrites videos for the engine's own settings (its frame limits and token "
                             "counts hold only for them). Leave it out (image settings go under "
                             "mm_processor_kwargs.images_kwargs), or send the header "
                             f"{VIDEO_POLICY_HEADER}: off to have the engine read the original video",
                             param=touched[0], code="unsupported_parameter")

    def _tokens(self, req: ChatRequest):
        t = req.state.get(TENANT)
        cap = (t.max_tokens_cap if t is not None and t.max_tokens_cap else 0) or self.lim.max_tokens_cap
        if cap:
            asked = [(k, req.body[k]) for k in ("max_tokens", "max_completion_tokens")
                     if isinstance(req.body.get(k), int)]
            for k, v in asked:
                if v > cap:
                    raise BadRequest(f"'{k}' is {v}, above this key's limit max_tokens_cap ({cap})",
                                     param=k, code="max_tokens_exceeded")
            if not asked:
                req.body["max_tokens"] = cap
        return None
