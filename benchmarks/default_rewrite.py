"""What the default install does to a 1080p screenshot, a photo and a video: the README's table.

Starts `vlm-gateway serve` with no configuration (the built-in simulator as its backend, every
image and video setting at its default), sends each input once and reads what the gateway
says it did (x-vlm-gateway-image-budget, -visual-tokens, -image-transform-1, -video-tokens,
-video-1), then writes the table between the markers in README.md. The inputs are the
legibility corpus's UI screenshot at 13, 16 and 24 px text (tests/text_corpus.py), a photo
(tests/image_corpus.py) and a 10 s screen recording (tests/video_corpus.py), all 1920x1080.

    python benchmarks/default_rewrite.py           # rewrite the table in README.md
    python benchmarks/default_rewrite.py --check   # exit 1 if README.md says otherwise

The figures come from the code as it is: when the legibility estimate or a default changes,
the check fails until the table is written again (tests/test_readme_claims.py runs it).
"""

from __future__ import annotations

import base64
import io
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import httpx  # noqa: E402

README = ROOT / "README.md"
BEGIN, END = "<!-- default-rewrite:begin -->", "<!-- default-rewrite:end -->"
WHY = {
    "source": "its text is legible only at (nearly) full size: sent as it came",
    "legible": "the smallest size at which its text stays legible",
    "floor": "large text: the 768 px floor keeps it legible",
    "no_text": "no text found: the photo long side (768 px)",
    "ceiling": "the text needs more than the ceiling allows",
    "fixed": "the fixed rule (images.budget: fixed)",
}


def _uri(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def inputs() -> list[tuple[str, str, dict]]:
    """(label, kind, content part) of each input."""
    import image_corpus
    import text_corpus
    import video_corpus
    out = []
    for px in (13, 16, 24):
        im, _ = text_corpus.ui(1920, 1080, px, 1)
        buf = io.BytesIO()
        im.save(buf, "PNG")
        out.append((f"screenshot, {px} px text", "image",
                    {"type": "image_url", "image_url": {"url": _uri(buf.getvalue(), "image/png")}}))
    out.append(("photo", "image", {"type": "image_url", "image_url": {
        "url": _uri(image_corpus.photo_jpeg(1920, 1080), "image/jpeg")}}))
    clip, _ = video_corpus.screen_recording(10, 1920, 1080, 30, seed=1)
    out.append(("screen recording, 10 s at 30 fps", "video",
                {"type": "video_url", "video_url": {"url": _uri(clip, "video/mp4")}}))
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure() -> list[dict]:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLM_GATEWAY_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env["VLM_GATEWAY_SIMULATOR__TIME_SCALE"] = "0.01"  # the simulator's timing only
    proc = subprocess.Popen([sys.executable, "-m", "vlm_gateway", "serve", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("the default gateway did not start")
            time.sleep(0.05)
        rows = []
        for label, kind, part in inputs():
            body = {"model": "qwen3vl-sim", "max_tokens": 1,
                    "messages": [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, part]}]}
            r = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
            r.raise_for_status()
            rows.append({"label": label, "kind": kind, **dict(r.headers)})
        return rows
    finally:
        proc.terminate()
        proc.wait(20)


def _field(header: str, name: str) -> str:
    m = re.search(rf"(?:^|[;\s]){name}=([^;,\s]+)", header)
    return m.group(1) if m else ""


def table(rows: list[dict]) -> str:
    lines = ["| 1920x1080 input | sent to the engine | prompt tokens | why |", "|---|---|---|---|"]
    for r in rows:
        if r["kind"] == "image":
            budget = r["x-vlm-gateway-image-budget"]
            sent = _field(r["x-vlm-gateway-image-transform-1"], "sent")
            before, after = (_field(r["x-vlm-gateway-visual-tokens"], k) for k in ("before", "after"))
            reason = _field(budget, "reason")
            why = WHY.get(reason, reason)
            if _field(budget, "class") in ("text", "dense_text"):
                why += (f" (x-height ~{_field(budget, 'text_px')} px, legible from a "
                        f"{_field(budget, 'legible_floor')} px long side)")
            lines.append(f"| {r['label']} | {sent.replace('x', '×')} | {before} → {after} | {why}, `reason={reason}` |")
        else:
            v = r["x-vlm-gateway-video-1"]
            size = _field(v, "size").split("->")[-1]
            src_n, n = _field(v, "frames").split("->")
            rate = _field(v, "rate").split("->")[-1]
            before, after = (_field(r["x-vlm-gateway-video-tokens"], k) for k in ("before", "after"))
            lines.append(f"| {r['label']} | {size.replace('x', '×')}, {n} frames at {rate} fps (the engine would "
                         f"sample {src_n} from the source) | {before} → {after} | {_field(v, 'states')} distinct "
                         f"screens kept, frames at the image budget, `plan={_field(v, 'plan')}` |")
    return "\n".join(lines)


def replace(readme: str, text: str) -> str:
    a, b = readme.index(BEGIN) + len(BEGIN), readme.index(END)
    return readme[:a] + "\n" + text + "\n" + readme[b:]


def main() -> int:
    text = table(measure())
    readme = README.read_text()
    new = replace(readme, text)
    if "--check" in sys.argv[1:]:
        if new != readme:
            print("README.md's default-rewrite table is not what the code does; measured:\n" + text
                  + "\nrewrite it with: python benchmarks/default_rewrite.py", file=sys.stderr)
            return 1
        return 0
    README.write_text(new)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
