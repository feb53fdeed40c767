"""Reading a configuration: build the model (``config.py``: every key's type), then check
every value (``config_values.py``: ranges, URLs, hosts, paths, keys that depend on each
other). The first bad key is raised as ``ConfigError("<key>: ...")``; the CLI prints that
one line and exits 2 before it listens. The names the layers above define are checked by
them (``vlm_gateway.load_config``).
"""

from __future__ import annotations

import typing
from typing import Any

from .config import GatewayConfig, build_config, validate_relations
from .config_values import check


def read_config(path: str | None = None, environ: typing.Mapping[str, str] | None = None,
                overrides: dict[str, Any] | None = None) -> GatewayConfig:
    """Read YAML (optional), apply ``VLM_GATEWAY_*`` env vars, then ``overrides``; every
    value checked but the names the upper layers define (``vlm_gateway.load_config``)."""
    cfg = build_config(path, environ, overrides)
    validate(cfg)
    return cfg


def validate(cfg: GatewayConfig) -> None:
    """Every value check of this layer, over a built (or changed) configuration."""
    check(cfg)
    validate_relations(cfg)
