"""vlm-gateway: an OpenAI-compatible gateway for vision-language model servers.

It rewrites images to the model's token grid, caches at three levels and routes
by GPU profile and live load. The public surface is small on purpose:

    from vlm_gateway import create_app, load_config, GatewayConfig, visual_tokens

``load_config`` is the one complete check of a configuration: the base layer's
``config_load.read_config`` (types and values), then the names the backends define
(``backends/config_names.py``: routing policies, GPU and simulator profiles).
"""

__version__ = "0.1.0"

import typing  # noqa: E402
from typing import Any  # noqa: E402

from . import config_load as _config  # noqa: E402
from .config import ConfigError, GatewayConfig  # noqa: E402
from .vision_tokens import smart_resize, visual_tokens  # noqa: E402


def load_config(path: str | None = None, environ: typing.Mapping[str, str] | None = None,
                overrides: dict[str, Any] | None = None) -> GatewayConfig:
    """Read YAML (optional), apply ``VLM_GATEWAY_*`` env vars, then ``overrides``; every
    key checked, the first bad one raised as ``ConfigError("<key>: ...")``."""
    cfg = _config.read_config(path, environ, overrides)
    _check_names(cfg)
    return cfg


def validate(cfg: GatewayConfig) -> None:
    """The checks of ``load_config`` over a config changed after loading (the CLI's --backend)."""
    _config.validate(cfg)
    _check_names(cfg)


def _check_names(cfg: GatewayConfig) -> None:
    # imported here: `import vlm_gateway` stays light (the router, profiles and simulator
    # load only when a config is checked)
    from .backends.config_names import check
    check(cfg)


def create_app(cfg=None):
    """The ASGI application (Starlette) for ``cfg`` (default: the built-in defaults)."""
    from .proxy.app import create_app as _create
    return _create(cfg)


__all__ = ["__version__", "create_app", "load_config", "validate", "GatewayConfig", "ConfigError",
           "smart_resize", "visual_tokens"]
