"""One request's coordinate plan: the model's convention, whether answers are
mapped (and why not), the frame of every image and the map that follows from it.

Mapping is on when the convention is known and neither the config (globally or for
the model), the tenant nor the request (``x-vlm-gateway-grounding: off``) turns it
off. Borders are trimmed only when mapping is on and the request holds one distinct
image (same bytes, same policy): with several different images an answer that does
not say which image it means could not be mapped back, so none is cropped.

What the client is told (response headers):

* ``x-vlm-gateway-grounding: convention=qwen3-vl; mapping=on`` -- ``on`` (every
  coordinate is in the client's frame), ``by-image-marker`` (the images differ: a
  coordinate is mapped when the answer names its image, ``Image N``), ``partial;
  reason=too-many-groups`` (an answer with more groups than ``images.max_coordinate_groups``:
  the rest is as the model wrote it) or ``off; reason=
  request|tenant|config|unknown-convention|unknown-image-size``;
* ``x-vlm-gateway-image-transform-N`` for the N-th image (1-based, request order): see
  ``frames.Frame.header``.

The L3 key gets ``frame_key``: ``client`` when every answer is mapped to the client's
frame (the same for any sent frame), otherwise the sent frames themselves; an answer
whose final frames differ from those of the lookup is not stored (``cacheable``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ...core import headers as H
from ...core.errors import BadRequest
from ..auth import TENANT
from .conventions import Convention, resolve
from .frames import HEADER_PREFIX, Frame, ImageMap, image_map
from .text import Attribution, Counts

if TYPE_CHECKING:
    from ...config import ImagesConfig
    from ...core.request import ChatRequest
    from ..images.policy import Policy
    from ..images.rewrite import Rewritten
    from ..images.source import Source

HEADER = H.GROUNDING.name


@dataclass(slots=True)
class GroundingPlan:
    convention: Convention
    mapping: bool
    reason: str = ""  # why mapping is off
    trim: bool = False
    frames: list[Frame | None] = field(default_factory=list)
    maps: list[ImageMap | None] = field(default_factory=list)
    frame_key: str = ""  # what the L3 key was built with
    cacheable: bool = True
    counts: Counts = field(default_factory=Counts)  # answer groups
    history: Counts = field(default_factory=Counts)  # groups in the conversation, sent to the model
    # groups in the conversation's texts that may be mapped (counted before routing; None: not counted)
    history_groups: int | None = None
    # (message, part or -1, text as the client sent it): history texts rewritten for the model
    originals: list[tuple[int, int, str]] = field(default_factory=list)

    @property
    def common(self) -> ImageMap | None:
        return common_map(self.maps)

    @property
    def state(self) -> str:
        if not self.mapping:
            return f"convention={self.convention.name}; mapping=off; reason={self.reason}"
        if self.maps and all(m is None for m in self.maps):  # absolute pixels of images never seen
            return f"convention={self.convention.name}; mapping=off; reason=unknown-image-size"
        if self.counts.over:  # the answer held more groups than images.max_coordinate_groups
            return f"convention={self.convention.name}; mapping=partial; reason=too-many-groups"
        return f"convention={self.convention.name}; mapping={'on' if self.common else 'by-image-marker'}"

    @property
    def needs_transform(self) -> bool:
        """Whether answers can need a change (the relay's fast path otherwise)."""
        if not self.mapping:
            return False
        c = self.common
        return not c.identity if c is not None else any(m is not None and not m.identity for m in self.maps)

    def attribution(self, upto: int | None = None) -> Attribution:
        """For text that may refer to the first ``upto`` images (all by default)."""
        maps = self.maps if upto is None else self.maps[:upto]
        return Attribution(common_map(maps), list(self.maps))

    def key(self) -> str:
        if self.mapping and self.common is not None:
            return "client"
        return "sent:" + "|".join(f.key() if f is not None else "url" for f in self.frames)


def common_map(maps: list[ImageMap | None]) -> ImageMap | None:
    if not maps or maps[0] is None:
        return None
    first = maps[0]
    return first if all(first.same(m) for m in maps[1:]) else None


def _mode_header(req: "ChatRequest") -> bool:
    v = req.headers.get(HEADER)
    if v is None:
        return True
    v = v.strip().lower()
    if v in ("", "on", "default", "auto"):
        return True
    if v == "off":
        return False
    raise BadRequest(f"{HEADER} must be on or off, got {v[:40]!r}", param=HEADER, code="invalid_grounding_mode")


def plan_for(cfg: "ImagesConfig", req: "ChatRequest") -> GroundingPlan | None:
    """The request's plan (made once; None without images)."""
    if req.grounding is not None or not req.images:
        return req.grounding
    ov: dict[str, Any] = cfg.models.get(req.model) or {}
    conv = resolve(ov.get("coordinates", cfg.coordinates), req.model, int(ov.get("processor_min_pixels", 0)),
                   int(ov.get("processor_max_pixels", 0)))
    tenant = req.state.get(TENANT)
    wanted = _mode_header(req)
    reason = ("unknown-convention" if not conv.known else
              "config" if not ov.get("map_coordinates", cfg.map_coordinates) else
              "tenant" if tenant is not None and not getattr(tenant, "map_coordinates", True) else
              "request" if not wanted else "")
    req.grounding = GroundingPlan(conv, mapping=not reason, reason=reason)
    return req.grounding


def gate_trim(cfg: "ImagesConfig", req: "ChatRequest", sources: list["Source"],
              policies: list["Policy"]) -> list["Policy"]:
    """The image policies with trimming switched off where coordinates could not be mapped back."""
    plan = plan_for(cfg, req)
    if plan is None:
        return policies
    plan.trim = plan.mapping and len({(s.hash, p.key) for s, p in zip(sources, policies)}) == 1
    if plan.trim:
        return policies
    return [replace(p, trim_borders=False) if p.trim_borders else p for p in policies]


def frame_of(r: "Rewritten", src: "Source") -> Frame | None:
    if src.kind == "url_passthrough":
        return None
    if not r.view:
        return Frame.identity(r.width, r.height)
    cw, ch, left, top, right, bottom = r.view
    return Frame(int(cw), int(ch), left, top, right, bottom, r.width, r.height)


def for_backend(conv: Convention, max_pixels: int) -> Convention:
    """An absolute convention under the pixel cap the backend's processor was started with."""
    if not max_pixels or not conv.known or conv.relative or max_pixels >= conv.max_pixels:
        return conv
    return Convention(conv.name, 0, conv.factor, min(conv.min_pixels, max_pixels), max_pixels)


def record(req: "ChatRequest", results: list["Rewritten"], sources: list["Source"]) -> None:
    """Note the frames of the images as they will be sent (and say so in the headers)."""
    plan: GroundingPlan | None = req.grounding
    if plan is None:
        return
    plan.frames = [frame_of(r, s) for r, s in zip(results, sources)]
    derive(req, plan, plan.convention)


def derive(req: "ChatRequest", plan: GroundingPlan, conv: Convention) -> None:
    """Maps and headers from the recorded frames under ``conv``."""
    plan.maps = [image_map(f, conv) for f in plan.frames]
    h = req.response_headers
    h[HEADER] = plan.state
    for i, (part, f) in enumerate(zip(req.images, plan.frames), 1):
        name = part.param[:-len(".image_url")] if part.param.endswith(".image_url") else part.param
        h[f"{HEADER_PREFIX}{i}"] = f.header(name, conv) if f is not None else f"part={name}; unknown"
