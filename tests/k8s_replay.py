"""Replays recorded Kubernetes API responses on loopback, so the discovery code runs through
the real kubernetes-asyncio client (kubeconfig, list, watch stream, pod reads) without an
API server. It is a test instrument: it serves what a fixture holds and logs what it was
asked, nothing more.

    GET /apis/discovery.k8s.io/v1/namespaces/NS/endpointslices          -> ``list_doc``
    GET ... ?watch=true                                                   -> the events the test
        pushes (``push``), one JSON object per line, until ``end_watch`` (server-side timeout)
        or an ERROR event
    GET /api/v1/namespaces/NS/pods/NAME                                  -> ``pods[NAME]`` or 404
"""

from __future__ import annotations

import asyncio
import json
import os

from aiohttp import web

_END = object()


class K8sReplay:
    def __init__(self, list_doc: dict, pods: dict[str, dict]) -> None:
        self.list_doc = list_doc
        self.pods = pods
        self.requests: list[tuple[str, dict[str, str], str]] = []   # (path, query, authorization)
        self.pod_reads: list[str] = []
        self._events: asyncio.Queue = asyncio.Queue()
        self.watching = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.port = 0

    # -- what the test does ----------------------------------------------------------------
    def push(self, *events: dict) -> None:
        for e in events:
            self._events.put_nowait(e)

    def end_watch(self) -> None:
        self._events.put_nowait(_END)

    def lists(self) -> list[dict[str, str]]:
        return [q for p, q, _ in self.requests if p.endswith("/endpointslices") and q.get("watch", "").lower() not in ("true", "1")]

    def watches(self) -> list[dict[str, str]]:
        return [q for p, q, _ in self.requests if p.endswith("/endpointslices") and q.get("watch", "").lower() in ("true", "1")]

    def kubeconfig(self, directory: str, namespace: str = "llm") -> str:
        path = os.path.join(directory, "kubeconfig")
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": "replay",
               "clusters": [{"name": "replay", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
               "users": [{"name": "gateway", "user": {"token": "replay-token"}}],
               "contexts": [{"name": "replay", "context": {"cluster": "replay", "user": "gateway",
                                                            "namespace": namespace}}]}
        with open(path, "w") as f:
            json.dump(doc, f)      # JSON is YAML
        return path

    # -- the server ----------------------------------------------------------------------------
    async def start(self) -> "K8sReplay":
        app = web.Application()
        app.router.add_get("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices", self._slices)
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}", self._pod)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        """Stop serving; an open watch is ended first (cleanup waits for running handlers)."""
        if self._runner is not None:
            if self.watching.is_set():
                self.end_watch()
            await self._runner.cleanup()
            self._runner = None

    def _log(self, request: web.Request) -> None:
        self.requests.append((request.path, dict(request.query), request.headers.get("authorization", "")))

    async def _slices(self, request: web.Request) -> web.StreamResponse:
        self._log(request)
        if request.query.get("watch", "").lower() not in ("true", "1"):
            return web.json_response(self.list_doc)
        resp = web.StreamResponse(headers={"content-type": "application/json"})
        await resp.prepare(request)
        self.watching.set()
        while True:
            e = await self._events.get()
            if e is _END:
                break
            await resp.write(json.dumps(e).encode() + b"\n")
            if e.get("type") == "ERROR":
                break
        self.watching.clear()
        await resp.write_eof()
        return resp

    async def _pod(self, request: web.Request) -> web.Response:
        self._log(request)
        name = request.match_info["name"]
        self.pod_reads.append(name)
        if name in self.pods:
            return web.json_response(self.pods[name])
        return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                  "message": f'pods "{name}" not found', "reason": "NotFound", "code": 404},
                                 status=404)
