"""Run image cases under hard resource bounds, one forked child per case.

    python tests/bounded.py [--as-mb 1024] [--cpu-s 10] [--max-decode-mb 256] [--control | --legit] [NAME ...]

Builds the hostile corpus (``corpus.hostile()``) in this process, then forks one
child per case with ``RLIMIT_AS`` (address space above what this process already
maps) and ``RLIMIT_CPU`` set, runs ``rewrite_bytes`` on the bytes, and prints one
JSON line per case: the error code (or ``"accepted"``), the child's CPU seconds and
its peak RSS growth over the parent's RSS at fork time (``os.wait4`` rusage), and
what the decodes reserved (``estimate_mb``: ``memory.need``, summed). A child killed
by a limit reports ``"killed"`` with the signal. Used by the tests so that a decoder
regression (a bomb that allocates or spins) fails them. ``--legit``: valid images of
every format and conversion (``corpus.memory_corpus()``) measured one after another in
this (fresh) interpreter, libvips included, to compare the estimate with what the decode
really holds; ``--max-decode-mb 0``: no per-image memory cap.
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


def _trim() -> None:
    """Give the heap this process freed back to the kernel (glibc ``malloc_trim``): a forked
    child would otherwise reuse freed-but-resident pages and show no growth for what it
    allocates (building the corpus frees hundreds of MB)."""
    import ctypes
    import gc
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        pass
    gc.freeze()  # the child's collections leave the parent's objects (and their pages) alone


def _fresh_allocations() -> None:
    """In the child: every block of 64 KB or more gets pages of its own (mmap), so what the
    decode allocates shows in the resident set instead of reusing the parent's heap."""
    import ctypes
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        pass


def _measured(data: bytes, as_mb: int, cpu_s: int, max_pixels: int, max_decode_mb: int, policy: str,
              limits: bool = True) -> dict:
    """Rewrite ``data`` under the limits in this process, measuring its peak RSS growth."""
    from vlm_gateway.stages.images.decode import ImageError
    from vlm_gateway.stages.images.memory import DecodeLimits
    from vlm_gateway.stages.images.policy import Policy
    from vlm_gateway.stages.images.rewrite import rewrite_bytes

    own_peak = _reset_peak()
    base = _rss_kb()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    try:
        if limits:
            limit = _vm_bytes() + as_mb * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
        reserved: list[int] = []
        limits = DecodeLimits(max_decode_mb * 1024 * 1024, reserved.append, lambda n: None)
        try:
            res = rewrite_bytes(data, Policy(enabled=False) if policy == "off" else None,
                                max_source_pixels=max_pixels, limits=limits)
            out = {"result": "accepted", "size": [res.width, res.height], "conversions": list(res.conversions)}
        except ImageError as e:
            out = {"result": e.code, "message": str(e)}
        except MemoryError:
            out = {"result": "MemoryError"}
        out["estimate_mb"] = round(sum(reserved) / 2**20, 1)
    except BaseException as e:  # noqa: BLE001 - reported to the parent as a result
        out = {"result": f"exception:{type(e).__name__}", "message": str(e)[:200]}
    if own_peak:
        out["rss_growth_mb"] = round(max(0, _hwm_kb() - base) / 1024, 1)
    ru = resource.getrusage(resource.RUSAGE_SELF)
    out["own_cpu_s"] = round(ru.ru_utime + ru.ru_stime - cpu0.ru_utime - cpu0.ru_stime, 4)
    return out


def run_case(data: bytes, as_mb: int, cpu_s: int, max_pixels: int, max_decode_mb: int = 256,
             policy: str = "") -> dict:
    """One forked child: quick, for refusals (libvips is off in a forked child: PNGs take
    Pillow's decoder there)."""
    _trim()
    base_rss = _rss_kb()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        _fresh_allocations()
        os.write(w, json.dumps(_measured(data, as_mb, cpu_s, max_pixels, max_decode_mb, policy)).encode())
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


def legit_cases(names: list[str], size: str = "") -> list[tuple[str, bytes, str]]:
    import image_corpus as C
    w, h = (int(v) for v in size.split("x")) if size else (2400, 1600)
    cases = [(f"{name}{' (policy off)' if off else ''}", data, "off" if off else "")
             for name, data, both in C.memory_corpus(w, h) for off in ((False, True) if both else (False,))]
    return [c for c in cases if not names or c[0] in names]


def measure_legit(a) -> None:
    """In this fresh interpreter, one case after another: every block of 64 KB or more is
    mapped and unmapped on its own (``_fresh_allocations``), so a case cannot reuse what
    the one before freed, and libvips runs as in the gateway."""
    _fresh_allocations()
    cases = legit_cases(a.names, a.size)
    _warm()
    _trim()
    for name, data, policy in cases:
        # the second of two runs: what a request costs, without the caches a first one fills
        _measured(data, 1 << 20, 600, a.max_pixels, a.max_decode_mb, policy, limits=False)
        out = _measured(data, 1 << 20, 600, a.max_pixels, a.max_decode_mb, policy, limits=False)
        out["cpu_s"] = out.pop("own_cpu_s")
        print(json.dumps({"name": name, "bytes": len(data), "expected": ["accepted"], **out}), flush=True)


def _warm() -> None:
    """The imports, plugins and first-use buffers of every path, before measuring."""
    import image_corpus as C
    from vlm_gateway.stages.images.rewrite import rewrite_bytes
    for warm in (C.photo_jpeg(1200, 800), C.screenshot_png(1200, 800), C.webp(900, 600), C.avif(900, 600),
                 C.heic(900, 600), C.rgba_png(900, 600), C.p3_tagged("JPEG")):
        rewrite_bytes(warm)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--as-mb", type=int, default=1024)
    ap.add_argument("--cpu-s", type=int, default=10)
    ap.add_argument("--max-pixels", type=int, default=64_000_000)
    ap.add_argument("--max-decode-mb", type=int, default=256)
    ap.add_argument("--control", action="store_true",
                    help="run only a legitimate 48 MP PNG, to show the harness sees a real allocation")
    ap.add_argument("--legit", action="store_true",
                    help="valid images of every format and conversion, measured one after another in this "
                         "interpreter (run it fresh)")
    ap.add_argument("--size", default="", help="--legit: the images' size, WxH (default 2400x1600)")
    ap.add_argument("names", nargs="*")
    a = ap.parse_args()
    import image_corpus as C
    if a.legit:
        return measure_legit(a)
    _warm()  # before forking
    if a.control:
        from PIL import Image
        cases = {"control-48mp-png": (C.save(Image.new("RGB", (8000, 6000), (10, 20, 30)), "PNG"),
                                      {"accepted"})}
    else:
        cases = C.hostile()
    for name, case in cases.items():
        data, codes, policy = case if len(case) == 3 else (*case, "")
        if a.names and name not in a.names:
            continue
        out = {"name": name, "bytes": len(data), "expected": sorted(codes),
               **run_case(data, a.as_mb, a.cpu_s, a.max_pixels, a.max_decode_mb, policy)}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    main()
