"""When one of N engines leaves or joins, about 1/N of the conversations change home, and
only those that must: the rendezvous hashing of ``router.affinity.home`` (what keeps KV
caches useful while discovery changes the pool). Modulo hashing, for contrast, moves most."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from affinity_churn import modulo_share, moved_share, pool, roots  # noqa: E402

COUNT = 8000


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_one_leaves_or_joins_moves_about_one_in_n(n):
    rs = roots(COUNT, seed=f"t{n}")
    p = pool(n)
    for after, expected in ((p[:1] + p[2:], 1 / n), (p + pool(1, start=n), 1 / (n + 1))):
        share, only_forced = moved_share(rs, p, after)
        sigma = math.sqrt(expected * (1 - expected) / COUNT)
        assert abs(share - expected) < 4 * sigma, (n, share, expected)
        assert only_forced, "a conversation moved between two engines that both stayed"
    if n >= 4:
        assert modulo_share(rs, p, p[:1] + p[2:]) > 0.5
