"""The config keys whose valid values the backends define, checked after the base
layer's value rules (``config_values.check``) and before the gateway listens:

    routing.policy          a registered routing policy (``router.policy_names``)
    profiles                GPU profile entries over the shipped table (``profiles.load_profiles``)
    backends[].profile      a GPU profile, shipped or under ``profiles`` ("" = none)
    discovery[].profile     the same
    simulator.profile       a simulator profile (``sim/profiles.yaml``)

``check(cfg)`` raises ``ConfigError("<key>: <what is wrong>")`` for the first bad name,
as ``config_values.check`` does for values; ``vlm_gateway.load_config`` runs both, so
the base layer never asks this one for its names.
"""

from __future__ import annotations

from ..config import ConfigError, GatewayConfig
from .profiles import load_profiles
from .router import policy_names
from .sim.profiles import profile_names


def check(cfg: GatewayConfig) -> None:
    policies = policy_names()
    if cfg.routing.policy not in policies:
        raise ConfigError(f"routing.policy: expected one of {', '.join(policies)}, got {cfg.routing.policy!r}")
    gpus = sorted(load_profiles(cfg.profiles))  # raises ConfigError naming profiles.<name>.<key>
    for section, entries in (("backends", cfg.backends), ("discovery", cfg.discovery)):
        for i, entry in enumerate(entries):
            if entry.profile and entry.profile not in gpus:
                raise ConfigError(f"{section}[{i}].profile: unknown GPU profile {entry.profile!r}; "
                                  f"known: {', '.join(gpus)} (or add it under profiles)")
    sims = profile_names()
    if cfg.simulator.profile not in sims:
        raise ConfigError(f"simulator.profile: unknown simulator profile {cfg.simulator.profile!r}; "
                          f"known: {', '.join(sims)}")
