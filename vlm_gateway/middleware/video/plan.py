"""Output plan: which samples become output frames, at what constant rate.

Input: ``kept`` flags of K samples taken at rate ``f`` (sample k at ``k / f``; a sample
that is not kept is a near-duplicate of the last kept one: the same *state*).

The engine reads a constant-rate stream and, at an output rate ``R <= 2`` fps, takes
every frame and stamps frame ``j`` with ``j / R`` seconds (docs/VIDEO.md). So the output
is the grid ``j x m`` of samples at ``R = f / m``, where ``m`` is the largest step such
that every state still lands on a grid sample: any ``m`` consecutive samples contain a
multiple of ``m``, so ``m`` = the shortest state's length in samples (the last state
excepted: it is cut by the end of the video), capped by ``f / min_fps``. When the last
state holds no grid sample, one more frame at ``ceil(a / m) x m`` holds it: the only
frame whose time may lie past the end, by less than one output interval. Output frame
``j`` carries its state's kept sample (a near-duplicate is replaced by the frame it
duplicates), so each output frame shows what was on screen at its own timestamp.

At least 2 output frames (the engine's temporal patch); a 1-sample video is held once.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction


@dataclass(frozen=True)
class Plan:
    step: int                       # m: samples per output frame
    rate: Fraction                  # R = f / m, output frames per second
    sources: tuple[int, ...]        # per output frame, the kept sample it shows
    grid: tuple[int, ...]           # per output frame, the sample index it stands for (time = g / f)
    states: int                     # distinct states (kept samples)
    held_past_end: bool             # the final frame holds the last state past the end


def plan(kept: list[bool], f: Fraction, min_fps: Fraction) -> Plan:
    if not kept:
        raise ValueError("no samples")
    kept = list(kept)
    kept[0] = True
    starts = [k for k, new in enumerate(kept) if new]
    K = len(kept)
    runs = [b - a for a, b in zip(starts, starts[1:] + [K])]
    m_max = max(1, int(Fraction(f) / Fraction(min_fps))) if min_fps > 0 else K
    interior = runs[:-1]
    m = max(1, min(min(interior) if interior else K, m_max))
    grid = list(range(0, K, m))
    held = False
    last_start = starts[-1]
    if grid[-1] < last_start:
        grid.append(-(-last_start // m) * m)
        held = True
    if len(grid) < 2:
        grid.append(grid[-1] + m)
        held = True
    state_of = []
    cur = 0
    for k in range(K):
        if kept[k]:
            cur = k
        state_of.append(cur)
    sources = tuple(state_of[min(g, K - 1)] for g in grid)
    return Plan(step=m, rate=Fraction(f) / m, sources=sources, grid=tuple(grid),
                states=len(starts), held_past_end=held)
