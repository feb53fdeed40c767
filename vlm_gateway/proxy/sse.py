"""Server-sent events: watch a relayed stream cheaply, assemble it into one
completion (for the response cache), and replay a stored completion as chunks."""

from __future__ import annotations

import time
import uuid
from typing import Any, Iterator

import orjson

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keepalive\n\n"


def event(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class StreamWatcher:
    """Follows SSE bytes as they are relayed. Always notes ``[DONE]`` (cheap);
    parses events into a completion only when ``assemble`` is set, and otherwise
    only the usage chunk."""

    __slots__ = ("assemble", "buf", "done", "usage", "chunks", "error")

    def __init__(self, assemble: bool) -> None:
        self.assemble = assemble
        self.buf = b""
        self.done = False
        self.usage: dict | None = None
        self.chunks: list[dict] = []
        self.error: dict | None = None

    def feed(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        if not self.assemble and b'"usage":{' not in buf and b'"error"' not in buf:
            # fast path: keep only what could hold a split "[DONE]"
            if b"data: [DONE]" in buf:
                self.done = True
            self.buf = buf[-64:]
            return
        *events, self.buf = buf.replace(b"\r\n", b"\n").split(b"\n\n")
        for ev in events:
            for line in ev.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    self.done = True
                    continue
                if not self.assemble and b'"usage":{' not in payload and b'"error"' not in payload:
                    continue
                try:
                    obj = orjson.loads(payload)
                except orjson.JSONDecodeError:
                    continue
                if not isinstance(obj, dict):
                    continue
                if "error" in obj:
                    self.error = obj["error"] if isinstance(obj["error"], dict) else {"message": str(obj["error"])}
                if isinstance(obj.get("usage"), dict):
                    self.usage = obj["usage"]
                if self.assemble:
                    self.chunks.append(obj)

    def completion(self) -> dict | None:
        """The stream as one ``chat.completion`` (None if incomplete or errored)."""
        if not self.done or self.error or not self.chunks:
            return None
        return assemble(self.chunks)


def assemble(chunks: list[dict]) -> dict:
    first = chunks[0]
    choices: dict[int, dict] = {}
    for ch in chunks:
        for c in ch.get("choices") or ():
            idx = c.get("index", 0)
            slot = choices.setdefault(idx, {"index": idx, "message": {"role": "assistant", "content": ""},
                                            "finish_reason": None, "logprobs": None})
            delta = c.get("delta") or {}
            if delta.get("role"):
                slot["message"]["role"] = delta["role"]
            if delta.get("content"):
                slot["message"]["content"] += delta["content"]
            if delta.get("reasoning_content"):
                slot["message"]["reasoning_content"] = slot["message"].get("reasoning_content", "") + \
                    delta["reasoning_content"]
            for tc in delta.get("tool_calls") or ():
                calls = slot["message"].setdefault("tool_calls", [])
                i = tc.get("index", len(calls))
                while len(calls) <= i:
                    calls.append({"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                call = calls[i]
                if tc.get("id"):
                    call["id"] = tc["id"]
                fn = tc.get("function") or {}
                if fn.get("name"):
                    call["function"]["name"] += fn["name"]
                if fn.get("arguments"):
                    call["function"]["arguments"] += fn["arguments"]
            if c.get("logprobs"):
                lp = slot["logprobs"] or {"content": []}
                lp["content"].extend((c["logprobs"] or {}).get("content") or [])
                slot["logprobs"] = lp
            if c.get("finish_reason"):
                slot["finish_reason"] = c["finish_reason"]
    usage = next((ch["usage"] for ch in reversed(chunks) if isinstance(ch.get("usage"), dict)), None)
    out = {"id": first.get("id", ""), "object": "chat.completion", "created": first.get("created", 0),
           "model": first.get("model", ""), "choices": [choices[i] for i in sorted(choices)]}
    if usage is not None:
        out["usage"] = usage
    return out


def fresh_ids(completion: dict) -> dict:
    """A stored completion with a new id and created time."""
    out = dict(completion)
    out["id"] = "chatcmpl-" + uuid.uuid4().hex
    out["created"] = int(time.time())
    return out


def replay(completion: dict, include_usage: bool) -> Iterator[bytes]:
    """A stored ``chat.completion`` as ``chat.completion.chunk`` SSE events."""
    base = {"id": completion["id"], "object": "chat.completion.chunk", "created": completion["created"],
            "model": completion.get("model", "")}
    for c in completion.get("choices", []):
        msg = c.get("message") or {}
        idx = c.get("index", 0)
        yield event({**base, "choices": [{"index": idx, "delta": {"role": msg.get("role", "assistant"),
                                                                  "content": ""},
                                          "logprobs": None, "finish_reason": None}]})
        delta: dict[str, Any] = {}
        for k in ("reasoning_content", "reasoning", "refusal"):  # reasoning models, refusals
            if msg.get(k):
                delta[k] = msg[k]
        if msg.get("content"):
            delta["content"] = msg["content"]
        if msg.get("tool_calls"):
            delta["tool_calls"] = [{**tc, "index": i} for i, tc in enumerate(msg["tool_calls"])]
        if delta:
            yield event({**base, "choices": [{"index": idx, "delta": delta, "logprobs": c.get("logprobs"),
                                              "finish_reason": None}]})
        yield event({**base, "choices": [{"index": idx, "delta": {}, "logprobs": None,
                                          "finish_reason": c.get("finish_reason") or "stop"}]})
    if include_usage and completion.get("usage"):
        yield event({**base, "choices": [], "usage": completion["usage"]})
    yield DONE
