"""The /ui playground in headless Chromium (Debian's /usr/bin/chromium, driven by
playwright-core from tests/ui): upload an image, check the before/after figures and
the streamed answer, then the status view. Screenshots go to a temp dir; with
UPDATE_SCREENSHOTS=1 they are copied to docs/ (docs/playground.png, docs/status.png)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

ROOT = Path(__file__).resolve().parent.parent
UI_TESTS = ROOT / "tests" / "ui"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")

if not shutil.which("node") or not (UI_TESTS / "node_modules" / "playwright-core").is_dir() \
        or not os.path.exists(CHROMIUM):
    pytest.skip("needs node, chromium and `npm install` in tests/ui (.ci/run installs them)",
                allow_module_level=True)


def street_scene(path: Path, width: int = 1920, height: int = 1080) -> None:
    """A screenshot-sized picture with some structure (sky, ground, blocks, sun)."""
    im = Image.new("RGB", (width, height))
    d = ImageDraw.Draw(im)
    for y in range(height):
        t = y / height
        d.line([(0, y), (width, y)], fill=(int(90 + 120 * t), int(150 + 60 * t), int(230 - 90 * t))
               if y < height * 0.62 else (int(70 + 40 * t), int(110 + 30 * t), 60))
    for i, x in enumerate(range(80, width - 200, 260)):
        h = 220 + (i * 97) % 300
        d.rectangle([x, int(height * 0.62) - h, x + 190, int(height * 0.62)], fill=(60 + i * 17 % 120, 70, 90))
        for wy in range(int(height * 0.62) - h + 20, int(height * 0.62) - 30, 48):
            for wx in range(x + 18, x + 170, 44):
                d.rectangle([wx, wy, wx + 22, wy + 26], fill=(250, 226, 140))
    d.ellipse([width - 330, 90, width - 170, 250], fill=(255, 214, 80))
    im.save(path, "JPEG", quality=90)


def test_playground_upload_rewrite_and_streamed_answer(servers, tmp_path):
    sim = servers.sim(token_rate=40)  # a visible stream: ~25 ms between tokens
    gw = servers.gateway({}, backends=[sim])
    img = tmp_path / "street.jpg"
    street_scene(img)
    src_bytes = img.stat().st_size
    r = subprocess.run(["node", str(UI_TESTS / "playground.mjs"), gw.url, str(img), str(tmp_path)],
                       cwd=UI_TESTS, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "CHROMIUM": CHROMIUM})
    assert r.returncode == 0, r.stderr[-3000:]
    page = json.loads(r.stdout.strip().splitlines()[-1])

    assert page["error"] == "" and not page.get("console_errors"), page
    assert page["models"] == ["qwen3vl-sim"]
    # before/after as the page shows them: 1920x1080 -> 768x448 on the 32 px grid
    assert page["size_before"].startswith("1920 × 1080")
    assert page["size_after"].startswith("768 × 448")
    assert page["after_image_natural"] == [768, 448]
    assert page["tokens_before"] == 2040 and page["tokens_after"] == 336
    assert page["bytes_before"] == src_bytes and 0 < page["bytes_after"] < src_bytes
    assert "2,040 → 336 (−84%)" in page["saving"]
    # the long-side decision: a street scene has no text, the photo rule applies
    assert "budget: long side 768 (no text found; no_text)" in page["saving"], page["saving"]
    # the frame of the rewritten image (no border to trim: the whole image, 2.5x) and the
    # coordinate mapping, from the answer's headers
    assert page["frame_after"] == "whole image · ×2.500 / ×2.411", page["frame_after"]
    assert page["transform_header"].startswith("part=messages[0].content[1]; client=1920x1080; crop=0,0,1920,1080;")
    assert page["grounding_after"] == "mapped to your image · qwen3-vl"
    # the answer arrived as a stream (the simulator echoes the question, then filler)
    assert page["answer"].startswith("What is in this picture?")
    assert page["chunks"] >= 16
    lengths = sorted({n for _, n in page["growth"]})
    assert len(lengths) >= 8, page["growth"]
    assert page["growth"][-1][0] - page["growth"][0][0] > 200  # spread over time, not one blob
    assert "backend sim0" in page["answer_meta"]

    # status view: the backend and the request just made, with its visual tokens
    assert page["status"]["backends"][0][0] == "sim0" and page["status"]["backends"][0][3] == "ok"
    recent = page["status"]["recent"][0]
    assert recent[1] == "chat" and recent[3] == "200" and recent[6] == "2,040 → 336"

    for name in ("playground.png", "status.png"):
        assert (tmp_path / name).stat().st_size > 20_000
        if os.environ.get("UPDATE_SCREENSHOTS"):
            shutil.copy(tmp_path / name, ROOT / "docs" / name)


def test_playground_shows_a_videos_rewrite(servers, tmp_path):
    pytest.importorskip("av")
    import video_corpus as corpus
    sim = servers.sim()
    gw = servers.gateway({}, backends=[sim])
    data, times = corpus.screen_recording(12, 640, 360, 10, seed=5)
    clip = tmp_path / "screen.mp4"
    clip.write_bytes(data)
    r = subprocess.run(["node", str(UI_TESTS / "video.mjs"), gw.url, str(clip), str(tmp_path)],
                       cwd=UI_TESTS, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "CHROMIUM": CHROMIUM})
    assert r.returncode == 0, r.stderr[-3000:]
    page = json.loads(r.stdout.strip().splitlines()[-1])
    assert page["error"] == "" and not page.get("console_errors"), page
    assert page["video_shown"] and page["image_hidden"]
    assert page["after_src"].startswith("data:video/mp4;base64,")
    assert page["size_before"] == "640 × 360" and page["size_after"] == "640 × 352"
    # a video gets a video question; the source's frame rate is not shown as a frame count
    assert page["question_default"] == "Describe what happens in this video in one sentence."
    assert re.fullmatch(r"24 sampled by the engine · source 10 fps, 11\.\d s", page["frames_before"]), \
        page["frames_before"]
    assert re.fullmatch(r"\d+ at \d+(/\d+)? fps · \d+ screen states kept", page["frames_after"]), page["frames_after"]
    assert page["frames_after"].endswith(f"· {len(times)} screen states kept")
    assert page["bytes_before"] == len(data) and page["bytes_after"] > 0
    assert 0 < page["tokens_after"] < page["tokens_before"]
    assert "Prompt tokens of the video" in page["saving"] and "plan groups" in page["saving"]
    # the question went out with the video, and the answer's headers carry the same counts
    assert page["answer"].startswith("What changes on the screen?")
    assert f"video tokens before={page['tokens_before']}, after={page['tokens_after']}" in page["answer_meta"]
