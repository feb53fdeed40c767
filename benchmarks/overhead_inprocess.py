"""Gateway CPU per request, in process: before/after a change without the noise of a
shared machine's scheduler.

The gateway's ASGI app (middlewares, endpoint, stage chain, pool, relay) runs in this
process and is called directly, N requests at a given concurrency, against the
zero-delay upstream (benchmarks/fake_upstream.py) on loopback. The figure is this
process's CPU time (``time.process_time``) per request, which other processes on the
machine barely move; wall time per request is reported beside it. Two packages are
compared by running this file once per package, alternating, R rounds:

    python benchmarks/overhead_inprocess.py --compare /tmp/base --rounds 5
    # -> medians per (payload, concurrency): this checkout vs the package in /tmp/base
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def measure(up_port: int, n: int, conc: int, stream: bool) -> dict:
    import orjson

    from vlm_gateway import create_app, load_config
    cfg = load_config(None, environ={}, overrides={
        "backends": [{"url": f"http://127.0.0.1:{up_port}/v1", "models": ["bench-model"]}],
        "cache": {"enabled": False}, "server": {"log_level": "warning"}})
    app = create_app(cfg)
    raw = orjson.dumps({"model": "bench-model", "messages": [{"role": "user", "content": "Say ok."}],
                        "max_tokens": 16, "stream": stream})
    headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
               (b"content-length", str(len(raw)).encode())]

    async def one() -> int:
        got = False
        status = 0

        async def receive():
            nonlocal got
            if not got:
                got = True
                return {"type": "http.request", "body": raw, "more_body": False}
            await asyncio.Event().wait()

        async def send(msg):
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
                 "query_string": b"", "headers": headers, "client": ("127.0.0.1", 5000),
                 "server": ("127.0.0.1", 8000), "root_path": "", "app": app}
        await app(scope, receive, send)
        return status

    async def worker(k: int) -> list[int]:
        return [await one() for _ in range(k)]

    async with app.router.lifespan_context(app):
        await asyncio.gather(*(worker(20) for _ in range(conc)))  # warm-up
        c0, t0 = time.process_time(), time.perf_counter()
        per = n // conc
        statuses = [s for r in await asyncio.gather(*(worker(per) for _ in range(conc))) for s in r]
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    assert set(statuses) == {200}, set(statuses)
    done = per * conc
    return {"cpu_us_per_req": cpu / done * 1e6, "wall_us_per_req": wall / done * 1e6, "requests": done}


def run_once(args) -> None:
    out = {}
    for stream in (False, True):
        for conc in args.conc:
            r = asyncio.run(measure(args.up_port, args.n, conc, stream))
            out[f"{'stream' if stream else 'text'}/{conc}"] = r
    print(json.dumps(out))


def compare(args) -> None:
    up_port = free_port()
    up = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "fake_upstream.py"), "--port", str(up_port)])
    time.sleep(0.5)
    runs: dict[str, list[dict]] = {"after": [], "before": []}
    try:
        for rnd in range(args.rounds):
            order = [("after", str(ROOT)), ("before", args.compare)]
            if rnd % 2:
                order.reverse()
            for label, path in order:
                env = {**os.environ, "PYTHONPATH": path}
                cmd = [sys.executable, __file__, "--once", "--up-port", str(up_port), "--n", str(args.n),
                       "--conc", ",".join(map(str, args.conc))]
                res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
                runs[label].append(json.loads(res.stdout.strip().splitlines()[-1]))
                print(f"round {rnd + 1} {label}: " + ", ".join(
                    f"{k} {v['cpu_us_per_req']:.0f} us" for k, v in runs[label][-1].items()), flush=True)
    finally:
        up.terminate()
    rows = ["| payload/conc | CPU us/req before | CPU us/req after | after/before | wall us/req before | "
            "wall us/req after |", "|---|---|---|---|---|---|"]
    summary = {}
    for cell in runs["after"][0]:
        med = {lab: {k: statistics.median(r[cell][k] for r in runs[lab]) for k in ("cpu_us_per_req", "wall_us_per_req")}
               for lab in runs}
        summary[cell] = med
        b, a = med["before"], med["after"]
        rows.append(f"| {cell} | {b['cpu_us_per_req']:.0f} | {a['cpu_us_per_req']:.0f} | "
                    f"{a['cpu_us_per_req'] / b['cpu_us_per_req']:.3f} | {b['wall_us_per_req']:.0f} | "
                    f"{a['wall_us_per_req']:.0f} |")
    print("\n".join(rows))
    if args.out:
        Path(args.out).write_text(json.dumps({"rounds": args.rounds, "n": args.n, "runs": runs,
                                              "medians": summary}, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compare", default="", help="directory holding the other vlm_gateway package")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=2000, help="requests per cell")
    ap.add_argument("--conc", type=lambda s: [int(x) for x in s.split(",")], default=[1, 32])
    ap.add_argument("--out", default="")
    ap.add_argument("--once", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--up-port", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.once:
        run_once(a)
    else:
        compare(a)


if __name__ == "__main__":
    main()
