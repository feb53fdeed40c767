"""Assemble the stage chain from the configuration.

Each stage module exposes ``make(gateway) -> Stage | None`` (None = switched off by
config) and optionally ``async start(gateway)``. The order is fixed here:
auth and limits first, then the other media parts (video, audio), then images
(L1), grounding (the coordinate frames the images leave), then the response cache (L3).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..proxy.gateway import Gateway
    from . import Stage

# module names under vlm_gateway.stages, in order
ORDER = ("auth", "ratelimit", "limits", "images.media", "images.stage", "grounding.stage", "cache.stage")


def _modules():
    for name in ORDER:
        yield importlib.import_module(f"{__package__}.{name}")


def build(gw: "Gateway") -> list["Stage"]:
    stages = []
    for mod in _modules():
        stage = mod.make(gw)
        if stage is not None:
            stages.append(stage)
    return stages


async def start(gw: "Gateway") -> None:
    for mod in _modules():
        if hasattr(mod, "start"):
            await mod.start(gw)
