"""vlm-gateway: an OpenAI-compatible gateway for vision-language model servers.

It rewrites images to the model's token grid, caches at three levels and routes
by GPU profile and live load. The public surface is small on purpose:

    from vlm_gateway import create_app, load_config, GatewayConfig, visual_tokens
"""

__version__ = "0.1.0"

from .config import ConfigError, GatewayConfig, load_config  # noqa: E402
from .vision_tokens import smart_resize, visual_tokens  # noqa: E402


def create_app(cfg=None):
    """The ASGI application (Starlette) for ``cfg`` (default: the built-in defaults)."""
    from .proxy.app import create_app as _create
    return _create(cfg)


__all__ = ["__version__", "create_app", "load_config", "GatewayConfig", "ConfigError",
           "smart_resize", "visual_tokens"]
