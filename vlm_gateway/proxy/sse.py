"""Server-sent events: watch a relayed stream cheaply and event by event (bounded
event size, linear buffering), assemble it into one completion (for the response
cache), and replay a stored completion as chunks."""

from __future__ import annotations

import re
import time
import uuid
from typing import Any, Iterator

import orjson

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keepalive\n\n"


def event(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class EventTooLarge(Exception):
    """An upstream SSE event grew past the cap without ending; ``events`` are the
    complete events that came before it in the same read (still to be forwarded)."""

    def __init__(self, size: int, events: bytes = b"") -> None:
        super().__init__(size)
        self.size = size
        self.events = events


# The end of an event: an empty line, whichever of the SSE line endings is used.
_BOUNDARY = re.compile(rb"\r\n\r\n|\n\n|\r\r|\n\r\n|\r\n\n")


class StreamWatcher:
    """Follows SSE bytes as they are relayed, event by event.

    ``frame`` keeps the unfinished event and returns the complete events, which the
    relay forwards at once (after the request's transform, if any, and ``scan``): the
    client never receives half an event, an event longer than ``max_event_bytes`` ends
    the stream (``EventTooLarge``) before any of it was forwarded or transformed, and each
    byte is searched for an event boundary once (a long event costs linear time, never a
    re-split of everything held on each chunk). ``feed`` is ``frame`` then ``scan``.

    ``scan`` always notes ``[DONE]`` and error events (cheap); it parses events into a
    completion only when ``assemble`` is set (up to ``max_assembled_bytes`` of payload: a
    longer answer is relayed but not assembled), and otherwise only the usage chunk."""

    __slots__ = ("assemble", "buf", "done", "usage", "chunks", "error", "max_event", "max_assembled",
                 "assembled", "overflow")

    def __init__(self, assemble: bool, max_event_bytes: int = 1 << 20, max_assembled_bytes: int = 64 << 20) -> None:
        self.assemble = assemble
        self.buf = bytearray()
        self.done = False
        self.usage: dict | None = None
        self.chunks: list[dict] = []
        self.error: dict | None = None
        self.max_event = max_event_bytes
        self.max_assembled = max_assembled_bytes
        self.assembled = 0
        self.overflow = False

    def feed(self, data: bytes) -> bytes:
        """The complete events now available (to forward), in order, scanned; b"" if none."""
        out = self.frame(data)
        if out:
            self.scan(out)
        return out

    def frame(self, data: bytes) -> bytes:
        """The complete events now available, in order, not scanned yet; b"" if none."""
        buf = self.buf
        if not buf and data.endswith(b"\n\n") and len(data) <= self.max_event:
            return data  # the usual case: whole, small events in one read
        start = max(0, len(buf) - 3)  # a boundary may straddle the previous read
        buf += data
        end = 0
        for m in _BOUNDARY.finditer(buf, start):
            if m.end() - end > self.max_event:
                raise EventTooLarge(m.end() - end, self._take(end))
            end = m.end()
        if end == 0:
            if len(buf) > self.max_event:
                raise EventTooLarge(len(buf))
            return b""
        out = self._take(end)
        if len(buf) > self.max_event:
            raise EventTooLarge(len(buf), out)
        return out

    def _take(self, end: int) -> bytes:
        """The first ``end`` bytes held (whole events), removed."""
        out = bytes(self.buf[:end])
        del self.buf[:end]
        return out

    def rest(self) -> bytes:
        """At the end of the stream: the unfinished last event, not scanned yet (b"" if none)."""
        out = bytes(self.buf)
        self.buf.clear()
        return out

    def finish(self) -> bytes:
        """At the end of the stream: the unfinished last event (forwarded and read as is)."""
        out = self.rest()
        if out:
            self.scan(out)
        return out

    def scan(self, events: bytes) -> None:
        """Note what whole events (as they go to the client) say."""
        self._scan(events)

    def _scan(self, events: bytes) -> None:
        if not self.assemble and b'"usage":{' not in events and b'"error"' not in events:
            if b"[DONE]" in events:  # fast path: nothing to parse but the end marker
                self._parse(events)
            return
        self._parse(events)

    def _parse(self, events: bytes) -> None:
        for ev in events.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n\n"):
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
                err = obj.get("error")
                if err not in (None, "", {}) or obj.get("object") == "error":
                    self.error = err if isinstance(err, dict) and err else {"message": str(err or obj.get("message"))}
                if isinstance(obj.get("usage"), dict):
                    self.usage = obj["usage"]
                if self.assemble:
                    self.assembled += len(payload)
                    if self.assembled > self.max_assembled:
                        self.assemble, self.overflow = False, True
                        self.chunks.clear()
                    else:
                        self.chunks.append(obj)

    def completion(self) -> dict | None:
        """The stream as one ``chat.completion`` (None if incomplete, errored or too long)."""
        if not self.done or self.error or not self.chunks or self.overflow:
            return None
        return assemble(self.chunks)


# tool calls of one choice assembled at most (an index past it is not a call: skipped)
MAX_TOOL_CALLS = 128


def _str(v: Any) -> str:
    return v if isinstance(v, str) else ""


def assemble(chunks: list[dict]) -> dict:
    """The chunks as one ``chat.completion``; parts of a shape no chunk has (a choice that is
    not an object, an ``index`` that is not an integer, a ``delta`` that is not an object,
    text that is not a string) are left out."""
    first = chunks[0]
    choices: dict[int, dict] = {}
    for ch in chunks:
        cs = ch.get("choices")
        for c in cs if isinstance(cs, list) else ():
            if not isinstance(c, dict):
                continue
            idx = c.get("index", 0)
            if type(idx) is not int:
                continue
            slot = choices.setdefault(idx, {"index": idx, "message": {"role": "assistant", "content": ""},
                                            "finish_reason": None, "logprobs": None})
            delta = c.get("delta")
            delta = delta if isinstance(delta, dict) else {}
            if _str(delta.get("role")):
                slot["message"]["role"] = delta["role"]
            if _str(delta.get("content")):
                slot["message"]["content"] += delta["content"]
            if _str(delta.get("reasoning_content")):
                slot["message"]["reasoning_content"] = slot["message"].get("reasoning_content", "") + \
                    delta["reasoning_content"]
            tcs = delta.get("tool_calls")
            for tc in tcs if isinstance(tcs, list) else ():
                if not isinstance(tc, dict):
                    continue
                calls = slot["message"].setdefault("tool_calls", [])
                i = tc.get("index", len(calls))
                if type(i) is not int or not 0 <= i < MAX_TOOL_CALLS:
                    continue
                while len(calls) <= i:
                    calls.append({"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                call = calls[i]
                if _str(tc.get("id")):
                    call["id"] = tc["id"]
                fn = tc.get("function")
                fn = fn if isinstance(fn, dict) else {}
                if _str(fn.get("name")):
                    call["function"]["name"] += fn["name"]
                if _str(fn.get("arguments")):
                    call["function"]["arguments"] += fn["arguments"]
            lp = c.get("logprobs")
            if isinstance(lp, dict) and isinstance(lp.get("content"), list):
                have = slot["logprobs"] or {"content": []}
                have["content"].extend(lp["content"])
                slot["logprobs"] = have
            if _str(c.get("finish_reason")):
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
    for c in completion.get("choices") or ():
        if not isinstance(c, dict):
            continue
        msg = c.get("message")
        msg = msg if isinstance(msg, dict) else {}
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
