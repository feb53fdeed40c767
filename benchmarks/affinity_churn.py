"""How many conversations change home when an engine leaves or joins the pool.

A conversation's home is ``router.affinity.home(root, candidates)``: rendezvous hashing over
the candidates' names. When one of N engines leaves, only the conversations homed on it
move (expected share 1/N); when one joins, only those it now wins move, all of them to it
(expected 1/(N+1)). For contrast, the same roots under modulo hashing (H(root) mod N over
the sorted names), which moves about (N-1)/N of them.

    python benchmarks/affinity_churn.py [--roots 20000]   # writes docs/benchmarks/discovery.md
                                                          # (+ affinity-churn.png with matplotlib)
"""

from __future__ import annotations

import argparse
import hashlib
import platform
import time
from pathlib import Path

from vlm_gateway.backends.backend import Backend
from vlm_gateway.backends.router.affinity import home

DOCS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"
SIZES = (2, 3, 4, 6, 8, 12, 16, 32)


def pool(n: int, start: int = 0) -> list[Backend]:
    return [Backend(name=f"10.244.{i // 250}.{i % 250 + 2}:8000", base_url="") for i in range(start, start + n)]


def roots(count: int, seed: str = "conv") -> list[bytes]:
    return [hashlib.blake2b(f"{seed}{i}".encode(), digest_size=32).digest() for i in range(count)]


def moved_share(rs: list[bytes], before: list[Backend], after: list[Backend]) -> tuple[float, bool]:
    """(share of roots whose home differs, whether every move is forced: to a joiner or off a leaver)."""
    left = {b.name for b in before} - {b.name for b in after}
    joined = {b.name for b in after} - {b.name for b in before}
    moved, minimal = 0, True
    for r in rs:
        h0, h1 = home(r, before).name, home(r, after).name
        if h0 != h1:
            moved += 1
            minimal &= h0 in left or h1 in joined
    return moved / len(rs), minimal


def modulo_share(rs: list[bytes], before: list[Backend], after: list[Backend]) -> float:
    def pick(r, c):
        names = sorted(b.name for b in c)
        return names[int.from_bytes(r[:8], "big") % len(names)]
    return sum(pick(r, before) != pick(r, after) for r in rs) / len(rs)


def measure(count: int) -> list[dict]:
    rs = roots(count)
    rows = []
    for n in SIZES:
        p = pool(n)
        leave, ok_l = moved_share(rs, p, p[:n // 2] + p[n // 2 + 1:])
        join, ok_j = moved_share(rs, p, p + pool(1, start=n))
        rows.append({"n": n, "leave": leave, "join": join, "minimal": ok_l and ok_j,
                     "mod_leave": modulo_share(rs, p, p[:n // 2] + p[n // 2 + 1:]),
                     "mod_join": modulo_share(rs, p, p + pool(1, start=n))})
    return rows


def write(rows: list[dict], count: int, seconds: float) -> None:
    lines = ["## Affinity homes when engines leave or join", "",
             "Share of conversations whose home (the rendezvous choice `router.affinity.home`) changes when "
             "one of N engines leaves or one joins, over "
             f"{count:,} conversation roots; beside it, the same roots under modulo hashing. Every move under "
             "rendezvous hashing is a forced one (off the engine that left, or onto the one that joined): "
             "the other conversations keep their engine and its KV cache.", "",
             "| engines N | leaves: moved | 1/N | joins: moved | 1/(N+1) | only forced moves | modulo, leaves | modulo, joins |",
             "|---:|---:|---:|---:|---:|:---:|---:|---:|"]
    for r in rows:
        n = r["n"]
        lines.append(f"| {n} | {r['leave']:.2%} | {1 / n:.2%} | {r['join']:.2%} | {1 / (n + 1):.2%} | "
                     f"{'yes' if r['minimal'] else 'NO'} | {r['mod_leave']:.1%} | {r['mod_join']:.1%} |")
    lines += ["", "Figure: `docs/benchmarks/affinity-churn.png` (written beside this page with matplotlib).", "",
              f"Command: `python benchmarks/affinity_churn.py --roots {count}` ({seconds:.1f} s; "
              f"{platform.python_implementation()} {platform.python_version()}, {time.strftime('%Y-%m-%d')}). "
              "Pure computation: no machine caveat. The test `tests/test_affinity_churn.py` asserts the same "
              "property (within 4 standard deviations of 1/N, only forced moves).", ""]
    (DOCS / "discovery.md").write_text("\n".join(lines))


def plot(rows: list[dict]) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    ns = [r["n"] for r in rows]
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=110)
    ax.plot(ns, [r["leave"] for r in rows], "o-", label="rendezvous, one leaves")
    ax.plot(ns, [r["join"] for r in rows], "s-", label="rendezvous, one joins")
    ax.plot(ns, [1 / n for n in ns], "k:", label="1/N")
    ax.plot(ns, [r["mod_leave"] for r in rows], "x--", color="grey", label="modulo hashing, one leaves")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.set_xlabel("engines N")
    ax.set_ylabel("conversations that change engine")
    ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(DOCS / "affinity-churn.png")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--roots", type=int, default=20000)
    a = ap.parse_args()
    t0 = time.perf_counter()
    rows = measure(a.roots)
    write(rows, a.roots, time.perf_counter() - t0)
    plot(rows)
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
