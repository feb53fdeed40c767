"""Check on a real engine that the media parts the gateway rewrites or inlines are
read by vLLM as the client meant them. Run on the GPU machine with the gateway on
:8080 in front of vLLM (start_gateway.sh) and the engine on :8000:

  python3 benchmarks/gpu/media_parts.py --out media_parts.json

For each case it sends the same request straight to the engine and through the
gateway, and records status, prompt tokens and the first words of the answer:

- input_image with a 1920x1080 data: URI (the gateway rewrites it like image_url:
  fewer prompt tokens, same answer topic);
- video_url by http URL from a local origin (the gateway fetches and inlines it
  as data:video/mp4; the engine never fetches) against the engine fetching the same
  URL itself (the gateway must be configured with images.allow_networks: [127.0.0.1/32]
  for this case);
- a private URL in video_url / input_image (the gateway answers 400 naming the part).

The video is written with OpenCV (a vLLM dependency); 4 s, 8 fps, 640x360.
"""

from __future__ import annotations

import argparse
import base64
import http.server
import io
import json
import os
import tempfile
import threading

import httpx
from PIL import Image, ImageDraw

DIRECT = os.environ.get("LOADGEN_DIRECT", "http://127.0.0.1:8000/v1")
GATEWAY = os.environ.get("LOADGEN_GATEWAY", "http://127.0.0.1:8080/v1")
MODEL = os.environ.get("LOADGEN_MODEL", "qwen3vl")


def screenshot() -> bytes:
    im = Image.new("RGB", (1920, 1080), "white")
    d = ImageDraw.Draw(im)
    for i in range(12):
        d.text((80, 60 + i * 80), f"Line {i + 1}: the invoice total is {1234 + i * 7} EUR", fill="black")
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=90)
    return buf.getvalue()


def video() -> bytes:
    import cv2
    import numpy as np
    path = os.path.join(tempfile.mkdtemp(), "clip.mp4")
    w = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*"mp4v"), 8, (640, 360))
    for i in range(32):
        frame = np.full((360, 640, 3), 255, np.uint8)
        cv2.circle(frame, (40 + i * 18, 180), 30, (0, 0, 255), -1)  # a red ball moving right
        w.write(frame)
    w.release()
    with open(path, "rb") as f:
        return f.read()


def serve(data: bytes) -> str:
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("content-type", "video/mp4")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{srv.server_address[1]}/clip.mp4"


def ask(base: str, parts: list[dict], question: str) -> dict:
    body = {"model": MODEL, "max_tokens": 48, "temperature": 0,
            "messages": [{"role": "user", "content": [*parts, {"type": "text", "text": question}]}]}
    r = httpx.post(base + "/chat/completions", json=body, timeout=300)
    out = {"status": r.status_code}
    j = r.json()
    if r.status_code == 200:
        out.update(prompt_tokens=j["usage"]["prompt_tokens"], answer=j["choices"][0]["message"]["content"][:160])
    else:
        out["error"] = j.get("error", j)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="media_parts.json")
    args = ap.parse_args()
    shot = "data:image/jpeg;base64," + base64.b64encode(screenshot()).decode()
    clip_url = serve(video())
    cases = {
        "input_image data: URI": ([{"type": "input_image", "image_url": shot}], "What is the total on line 3?"),
        "video_url http URL": ([{"type": "video_url", "video_url": {"url": clip_url}}],
                               "Which way does the ball move?"),
    }
    results = {}
    for name, (parts, q) in cases.items():
        results[name] = {"engine": ask(DIRECT, parts, q), "gateway": ask(GATEWAY, parts, q)}
    for name, part in (("video_url private", {"type": "video_url", "video_url": {"url": "http://169.254.169.254/x"}}),
                       ("input_image private", {"type": "input_image", "image_url": "http://10.0.0.1/x.png"})):
        results[name] = {"gateway": ask(GATEWAY, [part], "what is this?")}
    print(json.dumps(results, indent=2))
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
