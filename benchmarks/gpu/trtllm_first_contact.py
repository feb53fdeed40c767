#!/usr/bin/env python3
"""First contact with a real trtllm-serve: check what it exposes and what the gateway reads.

    python3 benchmarks/gpu/trtllm_first_contact.py --engine http://127.0.0.1:8000 --model MODEL
    # then, with a gateway in front of the engine:
    python3 benchmarks/gpu/trtllm_first_contact.py --engine http://127.0.0.1:8000 --model MODEL \
        --gateway http://127.0.0.1:8080 --backend NAME --gateway-only [--out report.json]

Run the engine checks while nothing else reads the engine's /metrics: trtllm-serve keeps
its iteration statistics in one queue that every read drains, so a gateway scraping the
same engine takes them away from this script (and vice versa).

Needs only httpx and Pillow. Each check prints PASS / WARN / FAIL with what it means
(docs/TRTLLM.md, "First contact"); the exit status is 1 when any check failed.

 1. /health, /version, /v1/models
 2. /metrics before traffic (trtllm-serve answers [] at once before the first request)
 3. one image request straight to the engine: usage, prompt tokens
 4. /metrics after it: a JSON list of iteration statistics, answered about 2 s after the
    engine's last iteration, with the keys the gateway reads
 5. /prometheus/metrics: absent (return_perf_metrics off), request series only (1.2
    line), or the load gauges (1.3 pre-releases): which source the gateway will use
 6. the same request again: KV block reuse (reusedBlocks, cached_tokens)
 7. through the gateway (optional): token accounting (the gateway's visual-token count
    against the engine's prompt tokens) and the figures the gateway scraped
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import sys
import time
import uuid

import httpx

GATEWAY_KEYS = ("numActiveRequests", "numQueuedRequests", "numCompletedRequests")
KV_KEYS = ("usedNumBlocks", "maxNumBlocks", "reusedBlocks", "missedBlocks", "tokensPerBlock")
LOAD_NAMES = ("trtllm_num_requests_running", "trtllm_num_requests_waiting", "trtllm_kv_cache_utilization")


class Report:
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def add(self, status: str, check: str, detail: str) -> None:
        self.rows.append({"status": status, "check": check, "detail": detail})
        print(f"{status:4}  {check}: {detail}", flush=True)

    @property
    def failed(self) -> bool:
        return any(r["status"] == "FAIL" for r in self.rows)


def picture(width: int = 1920, height: int = 1080) -> str:
    """A synthetic screenshot-like PNG (bands and boxes), as a data URI."""
    from PIL import Image, ImageDraw
    im = Image.new("RGB", (width, height), (245, 245, 240))
    d = ImageDraw.Draw(im)
    for i in range(0, height, 60):
        d.rectangle([40, i + 10, width - 40, i + 40], fill=((i * 7) % 200, 90, 160))
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def chat(base: str, model: str, image: str, text: str, timeout: float = 120) -> httpx.Response:
    return httpx.post(base.rstrip("/") + "/v1/chat/completions", timeout=timeout, json={
        "model": model, "max_tokens": 8, "temperature": 0,
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}},
                                                  {"type": "text", "text": text}]}]})


def read_stats(engine: str, timeout: float = 30) -> tuple[list | None, float]:
    t0 = time.monotonic()
    try:
        r = httpx.get(engine + "/metrics", timeout=timeout)
        body = r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        body = None
    return body, time.monotonic() - t0


def run(args: argparse.Namespace) -> Report:
    rep = Report()
    eng = args.engine.rstrip("/")
    # 1. basics
    try:
        h = httpx.get(eng + "/health", timeout=10)
        rep.add("PASS" if h.status_code == 200 else "FAIL", "health", f"HTTP {h.status_code}")
    except httpx.HTTPError as e:
        rep.add("FAIL", "health", f"{e!r}: is trtllm-serve listening there?")
        return rep
    v = httpx.get(eng + "/version", timeout=10)
    rep.add("PASS" if v.status_code == 200 else "WARN", "version",
            v.text.strip()[:80] if v.status_code == 200 else f"HTTP {v.status_code} (not trtllm-serve?)")
    models = [m.get("id") for m in httpx.get(eng + "/v1/models", timeout=10).json().get("data", [])]
    rep.add("PASS" if args.model in models else "FAIL", "models",
            f"served {models}; the gateway's backends[].models / requests must use one of these")
    image = picture()
    if not args.gateway_only:
        engine_checks(rep, eng, args.model, image)
    if args.gateway:
        gateway_checks(rep, eng, args, image)
    return rep


def engine_checks(rep: Report, eng: str, model: str, image: str) -> None:
    # 2. /metrics before this script's traffic
    body, took = read_stats(eng)
    rep.add("PASS" if isinstance(body, list) else "FAIL", "metrics before traffic",
            f"{'list of ' + str(len(body)) if isinstance(body, list) else body!r} in {took:.1f} s")

    # 3. one image request straight to the engine
    nonce = uuid.uuid4().hex[:8]
    r = chat(eng, model, image, f"Describe this screen. ({nonce})")
    if r.status_code != 200:
        rep.add("FAIL", "direct request", f"HTTP {r.status_code}: {r.text[:300]}")
        return
    usage = r.json().get("usage") or {}
    direct_prompt = usage.get("prompt_tokens")
    rep.add("PASS" if direct_prompt else "FAIL", "direct request usage",
            f"{usage} (1920x1080 image, raw)")

    # 4. iteration statistics after traffic
    body, took = read_stats(eng)
    if not body:
        rep.add("FAIL", "iteration statistics",
                f"{body!r} after a request: enable_iter_perf_stats is not on (PyTorch backend default), "
                "or another reader drained the queue (a second gateway worker, Prometheus collector)")
    else:
        last = max(body, key=lambda s: s.get("iter", 0))
        kv = last.get("kvCacheStats") or {}
        missing = [k for k in GATEWAY_KEYS if k not in last] + [f"kvCacheStats.{k}" for k in KV_KEYS if k not in kv]
        rep.add("FAIL" if missing else "PASS", "iteration statistics",
                f"{len(body)} iterations in {took:.1f} s (trtllm-serve waits 2 s for one more); last: "
                f"active {last.get('numActiveRequests')} completed {last.get('numCompletedRequests')} "
                f"queued {last.get('numQueuedRequests')} kv {kv.get('usedNumBlocks')}/{kv.get('maxNumBlocks')} "
                f"reused {kv.get('reusedBlocks')} missed {kv.get('missedBlocks')}"
                + (f"; MISSING {missing}" if missing else ""))

    # 5. Prometheus endpoint
    p = httpx.get(eng + "/prometheus/metrics", timeout=10)
    if p.status_code == 404:
        rep.add("WARN", "prometheus", "404: return_perf_metrics is off; the gateway reads /metrics (JSON)")
    elif p.status_code == 200:
        present = [n for n in LOAD_NAMES if f"\n{n}{{" in "\n" + p.text]
        if len(present) == len(LOAD_NAMES):
            rep.add("PASS", "prometheus", f"load gauges present {present}: the gateway reads /prometheus/metrics")
        else:
            names = sorted({ln.split("{")[0].split(" ")[0] for ln in p.text.splitlines()
                            if ln and not ln.startswith("#")})
            rep.add("PASS", "prometheus", f"no load gauges (1.2 line: request series {names[:6]}...); "
                                          "the gateway reads /metrics (JSON)")
    else:
        rep.add("WARN", "prometheus", f"HTTP {p.status_code}")

    # 6. prefix (KV block) reuse on a repeat
    r2 = chat(eng, model, image, f"Describe this screen. ({nonce})")
    cached = ((r2.json().get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
    body2, _ = read_stats(eng)
    reused = None
    if body2:
        reused = (max(body2, key=lambda s: s.get("iter", 0)).get("kvCacheStats") or {}).get("reusedBlocks")
    before = (max(body, key=lambda s: s.get("iter", 0)).get("kvCacheStats") or {}).get("reusedBlocks") if body else None
    grew = reused is not None and before is not None and reused > before
    rep.add("PASS" if grew or (cached or 0) > 0 else "WARN", "prefix reuse",
            f"reusedBlocks {before} -> {reused}, cached_tokens {cached} on the identical repeat "
            "(WARN: kv_cache_config.enable_block_reuse off, or this model's multimodal reuse unsupported)")


def gateway_checks(rep: Report, eng: str, args: argparse.Namespace, image: str) -> None:
    # 7. through the gateway
    gw = args.gateway.rstrip("/")
    nonce2 = uuid.uuid4().hex[:8]
    rd = chat(eng, args.model, image, f"Count the bands. ({nonce2})")
    rg = chat(gw, args.model, image, f"Count the bands. ({nonce2})")
    if rg.status_code != 200:
        rep.add("FAIL", "gateway request", f"HTTP {rg.status_code}: {rg.text[:300]}")
        return
    tokens = dict(kv.split("=") for kv in rg.headers.get("x-vlm-gateway-visual-tokens", "").split(";") if kv)
    d_prompt = (rd.json().get("usage") or {}).get("prompt_tokens")
    g_prompt = (rg.json().get("usage") or {}).get("prompt_tokens")
    if tokens and d_prompt and g_prompt:
        saved_engine = d_prompt - g_prompt
        saved_gateway = int(tokens["before"]) - int(tokens["after"])
        rep.add("PASS" if saved_engine == saved_gateway else "FAIL", "token accounting",
                f"engine prompt tokens raw {d_prompt}, via gateway {g_prompt}: {saved_engine} fewer; "
                f"gateway counted visual tokens {tokens['before']} -> {tokens['after']} ({saved_gateway} fewer)"
                + ("" if saved_engine == saved_gateway else
                   ": the engine's image processor does not size images as the gateway assumes "
                   "(check images.max_pixels / the model's processor config)"))
    else:
        rep.add("WARN", "token accounting", f"headers {dict(rg.headers)} usage {rg.json().get('usage')}")
    rep.add("PASS", "gateway backend", rg.headers.get("x-vlm-gateway-backend", "?"))
    deadline = time.monotonic() + 15
    seen = {}
    while time.monotonic() < deadline:
        st = httpx.get(gw + "/ui/api/status", timeout=10).json()
        b = [b for b in st.get("backends", []) if not args.backend or b["name"] == args.backend]
        seen = b[0].get("engine_load") if b else {}
        if seen and "running" in seen:
            break
        time.sleep(0.5)
    rep.add("PASS" if seen and "running" in seen else "FAIL", "gateway scraped figures",
            f"{seen} (the gateway logs 'engine load from URL (format)' when it settles on a source)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", required=True, help="trtllm-serve origin, e.g. http://127.0.0.1:8000")
    ap.add_argument("--model", required=True, help="served model name (see /v1/models)")
    ap.add_argument("--gateway", help="gateway origin in front of it, e.g. http://127.0.0.1:8080")
    ap.add_argument("--backend", default="", help="the engine's backend name in the gateway config")
    ap.add_argument("--gateway-only", action="store_true",
                    help="skip the engine checks (2-6): a gateway that scrapes the engine drains its /metrics")
    ap.add_argument("--out", help="write the checks as JSON here")
    args = ap.parse_args(argv)
    rep = run(args)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rep.rows, f, indent=1)
    return 1 if rep.failed else 0


if __name__ == "__main__":
    sys.exit(main())
