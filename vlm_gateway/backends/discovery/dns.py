"""dns and srv: engines listed by DNS, re-resolved every ``interval_s``.

    dns   targets = {address:port | address in A/AAAA(dns_name)}      port from the config
    srv   targets = {address:rr.port | rr in SRV(dns_name), address in A/AAAA(rr.target)}

A Kubernetes headless Service (its name resolves to the ready pods' IPs; named ports also
publish ``_port._tcp.svc`` SRV records), Consul (``NAME.service.consul``, SRV with ports) and
plain round-robin DNS all fit. Names: ``address:port`` for dns; ``target:port`` for srv when
the target has one address (``address:port`` otherwise), so every replica names a backend
alike. SRV priority and weight are not applied: the router balances by measured load.

Answers: NXDOMAIN or no records is an authoritative empty list (the backends are drained);
a timeout or a server failure is no answer (the last list stands, the error is counted).
Resolution uses dnspython's asyncio resolver (the standard library cannot ask for SRV
records or a chosen server), with the system's resolv.conf and search domains unless
``nameservers`` is set; no answer caching, so a change shows within one interval.
"""

from __future__ import annotations

import asyncio
import logging

import dns.asyncresolver
import dns.exception
import dns.nameserver
import dns.rdatatype
import dns.resolver

from ... import metrics
from .source import Discovery, Publish, Target, target

log = logging.getLogger("vlm_gateway.discovery")

_EMPTY = (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer)


def parse_nameserver(spec: str) -> tuple[str, int]:
    """``host``, ``host:port``, ``[v6]:port`` or a bare IPv6 address -> (host, port)."""
    if spec.startswith("["):
        host, _, rest = spec[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") else 53
    if spec.count(":") == 1:
        host, port = spec.split(":")
        return host, int(port)
    return spec, 53


class DnsDiscovery(Discovery):
    def __init__(self, entry, resolver: dns.asyncresolver.Resolver | None = None) -> None:
        self.entry = entry
        self.label = f"{entry.kind}:{entry.dns_name}"
        if resolver is None:
            resolver = dns.asyncresolver.Resolver(configure=not entry.nameservers)
            if entry.nameservers:
                resolver.nameservers = [dns.nameserver.Do53Nameserver(*parse_nameserver(s))
                                        for s in entry.nameservers]
        self.resolver = resolver
        self.lifetime = max(0.5, min(5.0, entry.interval_s))
        fam = entry.address_family
        self.rdtypes = (["A"] if fam != "ipv6" else []) + (["AAAA"] if fam != "ipv4" else [])

    async def _addresses(self, name: str) -> list[str]:
        """Addresses of ``name``; raises on a failed lookup (not on an empty answer)."""
        out: list[str] = []
        for rdtype in self.rdtypes:
            try:
                answer = await self.resolver.resolve(name, rdtype, search=True, lifetime=self.lifetime)
            except _EMPTY:
                continue
            out.extend(r.address for r in answer)
        return sorted(set(out))

    async def resolve(self) -> list[Target]:
        """The current targets; raises dns.exception.DNSException when the lookup failed."""
        e = self.entry
        if e.kind == "dns":
            return [target(e, a, e.port) for a in await self._addresses(e.dns_name)]
        try:
            answer = await self.resolver.resolve(e.dns_name, "SRV", search=True, lifetime=self.lifetime)
        except _EMPTY:
            return []
        extra = _additional_addresses(answer, self.rdtypes)
        found: dict[str, Target] = {}
        for rr in answer:
            host = rr.target.to_text(omit_final_dot=True)
            addrs = extra.get(host.lower()) or await self._addresses(rr.target.to_text())
            for a in addrs:
                t = target(e, a, rr.port, name=f"{host}:{rr.port}" if len(addrs) == 1 else "")
                found[t.name] = t
        return sorted(found.values(), key=lambda t: t.name)

    async def run(self, publish: Publish) -> None:
        last: list[Target] | None = None
        while True:
            try:
                now = await self.resolve()
            except (dns.exception.DNSException, OSError) as exc:
                metrics.DISCOVERY_ERRORS.labels(self.label).inc()
                log.warning("discovery %s: lookup failed (%s); keeping %s backend(s)", self.label,
                            type(exc).__name__, "no" if last is None else len(last))
            else:
                if now != last:
                    last = now
                    publish(now)
            await asyncio.sleep(self.entry.interval_s)


def _additional_addresses(answer, rdtypes: list[str]) -> dict[str, list[str]]:
    """Addresses the server put in the SRV answer's additional section, by target name."""
    wanted = {dns.rdatatype.from_text(t) for t in rdtypes}
    out: dict[str, list[str]] = {}
    for rrset in answer.response.additional:
        if rrset.rdtype in wanted:
            out.setdefault(rrset.name.to_text(omit_final_dot=True).lower(), []).extend(r.address for r in rrset)
    return {k: sorted(set(v)) for k, v in out.items()}
