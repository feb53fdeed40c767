"""Safe fetch against a local HTTP server: normal, redirect to a private address,
oversized body, never answering, guard on and off, domain lists."""

from __future__ import annotations

import asyncio
import ipaddress
import socket

import pytest
from aiohttp import web

import image_corpus as C
from vlm_gateway.stages.images.fetch import Fetcher, FetchError, FetchPolicy, ip_refused
from waiting import async_wait_until

JPEG = C.photo_jpeg(640, 480)


class ImageServer:
    """aiohttp server on 127.0.0.1 with the hostile endpoints the fetcher must survive."""

    async def __aenter__(self):
        app = web.Application()
        app.router.add_get("/ok.jpg", self.ok)
        app.router.add_get("/redirect-private", self.redirect_private)
        app.router.add_get("/redirect-self", self.redirect_self)
        app.router.add_get("/loop", self.loop)
        app.router.add_get("/huge", self.huge)
        app.router.add_get("/huge-chunked", self.huge_chunked)
        app.router.add_get("/hang", self.hang)
        app.router.add_get("/missing", self.missing)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        self.hits = 0
        self.stop = asyncio.Event()
        return self

    async def __aexit__(self, *exc):
        self.stop.set()
        await self.runner.cleanup()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def ok(self, request):
        self.hits += 1
        # a lying content type: the format comes from the magic bytes
        return web.Response(body=JPEG, content_type="text/plain")

    async def redirect_private(self, request):
        raise web.HTTPFound("http://10.255.255.1/secret.jpg")

    async def redirect_self(self, request):
        raise web.HTTPFound("/ok.jpg")

    async def loop(self, request):
        raise web.HTTPFound("/loop")

    async def huge(self, request):
        return web.Response(body=b"\xff\xd8\xff" + b"\0" * (50 * 1024 * 1024))

    async def huge_chunked(self, request):
        resp = web.StreamResponse()
        await resp.prepare(request)
        chunk = b"\0" * (1024 * 1024)
        for _ in range(50):
            await resp.write(chunk)
        return resp

    async def missing(self, request):
        return web.Response(status=404)

    async def hang(self, request):
        await self.stop.wait()
        return web.Response(body=b"")


def fetcher(**kw) -> Fetcher:
    return Fetcher(FetchPolicy(**{"timeout_s": 2.0, **kw}))


async def _fetch(f: Fetcher, url: str) -> bytes:
    try:
        return await f.fetch(url)
    finally:
        await f.close()


async def test_fetch_ok_with_private_networks_allowed():
    async with ImageServer() as s:
        assert await _fetch(fetcher(allow_private_networks=True), s.url("/ok.jpg")) == JPEG
        assert await _fetch(fetcher(allow_private_networks=True), s.url("/redirect-self")) == JPEG


async def test_guard_refuses_loopback_literal_and_name():
    async with ImageServer() as s:
        for url in (s.url("/ok.jpg"), f"http://localhost:{s.port}/ok.jpg", f"http://[::1]:{s.port}/ok.jpg",
                    f"http://[::ffff:127.0.0.1]:{s.port}/ok.jpg", f"http://0.0.0.0:{s.port}/ok.jpg"):
            with pytest.raises(FetchError) as e:
                await _fetch(fetcher(), url)
            assert e.value.code == "image_url_private_address", url
        assert s.hits == 0  # refused before any connection


async def test_redirect_to_private_address_refused():
    async with ImageServer() as s:
        # the test server itself is exempt (an "internal image store"); its redirect target is not
        with pytest.raises(FetchError) as e:
            await _fetch(fetcher(allow_networks=["127.0.0.1/32"]), s.url("/redirect-private"))
        assert e.value.code == "image_url_private_address"
        with pytest.raises(FetchError) as e:
            await _fetch(fetcher(allow_private_networks=True, max_redirects=3), s.url("/loop"))
        assert e.value.code == "image_fetch_redirects"


@pytest.mark.parametrize("path", ["/huge", "/huge-chunked"])
async def test_body_cap(path):
    async with ImageServer() as s:
        with pytest.raises(FetchError) as e:
            await _fetch(fetcher(allow_private_networks=True), s.url(path))
        assert e.value.code == "image_too_large"


async def test_never_answering_times_out():
    async with ImageServer() as s:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(FetchError) as e:
            await _fetch(fetcher(allow_private_networks=True, timeout_s=0.5), s.url("/hang"))
        assert e.value.code == "image_fetch_timeout"
        assert loop.time() - t0 < 2.0


async def test_silent_socket_times_out():
    # accepts the TCP connection, never sends a byte
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    try:
        with pytest.raises(FetchError) as e:
            await _fetch(fetcher(allow_private_networks=True, timeout_s=0.5),
                         f"http://127.0.0.1:{srv.getsockname()[1]}/x.jpg")
        assert e.value.code == "image_fetch_timeout"
    finally:
        srv.close()


async def test_http_error_and_domain_lists():
    async with ImageServer() as s:
        with pytest.raises(FetchError) as e:
            await _fetch(fetcher(allow_private_networks=True), s.url("/missing"))
        assert e.value.code == "image_fetch_failed"
        with pytest.raises(FetchError) as e:
            await _fetch(fetcher(allow_private_networks=True, deny_domains=["localhost"]),
                         f"http://localhost:{s.port}/ok.jpg")
        assert e.value.code == "image_url_denied"
        with pytest.raises(FetchError) as e:
            await _fetch(fetcher(allow_private_networks=True, allow_domains=["images.example.com"]),
                         s.url("/ok.jpg"))
        assert e.value.code == "image_url_denied"
        assert await _fetch(fetcher(allow_private_networks=True, allow_domains=["localhost"]),
                            f"http://localhost:{s.port}/ok.jpg") == JPEG


@pytest.mark.parametrize("addr,refused", [
    ("8.8.8.8", False), ("2606:4700:4700::1111", False),
    ("10.1.2.3", True), ("172.16.0.1", True), ("192.168.1.1", True), ("127.0.0.1", True),
    ("169.254.169.254", True), ("100.64.0.1", True), ("224.0.0.1", True), ("0.0.0.0", True),
    ("240.0.0.1", True), ("::1", True), ("fe80::1", True), ("fc00::1", True), ("ff02::1", True),
    ("::ffff:10.0.0.1", True), ("::ffff:8.8.8.8", True), ("64:ff9b::a00:1", True), ("2002:a00:1::", True),
])
def test_address_classes(addr, refused):
    assert ip_refused(ipaddress.ip_address(addr)) is refused


async def test_pool_full_is_503_with_retry_after():
    import threading

    from vlm_gateway.stages.images.pool import BoundedPool
    from vlm_gateway.core.errors import Unavailable
    pool = BoundedPool(workers=1, max_queue=1)
    gate = threading.Event()
    jobs = [asyncio.ensure_future(pool.run(gate.wait, 5)) for _ in range(2)]
    await async_wait_until(lambda: pool.jobs == 2, "both jobs are submitted (one running, one waiting)")
    with pytest.raises(Unavailable) as e:
        await pool.run(lambda: None)
    assert e.value.status == 503 and e.value.headers == {"retry-after": "1"}
    gate.set()
    await asyncio.gather(*jobs)
    assert await pool.run(lambda: 7) == 7
    pool.close()


async def test_pool_bound_holds_while_abandoned_jobs_still_run():
    """A caller that gives up (client disconnect) does not free its place while its job
    still runs or waits for a thread: the bound counts the work, not the waiters."""
    import threading

    from vlm_gateway.stages.images.pool import BoundedPool
    from vlm_gateway.core.errors import Unavailable
    pool = BoundedPool(workers=1, max_queue=1, what="video")
    gate, running = threading.Event(), threading.Event()

    def job() -> None:
        running.set()
        gate.wait(5)
    jobs = [asyncio.ensure_future(pool.run(job)) for _ in range(2)]
    await async_wait_until(lambda: pool.jobs == 2 and running.is_set(), "the first job runs in the thread")
    jobs[0].cancel()   # running in the thread: keeps its place until the thread is done
    await async_wait_until(jobs[0].done, "the caller of the running job has given up")
    assert jobs[0].cancelled() and pool.jobs == 2
    with pytest.raises(Unavailable) as e:
        await pool.run(lambda: None)
    assert e.value.status == 503 and e.value.code == "video_queue_full" and "video" in e.value.message
    jobs[1].cancel()   # still waiting for the thread: cancelled before it starts, its place freed
    await async_wait_until(lambda: pool.jobs < 2, "the waiting job's place is given back")
    assert jobs[1].cancelled() and pool.jobs == 1
    gate.set()
    await async_wait_until(lambda: pool.jobs == 0, "the running job's place is given back once it ends")
    assert await pool.run(lambda: 7) == 7
    pool.close()
