"""The ready endpoints of one Service, from its EndpointSlices (discovery.k8s.io/v1).

State: slice name -> its endpoints, replaced by a list (``reset``) and updated by watch
events (``apply``: ADDED and MODIFIED replace the slice, DELETED drops it, BOOKMARK only
moves the resource version). An endpoint is used when

    conditions.ready is not false      (the API: "a nil value should be interpreted as true";
                                        terminating endpoints are ready=false)
    addressType is IPv4 or IPv6        (FQDN slices are skipped)
    the slice has the wanted port      (by name, or its only/first port)

and is identified by ``addresses[0]:port`` (the API: addresses "are assumed to be fungible
and clients may choose to only use the first element"). An endpoint listed by two slices
(it moves between them during updates) counts once. Pure data in, data out: the watch
client lives in ``kubernetes.py``, and tests drive this with recorded event streams.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Endpoint:
    address: str
    port: int
    pod: str = ""        # targetRef.name when it is a Pod
    pod_uid: str = ""
    node: str = ""
    zone: str = ""


def _port(slice_obj: dict, port_name: str) -> int | None:
    ports = slice_obj.get("ports") or []
    for p in ports:
        if not isinstance(p, dict) or p.get("port") is None:
            continue
        if (p.get("protocol") or "TCP") != "TCP":
            continue
        if not port_name or p.get("name") == port_name:
            return int(p["port"])
    return None


def ready_endpoints(slice_obj: dict, port_name: str = "") -> list[Endpoint]:
    if slice_obj.get("addressType") not in ("IPv4", "IPv6"):
        return []
    port = _port(slice_obj, port_name)
    if port is None:
        return []
    out = []
    for ep in slice_obj.get("endpoints") or []:
        if not isinstance(ep, dict) or not ep.get("addresses"):
            continue
        if (ep.get("conditions") or {}).get("ready") is False:
            continue
        ref = ep.get("targetRef") or {}
        is_pod = ref.get("kind") == "Pod"
        out.append(Endpoint(address=ep["addresses"][0], port=port,
                            pod=ref.get("name", "") if is_pod else "", pod_uid=ref.get("uid", "") if is_pod else "",
                            node=ep.get("nodeName", "") or "", zone=ep.get("zone", "") or ""))
    return out


class SliceSet:
    def __init__(self, port_name: str = "") -> None:
        self.port_name = port_name
        self.slices: dict[str, list[Endpoint]] = {}
        self.resource_version = ""

    def reset(self, items: list[dict[str, Any]], resource_version: str = "") -> None:
        self.slices = {}
        for obj in items:
            self._put(obj)
        self.resource_version = resource_version

    def _put(self, obj: dict) -> None:
        name = (obj.get("metadata") or {}).get("name", "")
        self.slices[name] = ready_endpoints(obj, self.port_name)

    def apply(self, event_type: str, obj: dict) -> bool:
        """Apply one watch event; True when the endpoint list may have changed."""
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if rv:
            self.resource_version = rv
        if event_type in ("ADDED", "MODIFIED"):
            self._put(obj)
            return True
        if event_type == "DELETED":
            self.slices.pop((obj.get("metadata") or {}).get("name", ""), None)
            return True
        return False   # BOOKMARK

    def endpoints(self) -> list[Endpoint]:
        seen: dict[tuple[str, int], Endpoint] = {}
        for name in sorted(self.slices):
            for ep in self.slices[name]:
                seen.setdefault((ep.address, ep.port), ep)
        return sorted(seen.values(), key=lambda e: (e.pod or e.address, e.port))
