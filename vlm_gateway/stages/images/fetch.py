"""Safe fetch of an http(s) media URL (images, video, audio: one policy).

Every hop is resolved here and each address checked (private, loopback,
link-local, multicast, reserved, unspecified and IPv4-mapped/-embedded forms are
refused unless ``allow_private_networks``); the request then goes to that checked
IP with the original Host header and TLS server name, so a DNS answer that
changes between check and connect (rebinding) cannot slip past. Redirects are
followed by hand (max ``max_redirects``), each re-checked. The body is capped
while streaming (per call: the cap of the media kind, or what is left of the
request's total) and every byte is reported to ``on_chunk`` before it is kept (a
declared Content-Length all at once, before the body streams), so the caller can
count it against its limits; the whole fetch has one deadline.
A strong ``ETag`` from an earlier fetch can be sent back (``If-None-Match``):
a 304 answer returns no bytes.

Error codes name the kind (``image_url_private_address``,
``video_too_large``, ...); the private-address message says which settings allow it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass, field
from typing import Callable
from urllib.parse import urljoin, urlsplit, urlunsplit

import aiohttp


class FetchError(ValueError):
    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


PRIVATE_HINT = ("to allow it, set images.allow_private_networks: true (environment "
                "VLM_GATEWAY_IMAGES__ALLOW_PRIVATE_NETWORKS=true) or list its network in images.allow_networks "
                "(VLM_GATEWAY_IMAGES__ALLOW_NETWORKS='[\"10.0.0.0/8\"]')")


@dataclass(slots=True)
class Fetched:
    """A fetch's outcome; ``data`` None = 304, the content behind ``etag`` is unchanged."""

    data: bytes | None
    content_type: str = ""
    # a strong validator only (byte-identical content), "" otherwise
    etag: str = ""


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


async def _resolve(host: str, port: int, allow_private: bool, exempt: list, what: str = "image") -> str:
    try:
        literal = ipaddress.ip_address(host.strip("[]"))
        addrs = [literal]
    except ValueError:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror:
            raise FetchError(f"the {what} host {host!r} does not resolve", f"{what}_fetch_dns") from None
        addrs = [ipaddress.ip_address(i[4][0].split("%")[0]) for i in infos]
    if not addrs:
        raise FetchError(f"the {what} host {host!r} does not resolve", f"{what}_fetch_dns")
    if not allow_private:
        # refuse when ANY answer is private: the connection could be steered to it
        for a in addrs:
            if ip_refused(a) and not any(a.version == n.version and a in n for n in exempt):
                raise FetchError(f"the {what} URL points to a private or reserved address ({host}); "
                                 + PRIVATE_HINT, f"{what}_url_private_address")
    ip = addrs[0]
    return f"[{ip}]" if ip.version == 6 else str(ip)


def check_url(url: str, policy: FetchPolicy, what: str = "image") -> tuple[str, str, int]:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise FetchError(f"the {what} URL is malformed", f"invalid_{what}_url") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FetchError(f"the {what} URL must be http(s) or a data: URI", f"invalid_{what}_url")
    host = parts.hostname
    if policy.deny_domains and _domain_match(host, policy.deny_domains):
        raise FetchError(f"the {what} host {host!r} is denied by the gateway's policy", f"{what}_url_denied")
    if policy.allow_domains and not _domain_match(host, policy.allow_domains):
        raise FetchError(f"the {what} host {host!r} is not on the gateway's allow list", f"{what}_url_denied")
    return parts.scheme, host, port or (443 if parts.scheme == "https" else 80)


def _exempt(policy: FetchPolicy) -> list:
    return [ipaddress.ip_network(n, strict=False) for n in policy.allow_networks]


async def check_address(url: str, policy: FetchPolicy, what: str = "image") -> None:
    """The whole policy for a URL that is not fetched here (``url_mode: passthrough``):
    scheme, domain lists and the address guard on what the host resolves to now. The
    engine parses the URL again, so forms that URL parsers read differently (user
    info, backslashes, spaces, control characters) are refused."""
    _scheme, host, port = check_url(url, policy, what)
    if any(c.isspace() or ord(c) < 32 or c == "\\" for c in url) or "@" in urlsplit(url).netloc:
        raise FetchError(f"the {what} URL has user info, spaces, backslashes or control characters, which "
                         "URL parsers read differently", f"invalid_{what}_url")
    await _resolve(host, port, policy.allow_private_networks, _exempt(policy), what)


def _strong(etag: str | None) -> str:
    return etag if etag and etag.startswith('"') and etag.endswith('"') and len(etag) <= 256 else ""


async def _fetch(session: aiohttp.ClientSession, url: str, policy: FetchPolicy, max_bytes: int, what: str,
                 accept: str, on_chunk: Callable[[int], None] | None, etag: str) -> Fetched:
    exempt = _exempt(policy)
    for _hop in range(policy.max_redirects + 1):
        scheme, host, port = check_url(url, policy, what)
        ip = await _resolve(host, port, policy.allow_private_networks, exempt, what)
        parts = urlsplit(url)
        netloc = f"{ip}:{port}"
        target = urlunsplit((scheme, netloc, parts.path or "/", parts.query, ""))
        host_header = host if parts.port is None else f"{host}:{parts.port}"
        if ":" in host and not host.startswith("["):
            host_header = f"[{host}]" if parts.port is None else f"[{host}]:{parts.port}"
        kw = {"server_hostname": host} if scheme == "https" else {}
        headers = {"Host": host_header, "Accept": accept}
        if etag:
            headers["If-None-Match"] = etag
        async with session.get(target, headers=headers, allow_redirects=False, **kw) as resp:
            if resp.status in (301, 302, 303, 307, 308):
                loc = resp.headers.get("location")
                if not loc:
                    raise FetchError(f"the {what} URL redirected without a location (HTTP {resp.status})",
                                     f"{what}_fetch_failed")
                url = urljoin(url, loc)
                continue
            if resp.status == 304 and etag and _strong(resp.headers.get("etag")) in ("", etag):
                return Fetched(None, etag=etag)
            if resp.status != 200:
                raise FetchError(f"fetching the {what} URL failed with HTTP {resp.status}", f"{what}_fetch_failed")
            declared = resp.content_length
            if declared is not None and declared > max_bytes:
                raise FetchError(f"the {what} at the URL is {declared} bytes, above the limit of "
                                 f"{max_bytes}", f"{what}_too_large")
            chunks, size, reported = [], 0, 0
            if on_chunk is not None and declared:
                # a declared body is counted whole before it streams: concurrent fetches then
                # take the bound first come, first served instead of all starving half-way
                on_chunk(declared)
                reported = declared
            async for chunk in resp.content.iter_chunked(256 * 1024):
                size += len(chunk)
                if size > max_bytes:
                    raise FetchError(f"the {what} at the URL is larger than the limit of {max_bytes} bytes",
                                     f"{what}_too_large")
                if on_chunk is not None and size > reported:
                    on_chunk(size - reported)
                    reported = size
                chunks.append(chunk)
            return Fetched(b"".join(chunks), resp.headers.get("content-type", ""),
                           _strong(resp.headers.get("etag")))
    raise FetchError(f"the {what} URL redirected more than {policy.max_redirects} times", f"{what}_fetch_redirects")


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
        """An image's bytes under the policy's own cap."""
        got = await self.get(url)
        assert got.data is not None
        return got.data

    async def get(self, url: str, *, max_bytes: int | None = None, what: str = "image", accept: str = "image/*",
                  on_chunk: Callable[[int], None] | None = None, etag: str = "") -> Fetched:
        """Fetch under the policy; ``max_bytes`` (default the policy's) caps the body,
        ``on_chunk(n)`` sees every chunk before it is kept (it may raise to stop)."""
        cap = self.policy.max_bytes if max_bytes is None else max_bytes
        try:
            async with asyncio.timeout(self.policy.timeout_s):
                return await _fetch(self._get_session(), url, self.policy, cap, what, accept, on_chunk, etag)
        except TimeoutError:
            raise FetchError(f"fetching the {what} URL timed out after {self.policy.timeout_s:g} s",
                             f"{what}_fetch_timeout") from None
        except FetchError:
            raise
        except (aiohttp.ClientError, OSError, ValueError) as e:
            raise FetchError(f"fetching the {what} URL failed ({type(e).__name__})", f"{what}_fetch_failed") from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
