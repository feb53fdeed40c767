"""Routing: filter -> score -> pick, with the policies behind a small registry.

    filter  ``Pool.candidates``: the backends that serve the model, are available
            (healthy, breaker closed or half-open, not drained) and that the profile
            filter (``admission.ProfileFilter``) admits
    score   ``Policy.score``: a number per candidate, lower is better (load, ...)
    pick    ``Policy.rank``: the candidates best first -- rotated by one every call,
            then stably sorted by score, so equal scores share the traffic; the pool
            takes the first with a free slot

A policy is a ``Policy`` subclass in its own module whose docstring states its
formula and parameters (``policy.py``: the base and ``register``), imported below;
``get_policy`` builds one by name.
``served`` is called once a request was sent (affinity bookkeeping).
"""

from __future__ import annotations

from ...config import RoutingConfig
# importing a policy module registers it
from . import affinity, least_loaded, round_robin, text_prefix  # noqa: F401
from .policy import _REGISTRY, Policy, register

__all__ = ["Policy", "register", "get_policy", "policy_names"]


def get_policy(name: str, cfg: RoutingConfig) -> Policy:
    try:
        return _REGISTRY[name](cfg)
    except KeyError:
        raise ValueError(f"unknown routing policy {name!r}; known: {', '.join(sorted(_REGISTRY))}") from None


def policy_names() -> list[str]:
    return sorted(_REGISTRY)
