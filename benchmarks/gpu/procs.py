"""CPU per process, sampled from /proc: the gateway (its supervisor and every worker) and
the engine (its API server and engine-core processes), found from their pid files by
walking the process tree, plus the machine's busy share. ``snapshot()`` at the start and
end of a cell; ``delta()`` gives percent of one core per process over the cell."""

from __future__ import annotations

import os
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float, str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name = raw[raw.index("(") + 1:raw.rindex(")")]
    f = raw[raw.rindex(")") + 2:].split()
    return int(f[1]), (int(f[11]) + int(f[12])) / TICK, name  # ppid, utime+stime s, comm


def tree(root: int) -> list[int]:
    """``root`` and all its descendants."""
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            s = _stat(int(d))
            if s is not None:
                parent[int(d)] = s[0]
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        if p in parent or p == root:
            out.append(p)
            todo += [c for c, pp in parent.items() if pp == p]
    return out


def _machine() -> tuple[float, float]:
    f = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    v = [float(x) for x in f]
    idle = v[3] + v[4]
    return sum(v), idle


def _cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:160]
    except OSError:
        return ""


def read_pid(path: str) -> int | None:
    try:
        return int(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class Sampler:
    def __init__(self, groups: dict[str, str]) -> None:
        """``groups``: name -> pid file (e.g. gateway -> /root/gateway.pid)."""
        self.groups = groups

    def snapshot(self) -> dict:
        procs = {}
        for g, pid_file in self.groups.items():
            root = read_pid(pid_file)
            if root is None:
                continue
            for pid in tree(root):
                s = _stat(pid)
                if s is not None:
                    procs[pid] = {"group": g, "cpu_s": s[1], "name": s[2], "cmd": _cmd(pid)}
        return {"t": time.perf_counter(), "machine": _machine(), "procs": procs}

    @staticmethod
    def delta(a: dict, b: dict) -> dict:
        wall = b["t"] - a["t"]
        total = b["machine"][0] - a["machine"][0]
        idle = b["machine"][1] - a["machine"][1]
        rows = []
        for pid, p in b["procs"].items():
            before = a["procs"].get(pid, {}).get("cpu_s", 0.0) if pid in a["procs"] else 0.0
            used = p["cpu_s"] - before
            rows.append({"pid": pid, "group": p["group"], "name": p["name"], "cpu_pct": round(100 * used / wall, 1),
                         "cpu_s": round(used, 2), "cmd": p["cmd"]})
        rows.sort(key=lambda r: -r["cpu_s"])
        workers = [r for r in rows if r["group"] == "gateway" and "multiprocessing.spawn" in r["cmd"]]
        out = {"wall_s": round(wall, 2), "machine_busy_pct": round(100 * (1 - idle / total), 1) if total else None,
               "procs": rows}
        by_group: dict[str, float] = {}
        for r in rows:
            by_group[r["group"]] = by_group.get(r["group"], 0.0) + r["cpu_pct"]
        out["group_cpu_pct"] = {k: round(v, 1) for k, v in by_group.items()}
        if workers:
            busiest, quietest = max(r["cpu_pct"] for r in workers), min(r["cpu_pct"] for r in workers)
            out["gateway_workers"] = {"n": len(workers), "busiest_pct": busiest, "quietest_pct": quietest,
                                      "ratio": round(busiest / quietest, 2) if quietest > 0 else None}
        return out
