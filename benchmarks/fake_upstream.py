"""A zero-delay OpenAI-compatible upstream for overhead benchmarks.

Raw asyncio protocol (no framework) so that it costs far less CPU per request than
any proxy in front of it: it answers every POST with one fixed chat completion, or
with 20 SSE chunks when the body asks for ``"stream": true``; GET /health and
/v1/models answer too. HTTP/1.1 keep-alive, content-length request bodies only.

    python benchmarks/fake_upstream.py --port 9100
"""

from __future__ import annotations

import argparse
import asyncio

import orjson

MODEL = "bench-model"
COMPLETION = orjson.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 1, "model": MODEL,
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok " * 16},
                 "logprobs": None, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 16, "total_tokens": 28}})
MODELS = orjson.dumps({"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0,
                                                   "owned_by": "bench"}]})


def _chunk(content: str | None, finish: str | None = None) -> bytes:
    delta = {} if content is None else {"content": content}
    return b"data: " + orjson.dumps({"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1,
                                      "model": MODEL, "choices": [{"index": 0, "delta": delta,
                                                                   "logprobs": None,
                                                                   "finish_reason": finish}]}) + b"\n\n"


STREAM_EVENTS = [_chunk("tok ") for _ in range(19)] + [_chunk(None, "stop"), b"data: [DONE]\n\n"]


def _response(status: bytes, ctype: bytes, body: bytes) -> bytes:
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: " + ctype + b"\r\ncontent-length: " +
            str(len(body)).encode() + b"\r\n\r\n" + body)


JSON_RESP = _response(b"200 OK", b"application/json", COMPLETION)
MODELS_RESP = _response(b"200 OK", b"application/json", MODELS)
HEALTH_RESP = _response(b"200 OK", b"application/json", b"{}")
STREAM_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
STREAM_BODY = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in STREAM_EVENTS) + b"0\r\n\r\n"


class Upstream(asyncio.Protocol):
    def connection_made(self, transport) -> None:
        self.t = transport
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end]
            length = 0
            for line in head.split(b"\r\n")[1:]:
                k, _, v = line.partition(b":")
                if k.strip().lower() == b"content-length":
                    length = int(v)
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4:end + 4 + length]
            self.buf = self.buf[end + 4 + length:]
            if head.startswith(b"GET"):
                self.t.write(MODELS_RESP if b"/models" in head.split(b"\r\n", 1)[0] else HEALTH_RESP)
            elif b'"stream":true' in body.replace(b" ", b""):
                self.t.write(STREAM_HEAD + STREAM_BODY)
            else:
                self.t.write(JSON_RESP)


async def serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Upstream, host, port, backlog=4096)
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=9100)
    a = ap.parse_args()
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(a.host, a.port))


if __name__ == "__main__":
    main()
