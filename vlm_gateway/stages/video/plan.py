"""Output plan: which samples become output frames, at what constant rate.

Input: ``kept`` flags of K samples taken at rate ``f`` (sample k at ``k / f``; a sample
that is not kept is a near-duplicate of the last kept one: the same *state*).

The engine reads a constant-rate stream and, at an output rate ``R <= 2`` fps, takes
every frame and stamps frame ``j`` with ``j / R`` seconds (docs/VIDEO.md). It then
merges frames in pairs (temporal patch 2): frames ``2g`` and ``2g + 1`` become one
*group* of tokens stamped with their mean time ``(2g + 0.5) / R``. Output frame ``j``
stands for sample ``j x m`` at ``R = f / m``. Two plans:

``plan_groups`` (default): every group shows one state in both its frames, so no group
blends two screens (a group's tokens have the same size whether its two frames agree
or not: two different screens share what one would get). ``m`` (at most
``f / min_fps``) is the step with the fewest groups, the smallest such step on a tie
(shorter spans: closer stamps), for which this assignment, group by group in time
order, shows every state: group ``g`` covers samples ``[2gm, 2(g+1)m)``; it shows the earliest
state not shown yet if that state is on screen within the group's span, else the state
on screen at the group's own stamp. A state that ended before the span of the next
free group would be lost: that ``m`` is refused. A last, partial group that would only
repeat the previous one is left out (the output then ends up to one span early, with
the state that was on screen). So every group shows a state that was
on screen during its span (its stamp is off by less than 3/4 of a group span), and
every state appears in a group of its own. When no ``m`` works (states shorter than
one second back to back, motion), the frame plan below at its own step.

``plan_frames``: frame ``j`` shows the state on screen at ``j / R``; ``m`` = the
shortest state's length in samples (any ``m`` consecutive samples contain a multiple of
``m``, so every state lands on a frame; the last state excepted: it is cut by the end),
capped by ``f / min_fps``. When the last state holds no grid sample, one more frame at
``ceil(a / m) x m`` holds it: the only frame whose time may lie past the end, by less
than one output interval. Frames are exact in time, but a group may pair two states
(``mixed_groups`` counts them).

Output frame ``j`` carries its state's kept sample (a near-duplicate is replaced by the
frame it duplicates). At least 2 output frames (the engine's temporal patch).
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
    kind: str = "frames"            # "groups" | "frames"
    mixed_groups: int = 0           # engine groups whose two frames show different states


def _state_starts(kept: list[bool]) -> tuple[list[int], list[int]]:
    """(first sample of each state, state index of every sample)."""
    kept = list(kept)
    kept[0] = True
    starts = [k for k, new in enumerate(kept) if new]
    sid, s = [], -1
    for new in kept:
        s += new
        sid.append(s)
    return starts, sid


def _m_max(f: Fraction, min_fps: Fraction, K: int) -> int:
    return max(1, int(Fraction(f) / Fraction(min_fps))) if min_fps > 0 else max(1, K)


def _mixed(sources: tuple[int, ...]) -> int:
    return sum(1 for j in range(0, len(sources) - 1, 2) if sources[j] != sources[j + 1])


def plan_frames(kept: list[bool], f: Fraction, min_fps: Fraction) -> Plan:
    if not kept:
        raise ValueError("no samples")
    starts, sid = _state_starts(kept)
    K = len(kept)
    runs = [b - a for a, b in zip(starts, starts[1:] + [K])]
    interior = runs[:-1]
    m = max(1, min(min(interior) if interior else K, _m_max(f, min_fps, K)))
    grid = list(range(0, K, m))
    held = False
    if grid[-1] < starts[-1]:
        grid.append(-(-starts[-1] // m) * m)
        held = True
    if len(grid) < 2:
        grid.append(grid[-1] + m)
        held = True
    sources = tuple(starts[sid[min(g, K - 1)]] for g in grid)
    return Plan(step=m, rate=Fraction(f) / m, sources=sources, grid=tuple(grid), states=len(starts),
                held_past_end=held, kind="frames", mixed_groups=_mixed(sources))


# the frame plan under its first name (phase-one callers and tests)
plan = plan_frames


def _assign_groups(sid: list[int], states: int, m: int) -> list[int] | None:
    """State shown by each group at step ``m``, or None when a state would be lost."""
    K, span = len(sid), 2 * m
    shown: list[int] = []
    nxt = 0
    for lo in range(0, K, span):
        hi = min(lo + span, K)
        first, last = sid[lo], sid[hi - 1]
        if nxt < first:
            return None          # state nxt ended before this group's span began
        s = nxt if nxt <= last else sid[min(lo + m // 2, K - 1)]   # else: on screen at the stamp
        shown.append(s)
        nxt = max(nxt, s + 1)
    if nxt < states:
        return None
    # a last, partial group that shows nothing new (the final sample of a held state) is dropped
    if len(shown) > 1 and (len(shown) - 1) * span + span > K and shown[-1] == shown[-2]:
        shown.pop()
    return shown


def plan_groups(kept: list[bool], f: Fraction, min_fps: Fraction) -> Plan:
    if not kept:
        raise ValueError("no samples")
    starts, sid = _state_starts(kept)
    K = len(kept)
    best: tuple[int, int, list[int]] | None = None
    for m in range(1, min(_m_max(f, min_fps, K), K) + 1):
        shown = _assign_groups(sid, len(starts), m)
        if shown is not None and (best is None or len(shown) < best[0]):
            best = (len(shown), m, shown)
    if best is not None:
        _, m, shown = best
        sources = tuple(starts[s] for s in shown for _ in (0, 1))
        grid = tuple(j * m for j in range(len(sources)))
        return Plan(step=m, rate=Fraction(f) / m, sources=sources, grid=grid, states=len(starts),
                    held_past_end=grid[-1] > K - 1, kind="groups", mixed_groups=0)
    return plan_frames(kept, f, min_fps)
