"""Where the coordinates a client receives land, before and after grounding-safe rewriting,
and what the mapping costs on the stream path.

    python benchmarks/grounding.py accuracy [--scenes 30] [--before-src /path/to/old/checkout]
    python benchmarks/grounding.py overhead [--requests 300] [--compare /path/to/old/checkout]

accuracy -- seeded screenshots (a window on a flat desktop, 1366x768 to 3840x2160, terminal-
like narrow windows among them) with 2-4 colour targets each. The simulator in grounding mode
(a perfect locator of the targets in the image it *received*) answers in Qwen3-VL's convention
(0-1000 of the received image) or Qwen2.5-VL's (pixels of the processor's resize of it); the
client reads every answer in its own image the way the model's documentation says (x / 1000 *
width; x / resized_width * width with resized_width = smart_resize of the client's image). The
error of a coordinate is |read - truth| / that side of the client's image. Columns:

* ``before``: what clients got before this change: the image trimmed to the window and
  downscaled, the answer relayed as the engine wrote it. By default reproduced in process with
  the same rewrite (trim on) and the same locator; ``--before-src`` runs an older checkout's
  gateway instead (its ``vlm_gateway`` package) in front of this checkout's simulator.
* ``off``: this gateway with ``x-vlm-gateway-grounding: off`` (nothing cropped, answer unmapped).
* ``on``: this gateway's default (trimmed, downscaled, answer mapped), non-stream and stream.

overhead -- one gateway in front of a zero-delay upstream that streams a grounding answer (and
the same answer as plain prose) for a 1920x1080 screenshot request; the gateway's CPU time per
request with the mapping off (the relay's byte path) and on (events re-framed and mapped), in
interleaved rounds; plus the transform alone in process (CPU per chunk). ``--compare DIR`` runs
the same cells through a second gateway from DIR's package (e.g. the previous commit), interleaved.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime as dt
import os
import platform
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vlm_gateway.backends.sim.grounding import MARKERS, answer_for, desktop, model_frame  # noqa: E402
from vlm_gateway.stages.images.policy import Policy  # noqa: E402
from vlm_gateway.stages.images.rewrite import rewrite_bytes  # noqa: E402

MODELS = {"qwen3-vl": "qwen3vl-sim", "qwen2.5-vl": "qwen2.5-vl-sim"}
SCREENS = [(1366, 768), (1920, 1080), (1920, 1200), (2560, 1440), (3840, 2160), (1280, 800)]
PROMPTS = ("Box every marker.", "Point to every marker.")


# -- processes ---------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Procs:
    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []
        self.tmp = tempfile.mkdtemp(prefix="vlmgw-bench-grounding-")

    def spawn(self, args: list[str], port: int, pythonpath: str = str(ROOT), ready: str = "/health",
              cpu: str | None = None) -> subprocess.Popen:
        log = open(os.path.join(self.tmp, f"{port}.log"), "w")
        cmd = [sys.executable, "-m", "vlm_gateway", *args]
        if cpu is not None and shutil_which("taskset"):
            cmd = ["taskset", "-c", cpu, *cmd]
        # cwd too: ``python -m`` puts the working directory first on sys.path
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=pythonpath,
                             env={**os.environ, "PYTHONPATH": pythonpath, "PYTHONUNBUFFERED": "1"})
        self.procs.append(p)
        deadline = time.time() + 60
        while time.time() < deadline:
            if p.poll() is not None:
                raise RuntimeError(f"{cmd} exited: {open(log.name).read()[-2000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}{ready}", timeout=0.5).status_code < 500:
                    return p
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError(f"{cmd} did not come up")

    def sim(self, convention: str, model: str) -> str:
        port = free_port()
        self.spawn(["sim", "--port", str(port), "--profile", "fast", "--grounding", convention, "--model", model],
                   port)
        return f"http://127.0.0.1:{port}/v1"

    def gateway(self, backends: list[tuple[str, str]], pythonpath: str = str(ROOT), cpu: str | None = None,
                extra: dict | None = None) -> tuple[str, subprocess.Popen]:
        port = free_port()
        cfg = {"backends": [{"url": url, "name": name, "engine": "sim" if "sim" in name else "openai",
                             "models": [name]} for name, url in backends],
               "cache": {"mode": "off"}, "routing": {"health_interval_s": 1.0}, **(extra or {})}
        path = os.path.join(self.tmp, f"gateway-{port}.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(cfg, f)
        p = self.spawn(["serve", "--config", path, "--port", str(port)], port, pythonpath, "/ready", cpu)
        return f"http://127.0.0.1:{port}/v1", p

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)


def shutil_which(name: str) -> str | None:
    import shutil
    return shutil.which(name)


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of a process, from schedstat (nanoseconds, unlike /proc/PID/stat's ticks)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total / 1e9


# -- scenes ------------------------------------------------------------------------------------------

def scenes(n: int, seed: int = 7) -> list[tuple[int, int, bytes, dict]]:
    """(width, height, png, targets) with a window on a flat desktop and 2-4 targets inside it."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        w, h = SCREENS[i % len(SCREENS)]
        if i % 5 == 4:  # a narrow terminal-like window
            ww, wh = int(w * rnd.uniform(0.22, 0.32)), int(h * rnd.uniform(0.6, 0.8))
        else:
            ww, wh = int(w * rnd.uniform(0.45, 0.85)), int(h * rnd.uniform(0.45, 0.85))
        x0, y0 = rnd.randint(20, w - ww - 20), rnd.randint(20, h - wh - 20)
        labels = rnd.sample(list(MARKERS), rnd.randint(2, 4))
        targets: dict = {}
        for lab in labels:
            for _ in range(100):
                tw, th = rnd.choice([(32, 32), (96, 32), (140, 44), (260, 180), (48, 48)])
                tw, th = min(tw, ww // 3), min(th, wh // 3)
                tx, ty = rnd.randint(x0 + 10, x0 + ww - tw - 10), rnd.randint(y0 + 40, y0 + wh - th - 10)
                box = (tx, ty, tx + tw, ty + th)
                if all(box[2] + 8 < b[0] or b[2] + 8 < box[0] or box[3] + 8 < b[1] or b[3] + 8 < box[1]
                       for b in targets.values()):
                    targets[lab] = box
                    break
        out.append((w, h, desktop(w, h, (x0, y0, x0 + ww, y0 + wh), targets), targets))
    return out


# -- reading answers -------------------------------------------------------------------------------

def errors(answer: str, w: int, h: int, targets: dict, convention: str) -> list[float]:
    """|read - truth| / side for every coordinate the answer gives (a missing target counts 1.0)."""
    import re
    ux, uy = model_frame(w, h, convention)
    found = {}
    for m in re.finditer(r'"(bbox_2d|point_2d)":\s*\[([^\]]*)\],\s*"label":\s*"(\w+)"', answer):
        found[m.group(3)] = (m.group(1), [float(v) for v in m.group(2).split(",")])
    out = []
    for label, (x0, y0, x1, y1) in targets.items():
        if label not in found:
            out += [1.0] * 4
            continue
        kind, v = found[label]
        truth = [x0, y0, x1, y1] if kind == "bbox_2d" else [(x0 + x1) / 2, (y0 + y1) / 2]
        for i, (got, want) in enumerate(zip(v, truth)):
            side, u = (w, ux) if i % 2 == 0 else (h, uy)
            out.append(abs(got / u - want) / side)
    return out


def ask(base: str, model: str, png: bytes, prompt: str, stream: bool, headers: dict | None = None) -> str:
    body = {"model": model, "max_tokens": 4000, "stream": stream, "messages": [{"role": "user", "content": [
        {"type": "text", "text": prompt},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()}}]}]}
    r = httpx.post(base + "/chat/completions", json=body, headers=headers or {}, timeout=60)
    r.raise_for_status()
    if not stream:
        return r.json()["choices"][0]["message"]["content"]
    text = []
    for line in r.text.split("\n"):
        if line.startswith("data: {"):
            for c in orjson.loads(line[6:]).get("choices", []):
                text.append((c.get("delta") or {}).get("content") or "")
    return "".join(text)


def summary(errs: list[float]) -> dict:
    s = sorted(errs)
    return {"n": len(s), "median": statistics.median(s), "p90": s[int(0.9 * (len(s) - 1))], "max": s[-1],
            "within_1pct": sum(e <= 0.01 for e in s) / len(s)}


def accuracy(args) -> None:
    sc = scenes(args.scenes)
    procs = Procs()
    rows: dict[tuple[str, str], list[float]] = {}
    try:
        sims = {conv: procs.sim(conv, MODELS[conv]) for conv in MODELS}
        gw, _ = procs.gateway([(MODELS[c], u) for c, u in sims.items()])
        old = procs.gateway([(MODELS[c], u) for c, u in sims.items()], pythonpath=args.before_src)[0] \
            if args.before_src else None
        for conv, model in MODELS.items():
            for i, (w, h, png, targets) in enumerate(sc):
                prompt = PROMPTS[i % 2]
                if old is None:  # the previous behaviour, in process: trim + downscale, answer as written
                    sent = rewrite_bytes(png, Policy()).data
                    before = answer_for([sent], prompt, conv)
                else:
                    before = ask(old, model, png, prompt, False)
                cells = {"before": before,
                         "off": ask(gw, model, png, prompt, False, {"x-vlm-gateway-grounding": "off"}),
                         "on (json)": ask(gw, model, png, prompt, False),
                         "on (stream)": ask(gw, model, png, prompt, True)}
                for col, text in cells.items():
                    rows.setdefault((conv, col), []).extend(errors(text, w, h, targets, conv))
    finally:
        procs.stop()
    print("| convention | behaviour | coordinates | median error | p90 | max | within 1% |")
    print("|---|---|---|---|---|---|---|")
    for (conv, col), errs in rows.items():
        s = summary(errs)
        print(f"| {conv} | {col} | {s['n']} | {100 * s['median']:.2f}% | {100 * s['p90']:.2f}% | "
              f"{100 * s['max']:.2f}% | {100 * s['within_1pct']:.0f}% |")
    print(f"\n{len(sc)} scenes x {len(MODELS)} conventions; {platform.machine()} {os.cpu_count()} cores; "
          f"{dt.date.today()}; before = {'gateway at ' + args.before_src if args.before_src else 'in process'}")


# -- overhead ------------------------------------------------------------------------------------------

def _sse(content: list[str]) -> bytes:
    base = {"id": "chatcmpl-b", "object": "chat.completion.chunk", "created": 1, "model": "bench"}
    evs = [b"data: " + orjson.dumps({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                          "logprobs": None, "finish_reason": None}]}) + b"\n\n"]
    evs += [b"data: " + orjson.dumps({**base, "choices": [{"index": 0, "delta": {"content": c}, "logprobs": None,
                                                           "finish_reason": None}]}) + b"\n\n" for c in content]
    evs.append(b"data: " + orjson.dumps({**base, "choices": [{"index": 0, "delta": {}, "logprobs": None,
                                                              "finish_reason": "stop"}]}) + b"\n\n")
    return b"".join(evs) + b"data: [DONE]\n\n"


def _screenshot() -> bytes:
    return desktop(1920, 1080, (260, 140, 1660, 940), {"magenta": (400, 220, 520, 280),
                                                       "cyan": (1400, 800, 1600, 900), "yellow": (300, 600, 340, 640)})


def _answers(png: bytes) -> dict[str, list[str]]:
    """Token-sized deltas (about 4 characters) of a grounding answer and of prose of the same length."""
    sent = rewrite_bytes(png, Policy()).data
    g = answer_for([sent], "Box every marker.", "qwen3-vl")
    g = (g + "\n") * 4  # ~ 4 answers long: a longer answer, more chunks
    prose = ("The window shows a toolbar, a list of files and a status line; nothing else is open. " *
             (len(g) // 85 + 1))[:len(g)]
    cut = lambda s: [s[i:i + 4] for i in range(0, len(s), 4)]  # noqa: E731
    return {"grounding": cut(g), "prose": cut(prose)}


async def _serve(port: int, bodies: dict[str, bytes]) -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n"
    models = orjson.dumps({"object": "list", "data": [{"id": "bench", "object": "model"}]})

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                n = 0
                while (h := await reader.readline()) not in (b"\r\n", b""):
                    if h.lower().startswith(b"content-length:"):
                        n = int(h.split(b":")[1])
                body = await reader.readexactly(n) if n else b""
                if line.startswith(b"GET"):
                    out = models if b"/models" in line else b"{}"
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
                                 % len(out) + out)
                else:
                    kind = "prose" if b"prose please" in body else "grounding"
                    writer.write(head % len(bodies[kind]) + bodies[kind])
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            return

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def overhead(args) -> None:
    from vlm_gateway.stages.grounding.frames import Frame, image_map
    from vlm_gateway.stages.grounding.conventions import BUILTIN
    from vlm_gateway.stages.grounding.response import StreamTransform
    from vlm_gateway.stages.grounding.text import Attribution, Mapper

    png = _screenshot()
    answers = _answers(png)
    bodies = {k: _sse(v) for k, v in answers.items()}

    # in process: the transform alone
    m = image_map(Frame(1920, 1080, 260, 140, 1660, 940, 768, 448), BUILTIN["qwen3-vl"])
    print("| stream | chunks | transform CPU per stream | per chunk |\n|---|---|---|---|")
    for kind, body in bodies.items():
        events = [e + b"\n\n" for e in body.split(b"\n\n") if e]
        per = []
        for _ in range(7):
            t = time.process_time()
            for _ in range(200):
                tf = StreamTransform(lambda: Mapper(Attribution(m, [m])))
                for e in events:
                    tf.feed_sync(e)
                tf.close_sync()
            per.append((time.process_time() - t) / 200)
        med = statistics.median(per)
        print(f"| {kind} | {len(events)} | {med * 1e6:.0f} us | {med / len(events) * 1e6:.2f} us |")

    # end to end
    port = free_port()
    upstream = subprocess.Popen([sys.executable, __file__, "_upstream", str(port)], start_new_session=True)
    procs = Procs()
    try:
        time.sleep(0.5)
        gateways = {"": procs.gateway([("qwen3vl-bench", f"http://127.0.0.1:{port}/v1")], cpu=args.cpu)}
        if args.compare:  # the same cells through an older checkout's gateway, interleaved
            gateways["before"] = procs.gateway([("qwen3vl-bench", f"http://127.0.0.1:{port}/v1")],
                                               pythonpath=args.compare, cpu=args.cpu)
        uri = "data:image/png;base64," + base64.b64encode(png).decode()
        client = httpx.Client(timeout=30)

        def one(kind: str, mapping: bool, which: str = "") -> float:
            url = gateways[which][0]
            body = {"model": "qwen3vl-bench", "stream": True, "max_tokens": 2000, "messages": [{"role": "user",
                    "content": [{"type": "text", "text": "prose please" if kind == "prose" else "Box every marker."},
                                {"type": "image_url", "image_url": {"url": uri}}]}]}
            h = {} if mapping else {"x-vlm-gateway-grounding": "off"}
            t = time.perf_counter()
            with client.stream("POST", url + "/chat/completions", json=body, headers=h) as r:
                for _ in r.iter_bytes():
                    pass
                assert r.status_code == 200, r.read()
                assert r.headers["x-vlm-gateway-grounding"].endswith("mapping=on" if mapping else "reason=request")
            return time.perf_counter() - t

        cells = [(k, mp, w) for k in ("grounding", "prose") for mp in (False, True) for w in gateways]
        for c in cells:  # warm up: L1 holds both rewrites
            for _ in range(20):
                one(*c)
        cpu = {c: [] for c in cells}
        wall = {c: [] for c in cells}
        rounds = 10
        for _ in range(rounds):
            for c in cells:
                pid = gateways[c[2]][1].pid
                t0 = cpu_seconds(pid)
                lat = [one(*c) for _ in range(args.requests // rounds)]
                cpu[c].append((cpu_seconds(pid) - t0) / len(lat))
                wall[c] += lat
    finally:
        procs.stop()
        os.killpg(upstream.pid, signal.SIGTERM)
    print("\n| answer | mapping | gateway | gateway CPU per request (median of rounds) | latency p50 | p99 |")
    print("|---|---|---|---|---|---|")
    for c in cells:
        lat = sorted(wall[c])
        print(f"| {c[0]} ({len(answers[c[0]])} chunks) | {'on' if c[1] else 'off'} | {c[2] or 'this checkout'} | "
              f"{statistics.median(cpu[c]) * 1e3:.3f} ms | {lat[len(lat) // 2] * 1e3:.2f} ms | "
              f"{lat[int(0.99 * (len(lat) - 1))] * 1e3:.2f} ms |")
    if args.compare:
        print("\n| answer | mapping | CPU this checkout / before |\n|---|---|---|")
        for k in ("grounding", "prose"):
            for mp in (False, True):
                a, b = (statistics.median(cpu[(k, mp, w)]) for w in ("", "before"))
                print(f"| {k} | {'on' if mp else 'off'} | {a / b:.3f} |")
    print(f"\n{args.requests} requests per cell in {rounds} interleaved rounds; gateway "
          f"{'pinned to CPU ' + args.cpu if args.cpu else 'unpinned'}; {platform.machine()} {os.cpu_count()} cores; "
          f"{dt.date.today()}")


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "_upstream":
        asyncio.run(_serve(int(sys.argv[2]), {k: _sse(v) for k, v in _answers(_screenshot()).items()}))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("accuracy")
    a.add_argument("--scenes", type=int, default=30)
    a.add_argument("--before-src", default="", help="checkout whose gateway shows the previous behaviour")
    a.set_defaults(func=accuracy)
    o = sub.add_parser("overhead")
    o.add_argument("--requests", type=int, default=300)
    o.add_argument("--cpu", default=None, help="pin the gateway to this CPU (taskset)")
    o.add_argument("--compare", default="", help="checkout whose gateway runs the same cells (before/after)")
    o.set_defaults(func=overhead)
    args = p.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
