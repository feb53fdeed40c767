"""The README's headline table is what the default install does: benchmarks/default_rewrite.py
starts `vlm-gateway serve` with no configuration, sends the corpus screenshot at 13/16/24 px
text, a photo and a screen recording, and its --check fails when README.md says otherwise
(run the script without --check to write the table again after a change of the estimate)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_readme_default_rewrite_table_is_measured_from_the_code():
    pytest.importorskip("av")
    r = subprocess.run([sys.executable, "benchmarks/default_rewrite.py", "--check"], cwd=ROOT, capture_output=True,
                       text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-3000:]


def test_readme_claims_stay_consistent_with_the_table():
    text = (ROOT / "README.md").read_text()
    table = text[text.index("<!-- default-rewrite:begin -->"):text.index("<!-- default-rewrite:end -->")]
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    assert [r.split("|")[1].strip() for r in rows] == [
        "screenshot, 13 px text", "screenshot, 16 px text", "screenshot, 24 px text", "photo",
        "screen recording, 10 s at 30 fps"]
    # the headline's "a photo goes down to that 768 px long side" is the photo row
    photo = rows[3]
    assert "768×" in photo and "→ 336 |" in photo and "reason=no_text" in photo
    assert "A 1920x1080 image costs Qwen3-VL 2040 visual tokens; at 768x448 it costs 336" in text
    for r in rows[:3]:  # text keeps at least the 768 floor
        long_side = int(re.search(r"\| (\d+)×\d+ \|", r).group(1))
        assert long_side >= 768
