"""Run image cases under hard resource bounds, one forked child per case.

    python tests/bounded.py [--as-mb 1024] [--cpu-s 10] [--control] [NAME ...]

Builds the hostile corpus (``corpus.hostile()``) in this process, then forks one
child per case with ``RLIMIT_AS`` (address space above what this process already
maps) and ``RLIMIT_CPU`` set, runs ``rewrite_bytes`` on the bytes, and prints one
JSON line per case: the error code (or ``"accepted"``), the child's CPU seconds and
its peak RSS growth over the parent's RSS at fork time (``os.wait4`` rusage). A
child killed by a limit reports ``"killed"`` with the signal. Used by the tests so
that a decoder regression (a bomb that allocates or spins) fails them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _vm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _hwm_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def _reset_peak() -> bool:
    """Reset this process's peak RSS (Linux >= 4.0): a forked child inherits the parent's
    high-water mark, which would hide (or invent) the child's own growth."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def run_case(data: bytes, as_mb: int, cpu_s: int, max_pixels: int) -> dict:
    from vlm_gateway.stages.images.decode import ImageError
    from vlm_gateway.stages.images.rewrite import rewrite_bytes

    base_rss = _rss_kb()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        out = {}
        own_peak = _reset_peak()
        child_base = _rss_kb()
        try:
            limit = _vm_bytes() + as_mb * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
            try:
                res = rewrite_bytes(data, max_source_pixels=max_pixels)
                out = {"result": "accepted", "size": [res.width, res.height], "conversions": list(getattr(res, "conversions", ()))}
            except ImageError as e:
                out = {"result": e.code, "message": str(e)}
            except MemoryError:
                out = {"result": "MemoryError"}
        except BaseException as e:  # noqa: BLE001 - reported to the parent as a result
            out = {"result": f"exception:{type(e).__name__}", "message": str(e)[:200]}
        if own_peak:
            out["rss_growth_mb"] = round(max(0, _hwm_kb() - child_base) / 1024, 1)
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    chunks = []
    while True:
        b = os.read(r, 65536)
        if not b:
            break
        chunks.append(b)
    os.close(r)
    _, status, ru = os.wait4(pid, 0)
    out = json.loads(b"".join(chunks)) if chunks else {"result": "killed", "signal": os.WTERMSIG(status)
                                                       if os.WIFSIGNALED(status) else None}
    out["cpu_s"] = round(ru.ru_utime + ru.ru_stime, 4)
    if "rss_growth_mb" not in out:  # killed by a limit, or no clear_refs: the kernel's figure
        out["rss_growth_mb"] = round(max(0, ru.ru_maxrss - base_rss) / 1024, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--as-mb", type=int, default=1024)
    ap.add_argument("--cpu-s", type=int, default=10)
    ap.add_argument("--max-pixels", type=int, default=64_000_000)
    ap.add_argument("--control", action="store_true",
                    help="run only a legitimate 48 MP PNG, to show the harness sees a real allocation")
    ap.add_argument("names", nargs="*")
    a = ap.parse_args()
    import image_corpus as C
    from vlm_gateway.stages.images.rewrite import rewrite_bytes
    rewrite_bytes(C.photo_jpeg(64, 64))  # warm the imports and plugins before forking
    if a.control:
        from PIL import Image
        cases = {"control-48mp-png": (C.save(Image.new("RGB", (8000, 6000), (10, 20, 30)), "PNG"),
                                      {"accepted"})}
    else:
        cases = C.hostile()
    for name, (data, codes) in cases.items():
        if a.names and name not in a.names:
            continue
        out = {"name": name, "bytes": len(data), "expected": sorted(codes),
               **run_case(data, a.as_mb, a.cpu_s, a.max_pixels)}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    main()
