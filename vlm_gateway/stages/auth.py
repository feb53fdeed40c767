"""API keys -> tenants.

Keys are configured only as sha256 hex digests (``vlm-gateway hash-key KEY``), each
mapped to a tenant with its allowed models, limits and cache scope. The presented
``Authorization: Bearer`` key is hashed and compared against every configured
digest with ``hmac.compare_digest`` (no early exit), so the time taken says nothing
about which digest, or how much of one, matched.

No tenants configured = auth off: every request is tenant ``anonymous`` (the CLI
warns when such a gateway binds a non-loopback address). The tenant and its cache
scope come only from the key, never from a header the client could choose.
"""

from __future__ import annotations

import hashlib
import hmac
from ..config import AuthConfig, GatewayConfig, TenantConfig
from ..core.errors import Forbidden, Unauthorized
from ..core.request import ChatRequest
from ..core.stage import Stage
from ..core.state import Slot

ANONYMOUS = "anonymous"
# the tenant the key belongs to (absent with auth off)
TENANT: Slot[TenantConfig] = Slot("tenant")


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


def bearer(headers) -> str | None:
    """The key from ``Authorization: Bearer KEY`` (``headers``: any str->str mapping)."""
    value = headers.get("authorization")
    if not value:
        return None
    scheme, _, key = value.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    key = key.strip()
    return key or None


class KeyTable:
    """Digest -> tenant, with a constant-time scan."""

    def __init__(self, tenants: list[TenantConfig]) -> None:
        self.entries = [(bytes.fromhex(t.key_sha256.lower()), t) for t in tenants]

    def lookup(self, key: str) -> TenantConfig | None:
        digest = hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()
        found = None
        for d, t in self.entries:
            if hmac.compare_digest(d, digest) and found is None:
                found = t
        return found


def authenticate(table: KeyTable, headers) -> TenantConfig:
    """The tenant for these request headers, or raise 401 (the key never appears in the error)."""
    key = bearer(headers)
    if key is None:
        raise Unauthorized("Missing API key: send it as 'Authorization: Bearer <key>'",
                           code="missing_api_key", reason="missing_api_key")
    tenant = table.lookup(key)
    if tenant is None:
        raise Unauthorized("Invalid API key", code="invalid_api_key", reason="invalid_api_key")
    return tenant


def scope_of(t: TenantConfig) -> str:
    # Namespaced so that a tenant named like another tenant's explicit scope cannot collide.
    return f"scope:{t.cache_scope}" if t.cache_scope else f"tenant:{t.name}"


def check_admin(auth: AuthConfig, headers, what: str = "admin endpoints", open_without_key: bool = False) -> None:
    """The one admin check (``/admin/*`` and the ``/ui`` APIs): 401 without a key, 403
    with a key that is not the admin key. Without a configured admin key: 403 (there is
    none to send), or no check at all where ``open_without_key`` (the /ui APIs, which are
    then served only while API keys are off: ``proxy/app.ui_served``)."""
    digest = auth.admin_key_sha256
    if not digest:
        if open_without_key:
            return
        raise Forbidden(f"The {what} are off: no admin key is configured (auth.admin_key_sha256)",
                        code="admin_disabled", reason="admin_disabled")
    key = bearer(headers)
    if key is None:
        raise Unauthorized(f"The {what} need the admin key: send it as 'Authorization: Bearer <key>'",
                           code="missing_api_key", reason="missing_api_key")
    if not hmac.compare_digest(bytes.fromhex(digest.lower()),
                               hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()):
        raise Forbidden(f"This key may not use the {what}", code="admin_key_required",
                        reason="admin_key_required")


def check_model_access(t: TenantConfig, model: str) -> None:
    if t.models and model not in t.models:
        raise Forbidden(f"This API key may not use the model '{model}'", param="model",
                        code="model_not_allowed", reason="model_not_allowed")


class Auth(Stage):
    """Bearer key -> tenant (401/403); sets ``req.tenant``, ``req.cache_scope`` and ``TENANT``."""

    name = "auth"

    def __init__(self, tenants: list[TenantConfig]) -> None:
        self.table = KeyTable(tenants)  # reused by /v1/models

    @classmethod
    def from_config(cls, cfg: GatewayConfig, shared) -> "Auth | None":
        return cls(cfg.auth.tenants) if cfg.auth.tenants else None

    async def __call__(self, req: ChatRequest):
        t = authenticate(self.table, req.headers)
        check_model_access(t, req.model)
        req.tenant = t.name
        req.cache_scope = scope_of(t)
        req.state[TENANT] = t
        return None


def visible_models(table: KeyTable, headers, names: list[str]) -> list[str]:
    """GET /v1/models with auth on: 401 without a valid key, else the key's allowed models."""
    t = authenticate(table, headers)
    return [m for m in names if not t.models or m in t.models]
