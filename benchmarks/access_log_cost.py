#!/usr/bin/env python3
"""Per-request cost of the access-log middleware (JSON and text formats), in process.

Wraps a no-op ASGI app that leaves a parsed ChatRequest in scope["state"] like the
completion endpoint, and times N calls with and without the middleware; the log
goes to /dev/null through the real formatters. Usage: python benchmarks/access_log_cost.py [N]
"""

from __future__ import annotations

import asyncio
import logging
import os
import statistics
import sys
import time

from vlm_gateway.logs import JsonFormatter, TextFormatter
from vlm_gateway.proxy.asgi.access_log import AccessLogMiddleware
from vlm_gateway.backends.backend import CHOSEN
from vlm_gateway.core.request import ImagePart, parse_chat
from vlm_gateway.proxy.relay import USAGE

N = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
RAW = (b'{"model":"qwen3vl-sim","max_tokens":8,"messages":[{"role":"user","content":[{"type":"text",'
       b'"text":"hi"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}')


class _B:
    name = "sim0"


async def endpoint(scope, receive, send):
    req = parse_chat(RAW, {}, scope["state"].get("request_id"))
    req.state[CHOSEN] = _B()
    req.state[USAGE] = {"prompt_tokens": 120, "completion_tokens": 8}
    req.images = [ImagePart(0, 1, {}, tokens_before=1900, tokens_after=480)]
    scope["state"].update(req=req, status=200)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}", "more_body": False})


async def run(app, n: int) -> list[float]:
    async def send(m):
        pass

    async def receive():
        return {"type": "http.request", "body": b""}

    out = []
    for i in range(n):
        scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [],
                 "state": {"request_id": f"r{i}"}}
        t = time.perf_counter_ns()
        await app(scope, receive, send)
        out.append((time.perf_counter_ns() - t) / 1000.0)
    return out


def main() -> None:
    logger = logging.getLogger("bench.access")
    logger.propagate = False
    handler = logging.StreamHandler(open(os.devnull, "w"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    rows = []
    for label, app in (("no access log", endpoint),
                       ("access log, json", AccessLogMiddleware(endpoint, logger)),
                       ("access log, text", AccessLogMiddleware(endpoint, logger))):
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
                             if "text" in label else JsonFormatter())
        asyncio.run(run(app, 2000))  # warm-up
        us = sorted(asyncio.run(run(app, N)))
        rows.append((label, statistics.median(us), us[int(len(us) * 0.99)]))
    base = rows[0][1]
    print(f"| variant | median us | p99 us | added vs none (median) |\n|---|---|---|---|")
    for label, med, p99 in rows:
        print(f"| {label} | {med:.1f} | {p99:.1f} | {med - base:+.1f} us |")


if __name__ == "__main__":
    main()
