"""The gateway's image rewriting inside LiteLLM.

Teams already running a LiteLLM proxy (or calling ``litellm`` / its ``Router`` from
Python) get our image stage without switching gateways: every ``image_url`` part
given as a ``data:`` URI is downscaled to the image budget, snapped to the model's
token grid and re-encoded deterministically, before LiteLLM sends the request.

LiteLLM proxy (``config.yaml``)::

    litellm_settings:
      callbacks: vlm_gateway.integrations.litellm_hook.proxy_handler_instance

``proxy_handler_instance`` reads the gateway config named by ``VLM_GATEWAY_CONFIG``
(its ``images:`` section; defaults otherwise). From Python::

    from vlm_gateway.integrations.litellm_hook import ImageRewriteHook
    litellm.callbacks = [ImageRewriteHook({"images": {"max_long_side": 768}})]

Two LiteLLM hooks are implemented, sharing one rewrite: ``async_pre_call_hook``
(run by the LiteLLM proxy before routing) and ``async_pre_call_deployment_hook``
(run inside ``litellm.acompletion``, so the SDK and the ``Router`` get it too). An
image already within budget passes through after a header probe, so running both
costs nothing twice. http(s) image URLs are left for the engine to fetch (this
hook does not fetch on the proxy's behalf). Broken or refused images raise
``litellm.BadRequestError`` (HTTP 400 at the proxy).

Only this module imports litellm; the gateway core never does.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import litellm
from litellm.integrations.custom_logger import CustomLogger

from .. import data_uri
from ..backends import config_names
from ..config import GatewayConfig, ImagesConfig
from ..config_load import read_config
from ..lru import LRU
from ..stages.images import Policy, rewrite_bytes
from ..stages.images.memory import DecodeLimits
from ..stages.images.decode import ImageError
from ..stages.images.policy import resolve

# call types whose ``messages`` carry chat content parts
_CHAT_CALLS = {"completion", "acompletion", "text_completion", "atext_completion"}


class _Lru:
    """Rewritten data URIs by (source hash, policy), bounded by bytes; thread-safe."""

    def __init__(self, max_bytes: int) -> None:
        self.lru: LRU[str, tuple[str, int, int]] = LRU(max_bytes=max_bytes or 1, size=lambda v: len(v[0]))
        self.lock = threading.Lock()

    def get(self, key: str):
        with self.lock:
            return self.lru.get(key)

    def put(self, key: str, value: tuple[str, int, int]) -> None:
        with self.lock:
            self.lru.put(key, value)


def _load(config: GatewayConfig | ImagesConfig | dict | str | None) -> ImagesConfig:
    if isinstance(config, ImagesConfig):
        return config
    if isinstance(config, GatewayConfig):
        return config.images
    # a dict of sections, or a path (None: VLM_GATEWAY_CONFIG / VLM_GATEWAY_* env); checked
    # as the gateway checks it, so one config file is refused or taken the same everywhere
    cfg = read_config(None, environ={}, overrides=config) if isinstance(config, dict) else read_config(config)
    config_names.check(cfg)
    return cfg.images


class ImageRewriteHook(CustomLogger):
    """LiteLLM callback that rewrites the images of chat requests."""

    def __init__(self, config: GatewayConfig | ImagesConfig | dict | str | None = None,
                 *, workers: int | None = None, cache_bytes: int | None = None) -> None:
        super().__init__()
        self.images = _load(config)
        n = workers or self.images.pool_workers or os.cpu_count() or 1
        self._pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="vlmgw-litellm-img")
        self._cache = _Lru(cache_bytes if cache_bytes is not None else min(self.images.l1_max_bytes, 256 << 20))
        self.stats = {"images": 0, "rewritten": 0, "cache_hits": 0, "tokens_before": 0, "tokens_after": 0,
                      "bytes_before": 0, "bytes_after": 0}

    # -- LiteLLM hooks ------------------------------------------------------------------
    async def async_pre_call_hook(self, user_api_key_dict, cache, data: dict, call_type) -> dict:
        """LiteLLM proxy: runs before the proxy routes the request."""
        if str(call_type) in _CHAT_CALLS or "completion" in str(call_type):
            await self.rewrite_request(data)
        return data

    async def async_pre_call_deployment_hook(self, kwargs: dict, call_type) -> dict:
        """litellm.acompletion / Router: runs once the deployment is chosen."""
        await self.rewrite_request(kwargs)
        return kwargs

    # -- the rewrite ----------------------------------------------------------------------
    def policy_for(self, model: str, detail: str | None) -> Policy:
        name = model if model in self.images.models else model.split("/", 1)[-1]
        p = resolve(self.images, name, "default", detail)
        # no border trim here: nothing maps the answer's coordinates back to the client's crop
        return replace(p, trim_borders=False) if self.images.enabled else Policy(enabled=False)

    async def rewrite_request(self, data: dict) -> None:
        messages = data.get("messages")
        if not isinstance(messages, list):
            return
        model = str(data.get("model") or "")
        jobs = []
        for msg in messages:
            content = msg.get("content") if isinstance(msg, dict) else None
            if not isinstance(content, list):
                continue
            for part in content:
                if isinstance(part, dict) and part.get("type") == "image_url":
                    jobs.append(self._rewrite_part(part, model))
        if jobs:
            await asyncio.gather(*jobs)

    async def _rewrite_part(self, part: dict, model: str) -> None:
        iu = part.get("image_url")
        url = iu if isinstance(iu, str) else iu.get("url") if isinstance(iu, dict) else None
        if not isinstance(url, str) or not url.startswith("data:"):
            return  # http(s) URLs: the engine fetches them
        detail = iu.get("detail") if isinstance(iu, dict) else None
        policy = self.policy_for(model, detail)
        if not data_uri.is_base64(url):
            raise litellm.BadRequestError("image_url data URI must be base64-encoded", model=model,
                                          llm_provider="vlm-gateway")
        try:
            raw = data_uri.decode(url)
        except data_uri.DataUriError:
            raise litellm.BadRequestError("image_url data URI is not valid base64", model=model,
                                          llm_provider="vlm-gateway") from None
        key = hashlib.sha256(raw).hexdigest() + "|" + policy.key
        self.stats["images"] += 1
        self.stats["bytes_before"] += len(raw)
        hit = self._cache.get(key)
        if hit is None:
            loop = asyncio.get_running_loop()
            try:
                r = await loop.run_in_executor(self._pool, rewrite_bytes, raw, policy,
                                               self.images.max_source_pixels,
                                               DecodeLimits(self.images.max_decode_bytes,
                                                           large_bytes=self.images.max_decode_bytes_large,
                                                           per_source_byte=self.images.max_decode_bytes_per_source_byte))
            except ImageError as e:
                raise litellm.BadRequestError(f"image refused: {e}", model=model,
                                              llm_provider="vlm-gateway") from None
            hit = (r.url or url, r.tokens_before, r.tokens_after)
            if not r.passthrough:
                self._cache.put(key, hit)
                self.stats["rewritten"] += 1
            self.stats["bytes_after"] += len(r.data)
        else:
            self.stats["cache_hits"] += 1
            self.stats["rewritten"] += 1
            self.stats["bytes_after"] += len(hit[0]) * 3 // 4
        new_url, before, after = hit
        self.stats["tokens_before"] += before
        self.stats["tokens_after"] += after
        if new_url is url:
            return
        if isinstance(iu, dict):
            iu["url"] = new_url
        else:
            part["image_url"] = {"url": new_url}


def _proxy_instance() -> ImageRewriteHook:
    return ImageRewriteHook(os.environ.get("VLM_GATEWAY_CONFIG") or None)


# What a LiteLLM proxy config names in ``litellm_settings.callbacks``.
proxy_handler_instance = _proxy_instance()
