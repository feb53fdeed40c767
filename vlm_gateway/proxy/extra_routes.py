"""Routes beyond the OpenAI surface (admin, ui, ...), collected from the modules
that provide them. ``app.py`` calls ``routes(cfg)``; each module listed here
exposes ``routes(cfg) -> list`` and is skipped when it is not installed."""

from __future__ import annotations

import importlib

from ..config import GatewayConfig

# module names under vlm_gateway.proxy, in the order their routes are matched
MODULES = ("ui", "admin", "openapi")


def routes(cfg: GatewayConfig) -> list:
    out: list = []
    for name in MODULES:
        try:
            mod = importlib.import_module(f"{__package__}.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"{__package__}.{name}":
                continue
            raise
        out += mod.routes(cfg)
    return out
