"""Apply a text mapper to an answer: the message content of a complete
``chat.completion``, or the ``delta.content`` of a relayed SSE stream.

The stream side re-frames upstream bytes into events, passes each choice's content
deltas through that choice's incremental mapper and writes the event back: unchanged
events keep their bytes, changed ones are re-serialised. A choice's held tail is
released with its ``finish_reason`` chunk (or, if the stream ends without one, in a
chunk of its own before ``[DONE]``). Events that are not chat chunks (errors, usage,
comments, malformed data) pass through as they are.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import orjson


class TextMapper(Protocol):
    def text(self, s: str) -> str: ...
    def feed(self, delta: str) -> str: ...
    def flush(self) -> str: ...

    # True while feeding text without '"', "'" or '<' returns it unchanged and changes nothing
    @property
    def idle(self) -> bool: ...




class StreamTransform:
    """One relayed stream: bytes in, bytes out (``feed``), then ``close``."""

    __slots__ = ("make", "on_done", "buf", "mappers", "base", "idle_new")

    def __init__(self, make: Callable[[], TextMapper], on_done: Callable[[], None] | None = None) -> None:
        self.make = make
        self.on_done = on_done
        self.buf = b""
        self.mappers: dict[int, TextMapper] = {}
        self.base: dict[str, Any] | None = None  # the last chunk (its id/created/model)
        self.idle_new = make().idle

    def feed(self, data: bytes) -> bytes:
        # Fast path: nothing held and no content that could start a group (in JSON such content
        # shows none of these bytes: a quote inside a string is escaped, other escapes of '<' or
        # of quotes start with a backslash-u): whole events pass as they are, unparsed.
        if not self.buf and not (b'\\"' in data or b"'" in data or b"<" in data or b"\\u" in data
                                 or b"\r" in data) and self.idle_new and all(m.idle for m in self.mappers.values()):
            if data.endswith(b"\n\n"):
                return data
            cut = data.rfind(b"\n\n") + 2
            self.buf = data[cut:] if cut > 1 else data
            return data[:cut] if cut > 1 else b""
        buf = self.buf + data if self.buf else data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        *events, self.buf = buf.split(b"\n\n")
        if len(events) == 1:
            return self._event(events[0])
        return b"".join([self._event(ev) for ev in events])

    def close(self) -> bytes:
        """End of the upstream body: a trailing event without its blank line, and held text."""
        out = self._event(self.buf) if self.buf.strip() else b""
        self.buf = b""
        out += self._release()
        if self.on_done is not None:
            self.on_done()
        return out

    def _release(self) -> bytes:
        out = []
        for idx, m in self.mappers.items():
            rest = m.flush()
            if rest:
                base = self.base or {}
                out.append(b"data: " + orjson.dumps({
                    "id": base.get("id", ""), "created": base.get("created", 0), "model": base.get("model", ""),
                    "object": "chat.completion.chunk",
                    "choices": [{"index": idx, "delta": {"content": rest}, "logprobs": None,
                                 "finish_reason": None}]}) + b"\n\n")
        return b"".join(out)

    def _event(self, ev: bytes) -> bytes:
        if b"data:" not in ev:
            return ev + b"\n\n"
        if not (b'\\"' in ev or b"'" in ev or b"<" in ev or b"\\u" in ev) and \
                self.idle_new and all(m.idle for m in self.mappers.values()):
            return ev + b"\n\n"  # the same test as feed's, per event
        lines = ev.split(b"\n")
        changed = False
        prefix = b""
        for i, line in enumerate(lines):
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                prefix += self._release()
                continue
            try:
                obj = orjson.loads(payload)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(obj, dict) or not isinstance(obj.get("choices"), list):
                continue
            if self._chunk(obj):
                lines[i] = b"data: " + orjson.dumps(obj)
                changed = True
        body = b"\n".join(lines) if changed else ev
        return prefix + body + b"\n\n"

    def _chunk(self, obj: dict) -> bool:
        self.base = obj
        changed = False
        for c in obj["choices"]:
            if not isinstance(c, dict):
                continue
            delta = c.get("delta")
            content = delta.get("content") if isinstance(delta, dict) else None
            finish = c.get("finish_reason")
            if not isinstance(content, str) and not finish:
                continue
            idx = c.get("index", 0)
            m = self.mappers.get(idx)
            if m is None:
                m = self.mappers[idx] = self.make()
            out = m.feed(content) if isinstance(content, str) else ""
            if finish:
                out += m.flush()
            if (out == content) if isinstance(content, str) else not out:
                continue
            if not isinstance(delta, dict):
                delta = c["delta"] = {}
            delta["content"] = out
            changed = True
        return changed


class ResponseTransform:
    """What the relay calls (see ``core.request.ResponseTransform``)."""

    __slots__ = ("make", "on_done")

    def __init__(self, make: Callable[[], TextMapper], on_done: Callable[[], None] | None = None) -> None:
        self.make = make
        self.on_done = on_done

    def completion(self, completion: dict) -> bool:
        changed = False
        for c in completion.get("choices") or ():
            msg = c.get("message") if isinstance(c, dict) else None
            content = msg.get("content") if isinstance(msg, dict) else None
            if isinstance(content, str):
                out = self.make().text(content)
                if out != content:
                    msg["content"] = out
                    changed = True
        if self.on_done is not None:
            self.on_done()
        return changed

    def stream(self) -> StreamTransform:
        return StreamTransform(self.make, self.on_done)
