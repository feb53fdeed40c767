"""What a discovery source is and what it yields.

    Target     one engine found: a stable ``name`` (the same on every gateway replica, so
               rendezvous homes agree), its base URL and the keys of a ``backends`` entry
    Discovery  ``label`` (metrics, logs) and ``run(publish)``: publish the full list of
               targets whenever it changes, until cancelled; publish nothing on a failed
               lookup
"""

from __future__ import annotations

import ipaddress
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ...config import BackendConfig

if TYPE_CHECKING:
    from ...config import DiscoveryConfig

Publish = Callable[[list["Target"]], None]


@dataclass(frozen=True)
class Target:
    name: str
    url: str
    engine: str = "openai"
    profile: str = ""
    models: tuple[str, ...] = ()
    api_key: str = ""
    metrics_format: str = "auto"

    def backend_config(self) -> BackendConfig:
        return BackendConfig(url=self.url, name=self.name, engine=self.engine, profile=self.profile,  # type: ignore[arg-type]
                             models=list(self.models), api_key=self.api_key,
                             metrics_format=self.metrics_format)  # type: ignore[arg-type]


def hostport(host: str, port: int) -> str:
    """``host:port`` with IPv6 addresses in brackets."""
    try:
        if ipaddress.ip_address(host).version == 6:
            return f"[{host}]:{port}"
    except ValueError:
        pass
    return f"{host}:{port}"


def target(entry: "DiscoveryConfig", address: str, port: int, name: str = "", **override) -> Target:
    """A target at ``address:port`` with the entry's template (``override`` wins)."""
    hp = hostport(address, port)
    fields = dict(engine=entry.engine, profile=entry.profile, models=tuple(entry.models),
                  api_key=entry.api_key, metrics_format=entry.metrics_format)
    fields.update({k: v for k, v in override.items() if v})
    return Target(name=name or hp, url=f"{entry.scheme}://{hp}{entry.path.rstrip('/')}", **fields)


class Discovery(ABC):
    label: str = ""

    @abstractmethod
    async def run(self, publish: Publish) -> None:
        """Publish the whole current list whenever it changes; return only when cancelled."""
