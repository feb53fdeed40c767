"""Gateway overhead: direct vs through vlm-gateway vs through LiteLLM's proxy.

A zero-delay upstream (benchmarks/fake_upstream.py) answers every request at once,
so whatever a proxy adds is its own cost. All three paths are measured in the same
run, cell after cell, with wrk as the load generator:

  * the proxy under test is pinned to CPU 1, the upstream and wrk to CPU 0;
  * text chat requests (JSON) and text streams (20 chunks), at concurrency 1, 32, 64;
  * added latency = proxy percentile - direct percentile at the same concurrency;
  * proxy CPU per request = the proxy process's CPU time / requests served.

LiteLLM's proxy is installed into its own virtual environment (.venv-litellm) the
first time; it is never a dependency of the gateway. Pass --no-litellm to skip it.

    python benchmarks/overhead.py                 # ~4 minutes, prints a table
    python benchmarks/overhead.py --duration 5 --no-litellm
    python benchmarks/overhead.py --no-litellm --baseline /tmp/base   # before/after: a second
        gateway ("vlm-gateway-base") runs the package found in /tmp/base (e.g. `git archive REV
        vlm_gateway | tar -x -C /tmp/base`), measured cell after cell beside this checkout's
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LITELLM_VENV = ROOT / ".venv-litellm"
LITELLM_SPEC = "litellm[proxy,proxy-runtime,extra-proxy]==1.108.7"
MASTER_KEY = "sk-bench-master"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def wait_url(url: str, timeout: float = 60.0, headers: dict | None = None) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            req = urllib.request.Request(url, headers=headers or {})
            with urllib.request.urlopen(req, timeout=1) as r:
                if r.status < 500:
                    return
        except Exception:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up in {timeout}s")


def cpu_seconds(pid: int) -> float:
    """utime+stime of a process and its children that were waited for."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    pids = [pid] + [int(p) for p in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True,
                                                   text=True).stdout.split()]
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (FileNotFoundError, IndexError):
            pass
    return total


def ensure_wrk() -> str:
    path = shutil.which("wrk")
    if path:
        return path
    log("installing wrk (apt)")
    subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=False, capture_output=True)
    path = shutil.which("wrk")
    if not path:
        subprocess.run(["apt-get", "update", "-qq"], check=False)
        subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=True)
        path = shutil.which("wrk")
    return path


def ensure_litellm() -> Path | None:
    py = LITELLM_VENV / "bin" / "python"
    if py.exists():
        return py
    log(f"creating {LITELLM_VENV.name} with {LITELLM_SPEC} (one-off, a few minutes)")
    subprocess.run([sys.executable, "-m", "venv", str(LITELLM_VENV)], check=True)
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", LITELLM_SPEC])
    if r.returncode != 0:
        log("LiteLLM install failed; continuing without it")
        return None
    return py


WRK_LUA = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer %(key)s"
wrk.body = '%(body)s'
"""


def run_wrk(wrk: str, url: str, body: dict, conc: int, duration: int, tmp: str) -> dict:
    lua = Path(tmp) / f"req-{conc}.lua"
    lua.write_text(WRK_LUA % {"key": MASTER_KEY, "body": json.dumps(body)})
    cmd = ["taskset", "-c", "0", wrk, "-t", "1", "-c", str(conc), "-d", f"{duration}s", "--latency",
           "-s", str(lua), url]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60).stdout
    def ms(label: str) -> float:
        m = re.search(rf"^\s+{label}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        if not m:
            return float("nan")
        v, unit = float(m.group(1)), m.group(2)
        return v / 1000 if unit == "us" else v * 1000 if unit == "s" else v
    reqs = int(re.search(r"(\d+) requests in", out).group(1))
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    errors = 0
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if m:
        errors += int(m.group(1))
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if m:
        errors += sum(int(x) for x in m.groups())
    return {"p50_ms": ms("50"), "p99_ms": ms("99"), "rps": rps, "requests": reqs, "errors": errors}


def start(cmd: list[str], cpu: int, env: dict | None = None, logfile: str | None = None) -> subprocess.Popen:
    out = open(logfile, "w") if logfile else subprocess.DEVNULL
    full = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
    return subprocess.Popen(["taskset", "-c", str(cpu), *cmd], stdout=out, stderr=subprocess.STDOUT,
                            env=full, start_new_session=True)


def stop(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=int, default=8, help="seconds per cell")
    ap.add_argument("--conc", default="1,32,64")
    ap.add_argument("--no-litellm", action="store_true")
    ap.add_argument("--no-stream", action="store_true")
    ap.add_argument("--rounds", type=int, default=1, help="measure each cell this many times, alternating the "
                    "targets' order, and report the medians")
    ap.add_argument("--baseline", "--before", default="", help="directory holding another vlm_gateway package to measure "
                    "beside this one (before/after)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "overhead.json"))
    a = ap.parse_args()
    wrk = ensure_wrk()
    litellm_py = None if a.no_litellm else ensure_litellm()
    tmp = tempfile.mkdtemp(prefix="vlmgw-bench-")
    procs = []
    up_port, gw_port, ll_port = free_port(), free_port(), free_port()
    try:
        procs.append(start([sys.executable, str(ROOT / "benchmarks" / "fake_upstream.py"), "--port",
                            str(up_port)], 0))
        wait_url(f"http://127.0.0.1:{up_port}/health")
        targets = {"direct": f"http://127.0.0.1:{up_port}/v1/chat/completions"}
        gw = start([sys.executable, "-m", "vlm_gateway", "serve", "--port", str(gw_port), "--backend",
                    f"http://127.0.0.1:{up_port}/v1"], 1, logfile=f"{tmp}/gateway.log",
                   env={"VLM_GATEWAY_CACHE__ENABLED": "false"})
        procs.append(gw)
        wait_url(f"http://127.0.0.1:{gw_port}/ready")
        targets["vlm-gateway"] = f"http://127.0.0.1:{gw_port}/v1/chat/completions"
        pids = {"vlm-gateway": gw.pid}
        if a.baseline:
            base_port = free_port()
            base = start([sys.executable, "-m", "vlm_gateway", "serve", "--port", str(base_port), "--backend",
                          f"http://127.0.0.1:{up_port}/v1"], 1, logfile=f"{tmp}/gateway-base.log",
                         env={"VLM_GATEWAY_CACHE__ENABLED": "false", "PYTHONPATH": a.baseline})
            procs.append(base)
            wait_url(f"http://127.0.0.1:{base_port}/ready")
            targets["vlm-gateway-base"] = f"http://127.0.0.1:{base_port}/v1/chat/completions"
            pids["vlm-gateway-base"] = base.pid
        if litellm_py:
            cfg = Path(tmp) / "litellm.yaml"
            cfg.write_text(f"model_list:\n  - model_name: bench-model\n    litellm_params:\n"
                           f"      model: openai/bench-model\n      api_base: http://127.0.0.1:{up_port}/v1\n"
                           f"      api_key: none\n")
            env = {"LITELLM_MASTER_KEY": MASTER_KEY, "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                   "LITELLM_TELEMETRY": "False", "DATABASE_URL": None}
            ll = start([str(LITELLM_VENV / "bin" / "litellm"), "--config", str(cfg), "--port", str(ll_port),
                        "--host", "127.0.0.1", "--num_workers", "1"], 1, env=env, logfile=f"{tmp}/litellm.log")
            procs.append(ll)
            log("waiting for LiteLLM's proxy")
            wait_url(f"http://127.0.0.1:{ll_port}/health/liveliness", timeout=120)
            targets["litellm"] = f"http://127.0.0.1:{ll_port}/v1/chat/completions"
            pids["litellm"] = ll.pid
        payloads = {"text": {"model": "bench-model", "messages": [{"role": "user", "content": "Say ok."}],
                             "max_tokens": 16}}
        if not a.no_stream:
            payloads["stream"] = {**payloads["text"], "stream": True}
        results = []
        concs = [int(c) for c in a.conc.split(",")]
        for pname, body in payloads.items():
            for conc in concs:
                cells: dict[str, list[dict]] = {}
                for rnd in range(a.rounds):
                    # alternate the order each round, so that neither target always runs
                    # right after the other (a noisy machine drifts within a cell)
                    order = list(targets.items())
                    if rnd % 2:
                        order.reverse()
                    for name, url in order:
                        # warm-up, then the measured cell
                        run_wrk(wrk, url, body, conc, 1, tmp)
                        c0 = cpu_seconds(pids[name]) if name in pids else None
                        r = run_wrk(wrk, url, body, conc, a.duration, tmp)
                        if c0 is not None:
                            r["cpu_ms_per_req"] = (cpu_seconds(pids[name]) - c0) * 1000 / max(1, r["requests"])
                        r.update(target=name, payload=pname, conc=conc)
                        cells.setdefault(name, []).append(r)
                        log(f"{pname:6s} conc {conc:3d} {name:12s} p50 {r['p50_ms']:8.3f} ms  p99 {r['p99_ms']:8.3f} ms"
                            f"  {r['rps']:9.1f} req/s  errors {r['errors']}"
                            + (f"  cpu/req {r['cpu_ms_per_req']:.3f} ms" if "cpu_ms_per_req" in r else ""))
                for name in targets:
                    results.append(_median_cell(cells[name]))
    finally:
        for p in reversed(procs):
            stop(p)
    report(results, a)


def _median_cell(runs: list[dict]) -> dict:
    """One cell from its rounds: the median of each figure, errors summed."""
    if len(runs) == 1:
        return runs[0]
    out = dict(runs[0])
    for k in ("p50_ms", "p99_ms", "rps", "cpu_ms_per_req"):
        if k in out:
            out[k] = statistics.median(r[k] for r in runs)
    out["requests"] = sum(r["requests"] for r in runs)
    out["errors"] = sum(r["errors"] for r in runs)
    out["rounds"] = len(runs)
    return out


def report(results: list[dict], a) -> None:
    meta = {"date": dt.date.today().isoformat(), "machine": f"{platform.machine()} {os.cpu_count()} cores "
            "(shared VM)", "command": "python benchmarks/overhead.py " + " ".join(sys.argv[1:]),
            "duration_s": a.duration, "rounds": a.rounds}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    direct = {(r["payload"], r["conc"]): r for r in results if r["target"] == "direct"}
    lines = ["| payload | conc | target | p50 ms | p99 ms | added p50 ms | added p99 ms | req/s | CPU ms/req | errors |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        d = direct[(r["payload"], r["conc"])]
        added = "" if r["target"] == "direct" else f"{r['p50_ms'] - d['p50_ms']:.3f}"
        added99 = "" if r["target"] == "direct" else f"{r['p99_ms'] - d['p99_ms']:.3f}"
        lines.append(f"| {r['payload']} | {r['conc']} | {r['target']} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | "
                     f"{added} | {added99} | {r['rps']:.0f} | {r.get('cpu_ms_per_req', float('nan')):.3f} | "
                     f"{r['errors']} |")
    ratios = []
    by = {(r["payload"], r["conc"], r["target"]): r for r in results}
    for (p, c), d in direct.items():
        g, l = by.get((p, c, "vlm-gateway")), by.get((p, c, "litellm"))
        if g and l:
            ga, la = g["p50_ms"] - d["p50_ms"], l["p50_ms"] - d["p50_ms"]
            ratios.append(f"| {p} | {c} | {la / ga if ga > 0 else float('inf'):.1f}x | {g['rps'] / l['rps']:.1f}x | "
                          f"{l.get('cpu_ms_per_req', 0) / max(1e-9, g.get('cpu_ms_per_req', 0)):.1f}x |")
    text = "\n".join(lines)
    if ratios:
        text += ("\n\nvlm-gateway vs LiteLLM (same run):\n\n| payload | conc | LiteLLM added p50 / ours | "
                 "our req/s / LiteLLM's | LiteLLM CPU/req / ours |\n|---|---|---|---|---|\n" + "\n".join(ratios))
    print(text)
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
