"""Apply a text mapper to an answer: the message content of a complete
``chat.completion``, or the ``delta.content`` of a relayed SSE stream.

The stream side gets whole events (the relay frames upstream bytes and applies
``upstream.max_sse_event_bytes`` first, so no event reaches a transform half-read or
oversized), passes each choice's content deltas through that choice's incremental mapper
and writes the event back: unchanged events keep their bytes, changed ones are
re-serialised; each event is read once (linear in the stream). A choice's held tail is
released with its ``finish_reason`` chunk (or, if the stream ends without one, in a chunk of
its own before ``[DONE]``). Events that are not chat chunks (errors, usage, comments,
malformed data) and choices of any other shape (an ``index`` that is not an integer, a
``delta`` that is not an object, ``content`` that is not a string, more than ``MAX_CHOICES``
choices) pass through as they are.

An answer whose groups pass the mapper's limit (``Counts.limit``) keeps the rest as the model
wrote it; the transform says so once: ``on_over`` (the stage's header, for a complete answer)
and, in a stream, whose headers are gone, an SSE comment ``LIMIT_COMMENT`` where it happened.
Large inputs (``text.heavy``: many groups, or long) are mapped on the text thread.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import orjson

from ... import offload
from .text import Counts, heavy

# choices of one answer mapped at most (OpenAI's own bound on ``n``); others pass as they are
MAX_CHOICES = 128
LIMIT_COMMENT = b": x-vlm-gateway-grounding: mapping=partial; reason=too-many-groups\n\n"


class TextMapper(Protocol):
    counts: Counts

    def text(self, s: str) -> str: ...
    def feed(self, delta: str) -> str: ...
    def flush(self) -> str: ...

    # True while feeding text without '"', "'" or '<' returns it unchanged and changes nothing
    @property
    def idle(self) -> bool: ...


class StreamTransform:
    """One relayed stream: whole events in (``feed``), the same events out, then ``close``."""

    __slots__ = ("make", "on_done", "on_over", "counts", "mappers", "base", "idle_new", "told")

    def __init__(self, make: Callable[[], TextMapper], on_done: Callable[[], None] | None = None,
                 counts: Counts | None = None, on_over: Callable[[], None] | None = None) -> None:
        self.make = make
        self.on_done = on_done
        self.on_over = on_over
        first = make()
        self.counts = counts if counts is not None else first.counts
        self.mappers: dict[int, TextMapper] = {}
        self.base: dict[str, Any] | None = None  # the last chunk (its id/created/model)
        self.idle_new = first.idle
        self.told = False

    def _idle(self) -> bool:
        if not self.idle_new:
            return False
        for m in self.mappers.values():
            if not m.idle:
                return False
        return True

    async def feed(self, events: bytes) -> bytes:
        if heavy(events) and not (self.counts.over and not any(m.pending for m in self.mappers.values())):
            return await offload.run(self.feed_sync, events)
        return self.feed_sync(events)

    async def close(self) -> bytes:
        return self.close_sync()

    def feed_sync(self, events: bytes) -> bytes:
        """Whole events (each ending with its blank line) in, the events to send out."""
        # Fast path: no content that could start a group and no text held: passed unparsed (in
        # JSON such content shows one of these bytes: a quote inside a string is escaped, other
        # escapes of '<' or of quotes start with a backslash-u).
        if not (b'\\"' in events or b"'" in events or b"<" in events or b"\\u" in events or b"\r" in events) \
                and self._idle():
            return events
        if self.counts.over and not any(m.pending for m in self.mappers.values()):
            return events  # past the limit, nothing held: as it is
        if b"\r" in events:
            events = events.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        parts = events.split(b"\n\n")
        tail = parts.pop()  # b"" after the last blank line
        out = b"".join([self._event(ev) for ev in parts])
        if tail.strip():
            out += self._event(tail)
        if self.counts.over and not self.told:
            self.told = True
            out += LIMIT_COMMENT
            if self.on_over is not None:
                self.on_over()
        return out

    def close_sync(self) -> bytes:
        """End of the upstream body: the text still held, in chunks of its own."""
        out = self._release()
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
        if b"data:" not in ev or (not (b'\\"' in ev or b"'" in ev or b"<" in ev or b"\\u" in ev)
                                  and self._idle()):
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
            idx = c.get("index", 0)
            delta = c.get("delta")
            if type(idx) is not int or (delta is not None and not isinstance(delta, dict)):
                continue  # a shape no client reads as a choice's text: as it is
            content = delta.get("content") if delta is not None else None
            finish = c.get("finish_reason")
            if content is not None and not isinstance(content, str):
                continue
            if content is None and not finish:
                continue
            m = self.mappers.get(idx)
            if m is None:
                if len(self.mappers) >= MAX_CHOICES:
                    continue
                m = self.mappers[idx] = self.make()
            out = m.feed(content) if content is not None else ""
            if finish:
                out += m.flush()
            if out == (content or ""):
                continue
            if delta is None:
                delta = c["delta"] = {}
            delta["content"] = out
            changed = True
        return changed


class ResponseTransform:
    """What the relay calls (see ``core.request.ResponseTransform``). ``on_over`` is called
    once when an answer passed the groups limit (``counts.over``)."""

    __slots__ = ("make", "on_done", "counts", "on_over")

    def __init__(self, make: Callable[[], TextMapper], on_done: Callable[[], None] | None = None,
                 counts: Counts | None = None, on_over: Callable[[], None] | None = None) -> None:
        self.make = make
        self.on_done = on_done
        self.counts = counts
        self.on_over = on_over

    async def completion(self, completion: dict) -> bool:
        if any(heavy(c) for c in _contents(completion)):
            return await offload.run(self.completion_sync, completion)
        return self.completion_sync(completion)

    def completion_sync(self, completion: dict) -> bool:
        changed = False
        counts = self.counts
        for c in completion.get("choices") or ():
            msg = c.get("message") if isinstance(c, dict) else None
            content = msg.get("content") if isinstance(msg, dict) else None
            if isinstance(content, str):
                m = self.make()  # one per choice: markers name images within one text
                counts = m.counts
                out = m.text(content)
                if out != content:
                    msg["content"] = out
                    changed = True
        if self.on_done is not None:
            self.on_done()
        if counts is not None and counts.over and self.on_over is not None:
            self.on_over()
        return changed

    def stream(self) -> StreamTransform:
        return StreamTransform(self.make, self.on_done, self.counts, self.on_over)


def _contents(completion: dict):
    for c in completion.get("choices") or ():
        msg = c.get("message") if isinstance(c, dict) else None
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, str):
            yield content
