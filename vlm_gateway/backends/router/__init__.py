"""Routing: filter -> score -> pick, with the policies behind a small registry.

    filter  ``Pool.candidates``: the backends that serve the model, are available
            (healthy, breaker closed or half-open, not drained) and that the profile
            filter (``admission.ProfileFilter``) admits
    score   ``Policy.score``: a number per candidate, lower is better (load, ...)
    pick    ``Policy.rank``: the candidates best first -- rotated by one every call,
            then stably sorted by score, so equal scores share the traffic; the pool
            takes the first with a free slot

A policy is a ``Policy`` subclass in its own module whose docstring states its
formula and parameters; ``register`` adds one, ``get_policy`` builds one by name.
``served`` is called once a request was sent (affinity bookkeeping).
"""

from __future__ import annotations

import itertools
from typing import Callable

from ...config import RoutingConfig
from ...core.request import ChatRequest
from ..backend import Backend


class Policy:
    name = "policy"

    def __init__(self, cfg: RoutingConfig | None = None) -> None:
        self._turn = itertools.count()

    def score(self, req: ChatRequest, b: Backend) -> float:
        """Lower is better; the base scores every candidate the same."""
        return 0.0

    def rank(self, req: ChatRequest, candidates: list[Backend]) -> list[Backend]:
        n = len(candidates)
        if n <= 1:
            return list(candidates)
        i = next(self._turn) % n
        rotated = candidates[i:] + candidates[:i]
        if type(self).score is Policy.score:
            return rotated
        return sorted(rotated, key=lambda b: self.score(req, b))

    def served(self, req: ChatRequest, backend: Backend) -> None:
        return None


_REGISTRY: dict[str, Callable[[RoutingConfig], Policy]] = {}


def register(name: str):
    def deco(factory):
        _REGISTRY[name] = factory
        return factory
    return deco


def get_policy(name: str, cfg: RoutingConfig) -> Policy:
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
