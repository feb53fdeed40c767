"""What a web page may make a browser do to the gateway.

- **Host** (DNS rebinding): a page on ``attacker.example`` whose name is re-pointed
  at 127.0.0.1 is same-origin with the gateway as far as the browser knows, and
  could read ``/ui/api/status``. Requests are answered only for Host names the
  gateway knows: ``localhost`` and ``*.localhost``, IP addresses (a page cannot
  re-point an address), this machine's host name and ``server.allowed_hosts``
  (``name``, ``*.domain``, or ``*`` for any). Others get 400 ``host_not_allowed``.
  ``/health`` and ``/ready`` answer any Host: probes address the gateway by
  whatever name their platform gives it, and they carry nothing to read.
- **Origin** (cross-site requests): a request with an ``Origin`` header is served
  only when that origin is the gateway's own (same host and port: the ``/ui``
  playground) or listed in ``server.allowed_origins`` (CORS headers are then added
  by Starlette's ``CORSMiddleware``); others get 403 ``origin_not_allowed``, before
  any route runs.

The JSON-only rule of the POST routes (415) is in ``proxy/body.py``.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from ... import metrics
from ...core.errors import error_bytes
from .exchange import exchange

PROBE_PATHS = frozenset({"/health", "/ready"})
_DEFAULT_PORTS = {"http": 80, "https": 443}


def split_host(value: str) -> tuple[str, int | None]:
    """``Host`` header -> (lower-case name without brackets or trailing dot, port)."""
    value = value.strip().lower()
    port: int | None = None
    if value.startswith("["):
        end = value.find("]")
        name, rest = value[1:end], value[end + 1:]
        if rest.startswith(":") and rest[1:].isdigit():
            port = int(rest[1:])
    elif value.count(":") == 1:
        name, _, p = value.partition(":")
        port = int(p) if p.isdigit() else None
    else:
        name = value
    return name.rstrip("."), port


def _is_ip(name: str) -> bool:
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in name else socket.AF_INET, name)
        return True
    except OSError:
        return False


def own_names(bind_host: str) -> set[str]:
    """This machine's host name (not its FQDN: that needs a DNS lookup, which can hang at
    start-up; list such names in server.allowed_hosts), and the bind address when it is a name."""
    names = set()
    try:
        names.add(socket.gethostname().lower().rstrip("."))
    except OSError:
        pass
    if bind_host and not _is_ip(bind_host):
        names.add(bind_host.lower().rstrip("."))
    return {n for n in names if n}


class HostPolicy:
    def __init__(self, allowed: list[str], extra_names: set[str]) -> None:
        self.any = "*" in allowed
        self.exact = {a.lower().rstrip(".") for a in allowed if not a.startswith("*")} | extra_names
        self.suffixes = tuple("." + a[2:].lower().rstrip(".") for a in allowed if a.startswith("*."))

    def allows(self, name: str) -> bool:
        return (self.any or name == "localhost" or name.endswith(".localhost") or _is_ip(name)
                or name in self.exact or name.endswith(self.suffixes))


def _origin_key(origin: str) -> tuple[str, str, int] | None:
    try:
        p = urlsplit(origin.strip().lower())
        port = p.port
    except ValueError:
        return None
    if p.scheme not in _DEFAULT_PORTS or not p.hostname:
        return None
    return p.scheme, p.hostname.rstrip("."), port or _DEFAULT_PORTS[p.scheme]


class OriginPolicy:
    def __init__(self, allowed: list[str]) -> None:
        self.any = "*" in allowed
        self.listed = {k for k in (_origin_key(a) for a in allowed if a != "*") if k is not None}

    def allows(self, origin: str, host_header: str) -> bool:
        if self.any:
            return True
        key = _origin_key(origin)
        if key is None:  # "null" (sandboxed frames, file://) or garbage
            return False
        if key in self.listed:
            return True
        # same origin: the page was served by this gateway under the same host and port
        name, port = split_host(host_header)
        return bool(name) and key[1] == name and key[2] == (port or _DEFAULT_PORTS[key[0]])


async def _refuse(scope, send, status: int, message: str, etype: str, code: str) -> None:
    metrics.REJECTIONS.labels(str(status), code).inc()
    exchange(scope).error = code  # for the access log line
    body = error_bytes(status, message, etype, code)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class BrowserGuardMiddleware:
    def __init__(self, app, allowed_hosts: list[str], allowed_origins: list[str], bind_host: str = "") -> None:
        self.app = app
        self.hosts = HostPolicy(allowed_hosts, own_names(bind_host))
        self.origins = OriginPolicy(allowed_origins)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = origin = None
        for k, v in scope["headers"]:
            if k == b"host":
                host = v.decode("latin-1")
            elif k == b"origin":
                origin = v.decode("latin-1")
        if host is not None and scope.get("path") not in PROBE_PATHS:
            name, _ = split_host(host)
            if not self.hosts.allows(name):
                await _refuse(scope, send, 400, f"Host '{name[:100]}' is not a name this gateway answers to; "
                              "add it to server.allowed_hosts", "invalid_request_error", "host_not_allowed")
                return
        if origin is not None and not self.origins.allows(origin, host or ""):
            await _refuse(scope, send, 403, f"Requests from the web origin '{origin[:100]}' are not allowed; "
                          "add it to server.allowed_origins", "permission_error", "origin_not_allowed")
            return
        await self.app(scope, receive, send)
