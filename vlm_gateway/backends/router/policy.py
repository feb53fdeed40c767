"""The routing policy base and its registry (the package docstring: filter -> score -> pick).

    rank(req, candidates)  the candidates rotated by one every call, then stably sorted by
                           ``score`` (lower is better): equal scores share the traffic
    served(req, backend)   after a request was sent (affinity bookkeeping)
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
