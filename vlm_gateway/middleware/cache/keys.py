"""Canonical cache keys for one chat request.

* ``exact``: tenant scope, model, the normalised messages (string content and a
  single text part are the same prompt; every image replaced by its content
  hash) and every body parameter that can change the output.
* ``partition``: the same, except the wording of the last user question; the
  normalised-exact and semantic levels only ever compare questions inside one
  partition, so a different image, system prompt, earlier turn, sampling
  parameter or tenant is never a hit.
* ``normalized``: partition + the normalised last question.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from .normalize import normalize_question

if TYPE_CHECKING:
    from ...proxy.request import ChatRequest

# Body fields that do not change the generated content; everything else is part of
# the key (unknown engine extras included: when in doubt, a separate entry).
NEUTRAL_PARAMS = frozenset({"model", "messages", "stream", "stream_options", "user", "metadata", "store",
                            "service_tier", "request_id", "priority"})

IMAGE_POLICY_HEADER = "x-vlm-gateway-image-policy"
_Q = {"type": "text", "text": "\x00question"}  # stands for the last user question in the partition


def _h(*parts: Any) -> str:
    return hashlib.blake2b(orjson.dumps(parts, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS),
                           digest_size=16).hexdigest()


def image_identity(part_hash: str, url: str) -> str:
    # Until (or where) the image stage has not filled the content hash, the URL
    # string itself identifies the bytes; it is only stricter (same bytes under two
    # URLs miss), never looser.
    if part_hash:
        return part_hash
    return "url:" + hashlib.blake2b(url.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


@dataclass(slots=True)
class CacheKeys:
    exact: str
    partition: str
    # The last user question as sent (text parts joined) and normalised; "" when the
    # last message is not a user message with text.
    question: str
    normalized_question: str
    normalized: str  # "" when there is no question


def _content(content: Any, images: dict[tuple[int, int], Any], mi: int) -> list:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    out = []
    for pi, part in enumerate(content):
        if part.get("type") == "image_url":
            ip = images.get((mi, pi))
            iu = part.get("image_url")
            url = iu if isinstance(iu, str) else (iu or {}).get("url", "")
            detail = None if isinstance(iu, str) else (iu or {}).get("detail")
            out.append({"type": "image", "id": image_identity(ip.content_hash if ip is not None else "", url),
                        "detail": detail or "auto"})
        else:
            out.append(part)
    return out


def build_keys(req: "ChatRequest") -> CacheKeys:
    images = {(p.message, p.index): p for p in req.images}
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
        return CacheKeys(exact, "", "", "", "")
    # Partition: the last message keeps its images, roles and part layout; its text
    # parts collapse into one placeholder so only the question's wording is left out.
    rest = [p for p in last["content"] if p.get("type") != "text"]
    first_text = next(i for i, p in enumerate(last["content"]) if p.get("type") == "text")
    last_canon = {**last, "content": rest[:first_text] + [_Q] + rest[first_text:]}
    partition = _h("partition", scope, req.model, canon[:-1] + [last_canon], params)
    nq = normalize_question(question)
    normalized = _h("normalized", partition, nq) if nq else ""
    return CacheKeys(exact, partition, question, nq, normalized)
