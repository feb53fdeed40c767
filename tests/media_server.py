"""A local HTTP origin for media tests: fixed files, content that changes between
requests (with or without a strong ETag), bodies streamed slowly, bodies that never
end (``/endless/<path>``: that file over and over, no length, until the client
hangs up), and a log of what was asked for. Runs in a thread on 127.0.0.1."""

from __future__ import annotations

import http.server
import threading
import time
from urllib.parse import parse_qs, urlsplit


class Origin:
    def __init__(self) -> None:
        self.files: dict[str, tuple[bytes, str]] = {}      # path -> (body, content type)
        self.etags: dict[str, str] = {}                    # path -> strong ETag (served with If-None-Match)
        self.hits: dict[str, int] = {}
        self.not_modified = 0
        self.bytes_sent = 0
        self.lock = threading.Lock()
        origin = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):  # noqa: N802
                u = urlsplit(self.path)
                with origin.lock:
                    origin.hits[u.path] = origin.hits.get(u.path, 0) + 1
                    entry = origin.files.get(u.path)
                    etag = origin.etags.get(u.path)
                if u.path.startswith("/endless/"):
                    with origin.lock:
                        entry = origin.files.get(u.path[len("/endless"):])
                    return self.endless(entry)
                if u.path.startswith("/slow/"):
                    with origin.lock:
                        entry = origin.files.get(u.path[len("/slow"):])
                    return self.slow(entry, parse_qs(u.query))
                if entry is None:
                    self.send_response(404)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                if etag and self.headers.get("if-none-match") == etag:
                    with origin.lock:
                        origin.not_modified += 1
                    self.send_response(304)
                    self.send_header("etag", etag)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                data, ctype = entry
                self.send_response(200)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(data)))
                if etag:
                    self.send_header("etag", etag)
                self.end_headers()
                self.wfile.write(data)
                with origin.lock:
                    origin.bytes_sent += len(data)

            def slow(self, entry, q: dict) -> None:
                """/slow/<path>: that file in 64 KiB chunks, ``delay`` s apart."""
                delay = float(q.get("delay", ["0.1"])[0])
                data, ctype = entry or (b"", "")
                n = len(data)
                self.send_response(200 if entry else 404)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(n))
                self.end_headers()
                sent = 0
                try:
                    while sent < n:
                        part = data[sent:sent + 64 * 1024]
                        self.wfile.write(part)
                        self.wfile.flush()
                        sent += len(part)
                        time.sleep(delay)
                except (BrokenPipeError, ConnectionResetError):
                    pass
                with origin.lock:
                    origin.bytes_sent += sent

            def endless(self, entry) -> None:
                data, ctype = entry or (b"\x00" * 65536, "application/octet-stream")
                self.send_response(200)
                self.send_header("content-type", ctype)
                self.send_header("connection", "close")
                self.end_headers()
                self.close_connection = True
                sent = 0
                try:
                    while sent < 8 * 2**30:      # a backstop: no test reads 8 GiB
                        self.wfile.write(data)
                        sent += len(data)
                except (BrokenPipeError, ConnectionResetError, OSError):
                    pass
                with origin.lock:
                    origin.bytes_sent += sent

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "Origin":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def put(self, path: str, data: bytes, ctype: str = "application/octet-stream", etag: str | None = None) -> str:
        with self.lock:
            self.files[path] = (data, ctype)
            if etag:
                self.etags[path] = etag
            else:
                self.etags.pop(path, None)
        return self.base + path
