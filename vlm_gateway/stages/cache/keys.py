"""Canonical cache keys for one chat request.

* ``exact``: tenant scope, model, the normalised messages (string content and a
  single text part are the same prompt; every media part -- image, video, audio,
  embeddings -- replaced by the content hash of the bytes sent) and every body
  parameter that can change the output.
* ``partition``: the same, except the wording of the last user question; the
  normalised-exact and semantic levels only ever compare questions inside one
  partition, so a different image, system prompt, earlier turn, sampling
  parameter or tenant is never a hit.
* ``normalized``: partition + the normalised last question.

Keys are BLAKE3-256 (``vlm_gateway.hashing``) of a canonical JSON: collision
resistant, so no crafted request can share another's key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from ...core import headers as H
from ...hashing import content_hash
from .normalize import normalize_question

if TYPE_CHECKING:
    from ...core.request import ChatRequest

# Body fields that do not change the generated content; everything else is part of
# the key (unknown engine extras included: when in doubt, a separate entry).
NEUTRAL_PARAMS = frozenset({"model", "messages", "stream", "stream_options", "user", "metadata", "store",
                            "service_tier", "request_id", "priority"})

IMAGE_POLICY_HEADER = H.IMAGE_POLICY.name
_Q = {"type": "text", "text": "\x00question"}  # stands for the last user question in the partition


def _h(*parts: Any) -> str:
    return content_hash(orjson.dumps(parts, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS))


def image_identity(part_hash: str, url: str) -> str:
    # Until (or where) a media stage has not filled the content hash, the URL
    # string itself identifies the bytes; it is only stricter (same bytes under two
    # URLs miss), never looser.
    if part_hash:
        return part_hash
    return "url:" + content_hash(url.encode("utf-8", "surrogatepass"))


@dataclass(slots=True)
class CacheKeys:
    exact: str
    partition: str
    # The last user question as sent (text parts joined) and normalised; "" when the
    # last message is not a user message with text.
    question: str
    normalized_question: str
    normalized: str  # "" when there is no question
    # False when a media part is known only by its URL (url_mode passthrough: the engine
    # fetches, the gateway never saw the bytes): an answer cached under the URL could
    # be served after the content behind it changed, so such requests bypass L3.
    content_known: bool = True


def _content(content: Any, media: dict[tuple[int, int], Any], mi: int) -> list:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    out = []
    for pi, part in enumerate(content):
        mp = media.get((mi, pi))
        if mp is None:
            out.append(part)
        elif mp.ptype == "image_url":
            out.append({"type": "image", "id": image_identity(mp.content_hash, mp.url),
                        "detail": mp.detail or "auto"})
        else:
            # the part with its media replaced by the identity of the bytes sent
            ident = image_identity(mp.content_hash, mp.url) if mp.content_hash or mp.url else ""
            if not ident:  # inline payload not identified by a stage: its JSON is the identity
                ident = "json:" + content_hash(orjson.dumps(part.get(mp.key), option=orjson.OPT_SORT_KEYS))
            out.append({**part, mp.key: {"id": ident}})
    return out


def build_keys(req: "ChatRequest") -> CacheKeys:
    images = {(p.message, p.index): p for p in req.media}
    known = all(p.content_hash and not p.content_hash.startswith("url:") for p in req.media)
    messages = req.body["messages"]
    canon = []
    for mi, msg in enumerate(messages):
        m = {k: v for k, v in msg.items() if k != "content"}
        m["content"] = _content(msg.get("content"), images, mi)
        canon.append(m)
    params = {k: v for k, v in req.body.items() if k not in NEUTRAL_PARAMS}
    # The per-request image policy changes the pixels the model sees.
    policy = req.headers.get(IMAGE_POLICY_HEADER)
    if policy:
        params["\x00image_policy"] = policy.strip().lower()
    # The frame the answer's coordinates are in: the client's (mapped) or the sent images'.
    if req.grounding is not None:
        params["\x00frame"] = req.grounding.frame_key
    scope = req.cache_scope
    exact = _h("exact", scope, req.model, canon, params)

    last = canon[-1]
    question = ""
    if last.get("role") == "user":
        texts = [p.get("text", "") for p in last["content"] if p.get("type") == "text"]
        question = "\n".join(t for t in texts if isinstance(t, str))
    if not question.strip():
        return CacheKeys(exact, "", "", "", "", known)
    # Partition: the last message keeps its images, roles and part layout; its text
    # parts collapse into one placeholder so only the question's wording is left out.
    rest = [p for p in last["content"] if p.get("type") != "text"]
    first_text = next(i for i, p in enumerate(last["content"]) if p.get("type") == "text")
    last_canon = {**last, "content": rest[:first_text] + [_Q] + rest[first_text:]}
    partition = _h("partition", scope, req.model, canon[:-1] + [last_canon], params)
    nq = normalize_question(question)
    normalized = _h("normalized", partition, nq) if nq else ""
    return CacheKeys(exact, partition, question, nq, normalized, known)
