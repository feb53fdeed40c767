"""The rewrite policy for one image: budget, token grid and encoder settings,
resolved from global config, per-model overrides, the tenant's ``images`` settings,
``detail`` and the ``x-vlm-gateway-image-policy`` header (later wins), then capped
by the chosen backend. Where the client asked for a size (``detail``, the header)
the fixed rule applies at that size; otherwise ``budget`` picks the rule
(``legible``: budget.py, from the text the image holds; ``fixed``: max_long_side).
Under engine pressure the SLO budget level (``pressure.py``) is applied on top."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ...core import headers as H
from ...config import IMAGE_OVERRIDE_KEYS, ImagesConfig, SloConfig
from ...core.errors import BadRequest

POLICY_HEADER = H.IMAGE_POLICY.name
# header value: the default budget, and under engine pressure text may go below its legibility floor
BELOW_FLOOR = "below-floor"


@dataclass(frozen=True, slots=True)
class Policy:
    """Everything that decides the output bytes; ``key`` goes into the L1 key."""

    max_long_side: int = 768
    grid_factor: int = 32
    min_pixels: int = 65536
    max_pixels: int = 16777216
    trim_borders: bool = True
    trim_tolerance: int = 8
    jpeg_quality: int = 90
    resample: str = "bicubic"
    prescale_gap: float = 1.2
    # "off": never rewrite (a backend cap still applies)
    enabled: bool = True
    # legible: the long side from the text the image holds (budget.py); fixed: max_long_side;
    # client: max_long_side as the client asked (detail, the policy header)
    budget: str = "legible"
    text_max_long_side: int = 2560
    legible_text_px: float = 6.5
    legible_dense_px: float = 12.0
    photo_long_side: int = 0  # 0: max_long_side
    # SLO budget level (backends/slo.py) and how it scales this image (pressure.py)
    level: int = 0
    below_floor: bool = False
    photo_scales: tuple[float, ...] = ()
    text_scales: tuple[float, ...] = ()
    photo_floor: int = 0

    @property
    def legible(self) -> bool:
        return self.enabled and self.budget == "legible"

    @property
    def key(self) -> str:
        k = (f"{self.max_long_side if self.enabled else 0}/{self.grid_factor}/{self.min_pixels}/"
             f"{self.trim_borders:d}{self.trim_tolerance}/q{self.jpeg_quality}/{self.resample}/"
             f"{self.prescale_gap:g}")
        if self.legible:
            # everything the legible rule reads changes the output; max_pixels bounds the area
            k += (f"/L{self.text_max_long_side}/{self.legible_text_px:g}/{self.legible_dense_px:g}/"
                  f"{self.photo_long_side}/{self.max_pixels}")
        if self.level > 0:
            k += (f"/P{self.level}{'b' if self.below_floor else ''}:{self.photo_floor}:"
                  f"{','.join(f'{x:g}' for x in self.photo_scales)}:{','.join(f'{x:g}' for x in self.text_scales)}")
        return k

    def under(self, level: int, slo: SloConfig, below_floor: bool) -> "Policy":
        """This policy at SLO budget ``level``; an image sent as it came ("off") is left alone."""
        if level <= 0 or not self.enabled:
            return self
        return replace(self, level=level, below_floor=below_floor, photo_scales=tuple(slo.photo_scales),
                       text_scales=tuple(slo.text_scales), photo_floor=slo.photo_floor_long_side)

    def capped(self, long_side: int | None) -> "Policy":
        """This policy under a backend's hard limit on the long side."""
        if not long_side or long_side <= 0:
            return self
        if not self.enabled:
            return replace(self, enabled=True, budget="fixed", max_long_side=int(long_side), trim_borders=False)
        cap = max(self.grid_factor, int(long_side))
        if self.legible:
            if cap >= max(self.max_long_side, self.text_max_long_side, self.photo_long_side):
                return self
            return replace(self, max_long_side=min(cap, self.max_long_side),
                           text_max_long_side=min(cap, self.text_max_long_side),
                           photo_long_side=min(cap, self.photo_long_side) if self.photo_long_side else 0)
        if long_side >= self.max_long_side:
            return self
        return replace(self, max_long_side=cap)


def model_settings(cfg: ImagesConfig, model: str, tenant: dict[str, Any] | None = None) -> dict[str, Any]:
    """The image keys in force for ``model``: global settings, then the model's overrides,
    then the tenant's (``auth.tenants[].images``). The one place a model's image budget is
    resolved: the image stage, the video frame budget and admission's profile filter read it."""
    s = {k: getattr(cfg, k) for k in IMAGE_OVERRIDE_KEYS}
    s.update({k: v for k, v in (cfg.models.get(model) or {}).items() if k in IMAGE_OVERRIDE_KEYS})
    s.update({k: v for k, v in (tenant or {}).items() if k in IMAGE_OVERRIDE_KEYS})
    return s


def parse_header(value: str | None) -> str | int:
    """'off' | 'default' | 'below-floor' | a long side in pixels."""
    if value is None:
        return "default"
    v = value.strip().lower()
    if v in ("", "default", "on", "auto"):
        return "default"
    if v in ("off", BELOW_FLOOR):
        return v
    try:
        n = int(v)
    except ValueError:
        n = 0
    if n <= 0 or n > 16384:
        raise BadRequest(f"{POLICY_HEADER} must be off, default, below-floor or a long side in pixels (1-16384), got {value!r}",
                         param=POLICY_HEADER, code="invalid_image_policy")
    return n


def resolve(cfg: ImagesConfig, model: str, header: str | int, detail: str | None,
            tenant: dict[str, Any] | None = None) -> Policy:
    s = model_settings(cfg, model, tenant)
    long_side = s["max_long_side"]
    budget = str(s["budget"])
    if detail == "low":
        long_side, budget = s["detail_low_long_side"], "client"
    elif detail == "high":
        long_side, budget = s["detail_high_long_side"], "client"
    if isinstance(header, int):
        long_side, budget = header, "client"
    factor = int(s["grid_factor"])
    return Policy(max_long_side=max(factor, int(long_side)), grid_factor=factor,
                  min_pixels=int(s["min_pixels"]), max_pixels=int(s["max_pixels"]),
                  trim_borders=bool(s["trim_borders"]), trim_tolerance=int(s["trim_tolerance"]),
                  jpeg_quality=int(s["jpeg_quality"]), resample=str(s["resample"]),
                  prescale_gap=float(s["prescale_gap"]), enabled=header != "off", budget=budget,
                  text_max_long_side=int(s["text_max_long_side"]), legible_text_px=float(s["legible_text_px"]),
                  legible_dense_px=float(s["legible_dense_px"]), photo_long_side=int(s["photo_long_side"]))

