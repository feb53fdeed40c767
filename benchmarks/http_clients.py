"""Upstream HTTP client choice: CPU per request of aiohttp vs httpx as an async
client, the way the relay uses it (keep-alive pool, POST JSON, read the body).

    python benchmarks/http_clients.py [--n 5000] [--conc 32]

Starts benchmarks/fake_upstream.py on CPU 0 and runs each client pinned to CPU 1,
alternating, three rounds; prints CPU microseconds per request (median of rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import orjson

HERE = Path(__file__).resolve().parent
BODY = orjson.dumps({"model": "bench-model", "messages": [{"role": "user", "content": "Say ok."}], "max_tokens": 16})


async def with_aiohttp(url: str, n: int, conc: int) -> None:
    import aiohttp
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=conc)) as s:
        async def worker(k: int) -> None:
            for _ in range(k):
                async with s.post(url, data=BODY, headers={"content-type": "application/json"}) as r:
                    orjson.loads(await r.read())
        await asyncio.gather(*(worker(n // conc) for _ in range(conc)))


async def with_httpx(url: str, n: int, conc: int) -> None:
    import httpx
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=conc, max_keepalive_connections=conc)) as c:
        async def worker(k: int) -> None:
            for _ in range(k):
                r = await c.post(url, content=BODY, headers={"content-type": "application/json"})
                orjson.loads(r.content)
        await asyncio.gather(*(worker(n // conc) for _ in range(conc)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--conc", type=int, default=32)
    ap.add_argument("--port", type=int, default=9131)
    a = ap.parse_args()
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return
    up = subprocess.Popen(["taskset", "-c", "0", sys.executable, str(HERE / "fake_upstream.py"), "--port", str(a.port)])
    time.sleep(1.0)
    os.sched_setaffinity(0, {1})
    import uvloop
    url = f"http://127.0.0.1:{a.port}/v1/chat/completions"
    res: dict[str, list[float]] = {"aiohttp": [], "httpx": []}
    try:
        for _ in range(3):
            for name, fn in (("aiohttp", with_aiohttp), ("httpx", with_httpx)):
                t0 = time.process_time()
                uvloop.run(fn(url, a.n, a.conc))
                res[name].append((time.process_time() - t0) / a.n * 1e6)
    finally:
        up.terminate()
    for name, v in res.items():
        print(f"{name:8s} {statistics.median(v):7.1f} us CPU per request (rounds: {', '.join(f'{x:.0f}' for x in v)})")
    print(f"httpx / aiohttp: {statistics.median(res['httpx']) / statistics.median(res['aiohttp']):.2f}x")


if __name__ == "__main__":
    main()
