"""Hostile grounding inputs (#32, class 2): how long each takes and how long ``/health`` waits
meanwhile, this checkout against an older one, side by side in one run.

    python benchmarks/grounding_hostile.py --compare /path/to/old/checkout [--reps 3]
    python benchmarks/grounding_hostile.py --finder

Each gateway (one worker, defaults but for the backend and its one-slot profile with a long
context) sits in front of the same backend in this process (aiohttp in a thread) that answers by
the request's last user text; the request carries a 1920x1080 screenshot the gateway trims to its
window, so every coordinate is really mapped. While a case runs, ``/health`` is asked back to back
from another thread; the table gives the case's wall time, the gateway's CPU for it (schedstat),
and the probes' median and worst latency (median over ``--reps``).

Cases: conversations of 450,000 boxes (23 MB), 60,000 and 9,000 (under the default
``images.max_coordinate_groups``); answers of 300,000, 60,000 and 9,000 boxes, and 300,000
streamed (events of 20 boxes); one SSE event of 48 MB without a blank line.

``--finder`` instead times finding coordinate groups and image markers in 27 MB texts, the
regex tried at every position against the search by literal (stages/grounding/text.py).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import concurrent.futures
import datetime as dt
import json
import os
import platform
import re
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx
import orjson
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from grounding import Procs, cpu_seconds, free_port  # noqa: E402
from vlm_gateway.backends.sim.grounding import desktop  # noqa: E402

MODEL = "qwen3vl-bench"
SEP = " ; "
URI = "data:image/png;base64," + base64.b64encode(
    desktop(1920, 1080, (260, 140, 1660, 940), {"magenta": (400, 220, 520, 280)})).decode()


def group(i: int) -> str:
    return '{"bbox_2d": [%d, %d, %d, %d], "label": "icon"}' % (i % 900, i % 700 + 1, i % 900 + 50, i % 700 + 60)


def groups(n: int) -> str:
    return SEP.join(group(i) for i in range(n))


def chunk(content: str) -> bytes:
    return b"data: " + orjson.dumps({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
                                     "choices": [{"index": 0, "delta": {"content": content},
                                                  "finish_reason": None}]}) + b"\n\n"


async def answer(request: web.Request) -> web.StreamResponse:
    body = orjson.loads(await request.read())
    ask = body["messages"][-1]["content"]
    m = re.match(r"(answer|stream) (\d+)", ask)
    text = groups(int(m.group(2))) if m else "ok"
    if not body.get("stream"):
        return web.json_response({"id": "c", "object": "chat.completion", "created": 1, "model": MODEL,
                                  "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                               "finish_reason": "stop"}]})
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    if ask == "flood":
        await resp.write(b'data: {"choices": [{"index": 0, "delta": {"content": "')
        try:
            for _ in range(192):  # 48 MB, never a blank line
                await resp.write(b'\\"bbox_2d\\": [1, 2, 3, 4] ' * 9709)
        except (ConnectionError, RuntimeError):
            pass
        return resp
    pieces = text.split(SEP)
    for i in range(0, len(pieces), 20):
        await resp.write(chunk(SEP.join(pieces[i:i + 20]) + (SEP if i + 20 < len(pieces) else "")))
    await resp.write(b"data: [DONE]\n\n")
    return resp


def backend(port: int) -> None:
    async def health(request):
        return web.Response(text="")

    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    app = web.Application(client_max_size=64 << 20)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", answer)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    loop.run_forever()


def request(url: str, text: str, stream: bool = False, history: str | None = None) -> int:
    messages = [{"role": "user", "content": [{"type": "text", "text": "Box every icon."},
                                             {"type": "image_url", "image_url": {"url": URI}}]}]
    if history is not None:
        messages.append({"role": "assistant", "content": history})
    messages.append({"role": "user", "content": text})
    body = orjson.dumps({"model": MODEL, "messages": messages, "max_tokens": 100, "stream": stream})
    with httpx.Client(timeout=300) as c:
        with c.stream("POST", url + "/chat/completions", content=body,
                      headers={"content-type": "application/json"}) as r:
            for _ in r.iter_bytes():
                pass
            return r.status_code


CASES = {
    "conversation of 450,000 boxes (23 MB)": lambda u, h: request(u, "again", history=h[450_000]),
    "conversation of 60,000 boxes": lambda u, h: request(u, "again", history=h[60_000]),
    "conversation of 9,000 boxes (under the limit)": lambda u, h: request(u, "again", history=h[9_000]),
    "answer of 300,000 boxes": lambda u, h: request(u, "answer 300000"),
    "answer of 60,000 boxes": lambda u, h: request(u, "answer 60000"),
    "answer of 9,000 boxes (under the limit)": lambda u, h: request(u, "answer 9000"),
    "stream of 300,000 boxes": lambda u, h: request(u, "stream 300000", True),
    "one 48 MB SSE event, no blank line": lambda u, h: request(u, "flood", True),
}


def probed(url: str, pid: int, fn) -> tuple[int, float, float, float, float]:
    """(status, wall s, gateway CPU s, /health p50 s, /health max s) of ``fn()`` while /health is probed."""
    origin = url[:-3]
    lat = []
    with httpx.Client(timeout=60) as c, concurrent.futures.ThreadPoolExecutor(1) as pool:
        c.get(origin + "/health")
        cpu0, t0 = cpu_seconds(pid), time.perf_counter()
        fut = pool.submit(fn)
        while not fut.done():
            t = time.perf_counter()
            c.get(origin + "/health")
            lat.append(time.perf_counter() - t)
        status = fut.result()
        wall, cpu = time.perf_counter() - t0, cpu_seconds(pid) - cpu0
    lat.sort()
    return status, wall, cpu, lat[len(lat) // 2], lat[-1]


def finder(reps: int) -> None:
    from vlm_gateway.stages.grounding.text import GROUP, MARKER, groups as found_groups, markers
    texts = {"prose, no quotes": "The window shows a toolbar and many things. " * 600_000,
             "quotes and tags, no groups": "He said 'hello' and \"bye\" <b> " * 900_000,
             "one group per 50 characters": groups(540_000)}
    print("| text | MB | what | regex at every position s | by literal s | groups/markers |\n|---|---|---|---|---|---|")
    for name, t in texts.items():
        for what, old, new in (("groups", GROUP.finditer, found_groups), ("markers", MARKER.finditer, markers)):
            times = []
            for fn in (old, new):
                best = None
                for _ in range(reps):
                    t0 = time.perf_counter()
                    n = sum(1 for _ in fn(t))
                    best = min(best or 1e9, time.perf_counter() - t0)
                times.append(best)
            print(f"| {name} | {len(t) / 1e6:.1f} | {what} | {times[0]:.3f} | {times[1]:.3f} | {n} |")
    print(f"\nbest of {reps}; {platform.machine()} {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f}; "
          f"{dt.date.today()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compare", default="", help="checkout whose gateway shows the previous behaviour")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--finder", action="store_true", help="time the group and marker search only")
    ap.add_argument("--out", default="", help="write the runs as JSON here")
    args = ap.parse_args()
    if args.finder:
        finder(args.reps)
        return
    if not args.compare:
        ap.error("--compare is needed")
    port = free_port()
    threading.Thread(target=backend, args=(port,), daemon=True).start()
    up = f"http://127.0.0.1:{port}/v1"
    histories = {n: groups(n) for n in (450_000, 60_000, 9_000)}
    procs = Procs()
    extra = {"backends": [{"url": up, "name": "b0", "models": [MODEL], "profile": "one"}],
             "profiles": {"one": {"base": "h200", "max_num_seqs": 4, "max_model_len": 10_000_000}},
             "cache": {"enabled": False},
             # a cut stream counts against the backend: never eject it between the cases
             "routing": {"eject_after_failures": 1000}}
    rows: dict[tuple[str, str], list] = {}
    try:
        gateways = {"before": procs.gateway([], pythonpath=args.compare, extra=extra),
                    "after": procs.gateway([], extra=extra)}
        for name, fn in CASES.items():
            for _ in range(args.reps):
                for which, (url, p) in gateways.items():
                    rows.setdefault((name, which), []).append(probed(url, p.pid, lambda: fn(url, histories)))
                    print(name, which, rows[(name, which)][-1], flush=True)
    finally:
        procs.stop()
    print("\n| case | gateway | status | wall s | gateway CPU s | /health p50 ms | /health worst ms |")
    print("|---|---|---|---|---|---|---|")
    for (name, which), rs in rows.items():
        med = [statistics.median(r[i] for r in rs) for i in range(1, 5)]
        print(f"| {name} | {which} | {'/'.join(sorted({str(r[0]) for r in rs}))} | {med[0]:.2f} | {med[1]:.2f} | {med[2] * 1e3:.1f} | "
              f"{med[3] * 1e3:.0f} |")
    if args.out:
        Path(args.out).write_text(json.dumps({
            "reps": args.reps, "date": str(dt.date.today()), "load_average": os.getloadavg()[0],
            "fields": ["status", "wall_s", "gateway_cpu_s", "health_p50_s", "health_max_s"],
            "runs": [{"case": name, "gateway": which, "runs": rs} for (name, which), rs in rows.items()]}, indent=1))
    print(f"\nmedians of {args.reps} runs, before/after interleaved; {platform.machine()} {os.cpu_count()} cores; "
          f"load average {os.getloadavg()[0]:.1f}; {dt.date.today()}")


if __name__ == "__main__":
    main()
