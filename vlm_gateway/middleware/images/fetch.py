"""Safe fetch of an http(s) image URL.

Every hop is resolved here and each address checked (private, loopback,
link-local, multicast, reserved, unspecified and IPv4-mapped/-embedded forms are
refused unless ``allow_private_networks``); the request then goes to that checked
IP with the original Host header and TLS server name, so a DNS answer that
changes between check and connect (rebinding) cannot slip past. Redirects are
followed by hand (max ``max_redirects``), each re-checked. The body is capped
while streaming; the whole fetch has one deadline.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass, field
from urllib.parse import urljoin, urlsplit, urlunsplit

import aiohttp


class FetchError(ValueError):
    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class FetchPolicy:
    timeout_s: float = 5.0
    max_bytes: int = 20 * 1024 * 1024
    max_redirects: int = 3
    allow_private_networks: bool = False
    # CIDRs exempt from the private-address guard (an internal image store)
    allow_networks: list[str] = field(default_factory=list)
    allow_domains: list[str] = field(default_factory=list)
    deny_domains: list[str] = field(default_factory=list)


def _domain_match(host: str, patterns: list[str]) -> bool:
    host = host.lower().rstrip(".")
    for p in patterns:
        p = p.lower().strip().lstrip("*").lstrip(".").rstrip(".")
        if p and (host == p or host.endswith("." + p)):
            return True
    return False


def ip_refused(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """True for anything that is not a plain public unicast address."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if embedded is not None and ip_refused(embedded):
            return True
        # IPv4-compatible (::a.b.c.d) and NAT64 (64:ff9b::/96) forms
        if ip in ipaddress.ip_network("::/96") or ip in ipaddress.ip_network("64:ff9b::/96"):
            return ip_refused(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)) or int(ip) >> 32 == 0
    return (ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_multicast or ip.is_reserved
            or ip.is_unspecified or not ip.is_global)


async def _resolve(host: str, port: int, allow_private: bool, exempt: list) -> str:
    try:
        literal = ipaddress.ip_address(host.strip("[]"))
        addrs = [literal]
    except ValueError:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror:
            raise FetchError(f"the image host {host!r} does not resolve", "image_fetch_dns") from None
        addrs = [ipaddress.ip_address(i[4][0].split("%")[0]) for i in infos]
    if not addrs:
        raise FetchError(f"the image host {host!r} does not resolve", "image_fetch_dns")
    if not allow_private:
        # refuse when ANY answer is private: the connection could be steered to it
        for a in addrs:
            if ip_refused(a) and not any(a.version == n.version and a in n for n in exempt):
                raise FetchError(f"the image URL points to a private or reserved address ({host})",
                                 "image_url_private_address")
    ip = addrs[0]
    return f"[{ip}]" if ip.version == 6 else str(ip)


def check_url(url: str, policy: FetchPolicy) -> tuple[str, str, int]:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise FetchError("the image URL is malformed", "invalid_image_url") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FetchError("the image URL must be http(s) or a data: URI", "invalid_image_url")
    host = parts.hostname
    if policy.deny_domains and _domain_match(host, policy.deny_domains):
        raise FetchError(f"the image host {host!r} is denied by the gateway's policy", "image_url_denied")
    if policy.allow_domains and not _domain_match(host, policy.allow_domains):
        raise FetchError(f"the image host {host!r} is not on the gateway's allow list", "image_url_denied")
    return parts.scheme, host, port or (443 if parts.scheme == "https" else 80)


async def _fetch(session: aiohttp.ClientSession, url: str, policy: FetchPolicy) -> bytes:
    exempt = [ipaddress.ip_network(n, strict=False) for n in policy.allow_networks]
    for _hop in range(policy.max_redirects + 1):
        scheme, host, port = check_url(url, policy)
        ip = await _resolve(host, port, policy.allow_private_networks, exempt)
        parts = urlsplit(url)
        netloc = f"{ip}:{port}"
        target = urlunsplit((scheme, netloc, parts.path or "/", parts.query, ""))
        host_header = host if parts.port is None else f"{host}:{parts.port}"
        if ":" in host and not host.startswith("["):
            host_header = f"[{host}]" if parts.port is None else f"[{host}]:{parts.port}"
        kw = {"server_hostname": host} if scheme == "https" else {}
        async with session.get(target, headers={"Host": host_header, "Accept": "image/*"},
                               allow_redirects=False, **kw) as resp:
            if resp.status in (301, 302, 303, 307, 308):
                loc = resp.headers.get("location")
                if not loc:
                    raise FetchError(f"the image URL redirected without a location (HTTP {resp.status})",
                                     "image_fetch_failed")
                url = urljoin(url, loc)
                continue
            if resp.status != 200:
                raise FetchError(f"fetching the image URL failed with HTTP {resp.status}", "image_fetch_failed")
            declared = resp.content_length
            if declared is not None and declared > policy.max_bytes:
                raise FetchError(f"the image at the URL is {declared} bytes, above the limit of "
                                 f"{policy.max_bytes}", "image_too_large")
            chunks, size = [], 0
            async for chunk in resp.content.iter_chunked(256 * 1024):
                size += len(chunk)
                if size > policy.max_bytes:
                    raise FetchError(f"the image at the URL is larger than the limit of {policy.max_bytes} bytes",
                                     "image_too_large")
                chunks.append(chunk)
            return b"".join(chunks)
    raise FetchError(f"the image URL redirected more than {policy.max_redirects} times", "image_fetch_redirects")


class Fetcher:
    """One shared client session for image fetches (no connection reuse: each
    fetch connects to the IP it just checked)."""

    def __init__(self, policy: FetchPolicy) -> None:
        self.policy = policy
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(force_close=True, use_dns_cache=False, limit=256)
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=True,
                                                  cookie_jar=aiohttp.DummyCookieJar(), trust_env=False)
        return self._session

    async def fetch(self, url: str) -> bytes:
        try:
            async with asyncio.timeout(self.policy.timeout_s):
                return await _fetch(self._get_session(), url, self.policy)
        except TimeoutError:
            raise FetchError(f"fetching the image URL timed out after {self.policy.timeout_s:g} s",
                             "image_fetch_timeout") from None
        except FetchError:
            raise
        except (aiohttp.ClientError, OSError, ValueError) as e:
            raise FetchError(f"fetching the image URL failed ({type(e).__name__})", "image_fetch_failed") from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
