"""Backend discovery: sources that list engines at run time, beside the static ``backends``.

Contract (``source.Discovery``): a source's ``run(publish)`` calls ``publish(targets)``
with the *whole* current list every time it changes, and runs until cancelled; a lookup
that fails publishes nothing (the last list stands), so a DNS or API-server hiccup never
empties the pool. Implementations, one module each:

    static      a fixed list (the shape of ``backends``; also the seam tests push lists through)
    dns         A/AAAA records of a name on a configured port, or SRV records with their
                ports, re-resolved every ``interval_s`` (dnspython)
    kubernetes  the ready endpoints of a Service's EndpointSlices, list + watch
                (kubernetes-asyncio), profile/engine/models from the Pods' labels/annotations

``reconcile.Reconciler`` merges the sources' lists and applies the difference to the pool:
new names are started, probed and scraped (``Pool.add``); names that left are drained (no
new requests; in-flight ones finish) and removed once idle (``Pool.remove``); a name that
comes back while draining is taken back as it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .source import Discovery, Target

if TYPE_CHECKING:
    from ...config import DiscoveryConfig

__all__ = ["Discovery", "Target", "build"]


def build(entry: "DiscoveryConfig") -> Discovery:
    """The source for one ``discovery`` entry."""
    if entry.kind in ("dns", "srv"):
        from .dns import DnsDiscovery
        return DnsDiscovery(entry)
    if entry.kind == "kubernetes":
        from .kubernetes import KubernetesDiscovery
        return KubernetesDiscovery(entry)
    raise ValueError(f"unknown discovery kind {entry.kind!r}")
