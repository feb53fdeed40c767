"""The SLO budget controller on an injected clock (deterministic, in process) and the
pure function that applies its level to one image."""

from __future__ import annotations

import heapq

import pytest

from vlm_gateway.backends.slo import PoolLoad, SloController, percentile
from vlm_gateway.config import SloConfig
from vlm_gateway.stages.images.policy import Policy, parse_header
from vlm_gateway.stages.images.pressure import long_side
import image_corpus as C
from vlm_gateway.stages.images.rewrite import rewrite_bytes


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


# Token cost of a request at each level relative to level 0 (images shrink with the level).
COST = [1.0, 0.7, 0.45, 0.35, 0.3]


def run(c: SloController, clock: Clock, phases: list[tuple[float, float]], rate: int = 200):
    """Drive the controller with a queue in front of an engine of capacity 1.0 (full
    budgets): work arrives at offered x COST[level]; a request sent now gets its first
    token after the backlog plus its service time, and only then is a sample.
    ``phases`` = [(offered load, seconds)]. Returns [(t, level, TTFT of requests sent then)]
    every 0.5 s."""
    out, backlog, step, due = [], 0.0, 0, []
    for offered, seconds in phases:
        for _ in range(int(seconds * 10)):
            clock.t += 0.1
            while due and due[0][0] <= clock.t:
                _, handle, ttft = heapq.heappop(due)
                c.answered(handle, ttft)
            work = offered * COST[c.level]
            backlog = max(0.0, backlog + (work - 1.0) * 0.1)
            ttft = 0.05 / (1 - min(work, 0.95)) + backlog
            for _ in range(round(offered * rate / 20)):  # requests/s follow the load
                heapq.heappush(due, (clock.t + ttft, c.sent(), ttft))
            step += 1
            if step % 5 == 0:
                c.update(PoolLoad(waiting=1.0 if backlog > 0 else 0.0))
                out.append((clock.t, c.level, ttft, max(c.holds)))
    return out


def test_steps_down_under_pressure_holds_and_recovers_without_oscillation():
    clock = Clock()
    cfg = SloConfig(ttft_ms=1000.0)
    c = SloController(cfg, clock)
    trace = run(c, clock, [(0.5, 30), (2.0, 60), (0.5, 60)])
    levels = [lv for _, lv, _, _ in trace]
    low, high, back = levels[:60], levels[60:180], levels[180:]
    assert set(low) == {0}, "idle engines: full budgets"
    assert max(high) >= 3, "2x load needs smaller images"
    # level 3 holds 2x (work 0.7), level 2 is at the edge (0.9): once settled (the second half
    # of the 2x phase) the level stays there, with at most two short retries of level 2
    settled = high[60:]
    changes = sum(1 for a, b in zip(settled, settled[1:]) if a != b)
    assert changes <= 4 and set(settled) <= {2, 3}, settled
    retries = [i for i, (a, b) in enumerate(zip(settled, settled[1:])) if (a, b) == (3, 2)]
    assert len(retries) <= 2, settled
    assert all(settled[i + 5] == 3 for i in retries if i + 5 < len(settled)), "a retry is short"
    # every retry waited longer than the one before (back-off)
    assert trace[179][3] > cfg.up_hold_s
    # the SLO is held in the settled half
    assert max(tt for _, _, tt, _ in trace[120:180]) <= 1.0 + 1e-9
    # full budgets back within 30 s of the load falling
    t_fall = trace[179][0]
    t_full = next(t for t, lv, _, _ in trace[180:] if lv == 0)
    assert t_full - t_fall <= 30.0, t_full - t_fall
    assert set(back[-20:]) == {0}


def test_a_step_up_that_proves_too_much_is_retried_ever_more_rarely():
    clock = Clock()
    cfg = SloConfig(ttft_ms=1000.0, up_hold_s=2.0, up_hold_max_s=16.0, down_hold_s=1.0, min_samples=5,
                    window_s=2.0)
    c = SloController(cfg, clock)
    c.level = 1
    downs_at = []
    # the plant: level 0 misses the SLO at once, level 1 is comfortably under up_at
    for _ in range(400):  # 100 s
        clock.t += 0.25
        for _ in range(10):
            c.observe(1.5 if c.level == 0 else 0.3)
        before = c.level
        c.update(PoolLoad())
        if c.level > before:
            downs_at.append(clock.t)
    gaps = [b - a for a, b in zip(downs_at, downs_at[1:])]
    assert len(downs_at) >= 3
    assert all(g2 >= g1 for g1, g2 in zip(gaps, gaps[1:])), gaps  # back-off grows
    assert gaps[-1] >= 16.0


def test_no_evidence_no_step_down_and_quiet_pools_recover():
    clock = Clock()
    c = SloController(SloConfig(ttft_ms=500.0, min_samples=20), clock)
    for _ in range(5):  # a few slow answers are not a percentile
        c.observe(3.0)
    clock.t += 1
    assert c.update(PoolLoad()) == 0
    c.level = 2
    for _ in range(40):  # nobody sends anything and nothing queues: back to full budgets
        clock.t += 0.5
        c.update(PoolLoad())
    assert c.level == 0
    # but an engine queue keeps the level
    c = SloController(SloConfig(ttft_ms=500.0, min_samples=20), clock)
    c.level = 2
    for _ in range(40):
        clock.t += 0.5
        c.update(PoolLoad(waiting=3))
    assert c.level == 2


def test_samples_of_an_earlier_level_do_not_count_after_a_change():
    clock = Clock()
    cfg = SloConfig(ttft_ms=1000.0, down_hold_s=0.5, min_samples=10)
    c = SloController(cfg, clock)
    for _ in range(50):
        c.observe(2.0)
    clock.t += 0.1
    assert c.update(PoolLoad()) == 1
    clock.t += 1.0
    assert c.update(PoolLoad()) == 1, "the slow answers were sent before the change"
    handles = [c.sent() for _ in range(50)]
    clock.t += 0.5
    for h in handles:
        c.answered(h, 0.5)
    assert c.update(PoolLoad()) == 1, "answers at this level are fast"
    handles = [c.sent() for _ in range(50)]
    clock.t += 2.0
    for h in handles:
        c.answered(h, 2.0)
    assert c.update(PoolLoad()) == 2


def test_engine_queue_steps_down_earlier():
    clock = Clock()
    c = SloController(SloConfig(ttft_ms=1000.0, early_at=0.6, down_at=0.9), clock)
    for _ in range(50):
        c.observe(0.7)
    clock.t += 0.1
    assert c.update(PoolLoad()) == 0
    assert c.update(PoolLoad(waiting=4)) == 1
    c2 = SloController(SloConfig(ttft_ms=1000.0), clock)
    for _ in range(50):
        c2.observe(0.7)
    assert c2.update(PoolLoad(kv_usage=0.97)) == 1


def test_percentile_is_nearest_rank():
    v = [float(i) for i in range(1, 101)]
    assert percentile(v, 0.99) == 99.0 and percentile(v, 0.90) == 90.0 and percentile([5.0], 0.99) == 5.0


# -- pressure.long_side -----------------------------------------------------------------------

PS, TS = (0.83, 0.67, 0.58, 0.5), (1.0, 1.0, 0.83, 0.67)


@pytest.mark.parametrize("level", range(0, 7))
def test_text_never_below_its_floor_and_photos_give_up_first(level):
    base = 1280
    photo = long_side(base, 0, "photo", level, PS, TS, 384)
    text = long_side(base, 900, "text", level, PS, TS, 384)
    assert text >= 900 and photo >= 384
    assert photo <= base and text <= base
    if level:
        assert photo < base
        assert base - photo >= base - text, "photos give up pixels first"
    if level in (1, 2):
        assert text == base
    if level >= 3:
        assert photo == max(384, round(base * PS[min(level, 4) - 1]))


def test_opt_in_unknown_and_edge_cases():
    assert long_side(768, 700, "text", 4, PS, TS, 384) == 700
    assert long_side(768, 700, "text", 4, PS, TS, 384, below_floor=True) == round(768 * 0.67)
    assert long_side(768, 0, "unknown", 4, PS, TS, 384) == 768, "no floor known: kept"
    assert long_side(768, 0, "unknown", 4, PS, TS, 384, below_floor=True) == round(768 * 0.67)
    assert long_side(768, 0, "unknown", 2, PS, TS, 384, below_floor=True) == 768
    assert long_side(300, 0, "photo", 4, PS, TS, 384) == 300, "never above the image's own budget"
    assert long_side(768, 0, "none", 9, PS, TS, 384) == 384
    assert long_side(768, 2000, "text", 3, PS, TS, 384) == 768
    assert long_side(768, 0, "photo", 0, PS, TS, 384) == 768


def test_level_changes_the_policy_key_and_the_long_side():
    cfg = SloConfig()
    p = Policy(max_long_side=768)
    assert p.under(0, cfg, False) is p
    p2 = p.under(3, cfg, False)
    p3 = p.under(3, cfg, True)
    assert len({p.key, p2.key, p3.key}) == 3
    photo = C.photo_jpeg(1920, 1080)
    fixed = Policy(max_long_side=768, budget="fixed")
    # the fixed rule measures nothing: content of unknown class keeps its budget unless opted in
    assert max(rewrite_bytes(photo, fixed.under(3, cfg, False)).width, 0) == 768
    opted = rewrite_bytes(photo, fixed.under(3, cfg, True))
    assert opted.budget.long_side == round(768 * 0.83) and opted.width <= 637 and opted.budget.reason == "pressure"
    # the legible budget measures it: a photo gives up pixels without opting in (768 x 0.58)
    legible = rewrite_bytes(photo, p2)
    assert legible.budget.cls == "no_text" and legible.budget.long_side == round(768 * 0.58)
    assert Policy(enabled=False).under(3, cfg, True) == Policy(enabled=False)
    assert parse_header("below-floor") == "below-floor"
