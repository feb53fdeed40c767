"""Routing policies behind a small registry.

A policy gets the request and the candidates that survived filtering (they serve
the model, are healthy and admit the request) and returns them best first. Each
policy lives in its own module whose docstring states its formula and parameters;
``register`` adds one, ``get_policy`` builds one by name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol

if TYPE_CHECKING:
    from ...config import RoutingConfig
    from ...core.request import ChatRequest
    from ..backend import Backend


class Policy(Protocol):
    name: str

    def rank(self, req: "ChatRequest", candidates: list["Backend"]) -> list["Backend"]: ...

    def served(self, req: "ChatRequest", backend: "Backend") -> None:
        """Called once the request was sent to ``backend`` (affinity bookkeeping)."""


_REGISTRY: dict[str, Callable[["RoutingConfig"], Policy]] = {}


def register(name: str):
    def deco(factory):
        _REGISTRY[name] = factory
        return factory
    return deco


def get_policy(name: str, cfg: "RoutingConfig") -> Policy:
    _load_builtin()
    try:
        return _REGISTRY[name](cfg)
    except KeyError:
        raise ValueError(f"unknown routing policy {name!r}; known: {', '.join(sorted(_REGISTRY))}") from None


def policy_names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def _load_builtin() -> None:
    # importing a policy module registers it
    from . import affinity, least_loaded, round_robin, text_prefix  # noqa: F401
