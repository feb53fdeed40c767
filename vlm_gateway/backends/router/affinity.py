"""affinity: send a request where its prefix (images included) already sits in a
KV cache, unless that backend is too busy; otherwise least load.

Prefix keys are chained hashes over the conversation, one key after every
content part (and every plain-string message):

    k_0 = H(model)
    k_j = H(k_{j-1} || role || part_j)   part = text, or a media part's content hash
    H   = BLAKE3-256, incremental (vlm_gateway.hashing)

so the key after the last part of turn n is also a prefix key of turn n+1 (same
leading messages + the assistant reply + the new user turn). ``tokens_j`` is the
estimated prompt length up to k_j (text and chat template as ``vision_tokens``
estimates them, as admission does; images by their visual tokens). A bounded LRU map with TTL remembers, per key, the backend that
last served a request containing it (``served`` hook, called after a send).

    match      = longest k_j in the map whose backend is a candidate
    fraction   = tokens_j / tokens_total
    home       = argmax over candidates of H(root || name)    (rendezvous hashing)
                 root = the key after the conversation's first user message
    b          = match if fraction >= min_match, else home
    extra      = (load(b) - min over candidates of load) * capacity(b)   (sequences)
    follow b   if load(b) <= max_load and extra <= max_extra
    otherwise  rank by least_loaded.load (ties rotate)

As filter -> score -> pick (``router/__init__.py``): the candidates are scored by
load as ``least_loaded`` does, and the pick puts ``b`` first when it may be followed.

The map is per process; ``home`` needs no shared state, so every worker and
every replica sends a conversation it has never seen to the same backend (its
first turn went there too, unless that backend was overloaded), and distinct
conversations spread evenly over the pool.

Parameters (``routing.*``): ``affinity_max_load`` (0.9: past 90 % of the
profile's slots the cache hit costs more than the queue), ``affinity_max_extra_seqs``
(4: a cache hit saves about one prompt's prefill and image preprocessing, while
every sequence queued ahead costs about as much, so a backend more than a few
sequences busier than the idlest one loses its claim — this is what keeps p99
at least_loaded's level), ``affinity_min_match`` (0.5: a shared system prompt
alone does not pin a new conversation), ``affinity_ttl_s``, ``affinity_max_entries``.
"""

from __future__ import annotations

import hashlib
import threading

import orjson

from ... import metrics
from ...core.state import Slot
from ...hashing import content_digest, hasher
from ...core.clock import Clock, monotonic
from ...lru import LRU
from ...vision_tokens import (MARKER_TOKENS, TEMPLATE_TOKENS_PER_MESSAGE, estimate_prompt_tokens,
                              estimate_text_tokens, visual_tokens)
from .policy import register
from .least_loaded import DEFAULT_CAPACITY, LeastLoaded, load

# an image whose size is unknown (no image stage) counts as this many tokens
UNKNOWN_IMAGE_TOKENS = 256
# keys remembered per request (the longest ones: later turns extend them)
MAX_KEYS_PER_REQUEST = 64


def _image_tokens(img) -> int:
    # Routing comes before the image stage's rewrite for the chosen backend, so an image
    # weighs its source size here: a weight for the matched fraction, not a context check
    # (admission checks the size the model's image budget gives, policy.model_settings).
    if img is None:
        return UNKNOWN_IMAGE_TOKENS
    if img.tokens_after:
        return img.tokens_after
    if img.width and img.height:
        try:
            return visual_tokens(img.width, img.height, markers=True)
        except ValueError:
            pass
    return img.tokens_before or UNKNOWN_IMAGE_TOKENS


def _image_identity(img, part: dict) -> bytes:
    if img is not None and img.content_hash:
        return img.content_hash.encode()
    if img is not None and img.url:
        return content_digest(img.url.encode("utf-8", "replace"))
    return content_digest(orjson.dumps(part, option=orjson.OPT_SORT_KEYS))


# per request: ([(key, tokens up to it)], total tokens) and the root key, with the
# images hashed in and (as a text-only router sees it) without
_KEYS: Slot[tuple[list[tuple[bytes, int]], int]] = Slot("affinity_keys")
_KEYS_TEXT: Slot[tuple[list[tuple[bytes, int]], int]] = Slot("affinity_keys_text")
_ROOT: Slot[bytes] = Slot("affinity_root")
_ROOT_TEXT: Slot[bytes] = Slot("affinity_root_text")


def prefix_keys(req, include_images: bool = True) -> tuple[list[tuple[bytes, int]], int]:
    """([(key, tokens up to it)], total tokens) of a request; cached on ``req.state``."""
    slot = _KEYS if include_images else _KEYS_TEXT
    cached = req.state.get(slot)
    if cached is not None:
        return cached
    h = hasher()
    h.update(req.model.encode())
    keys: list[tuple[bytes, int]] = []
    tokens = 0
    if req.route != "chat":
        prompt = req.body.get("prompt")
        text = prompt if isinstance(prompt, str) else orjson.dumps(prompt)
        h.update(text.encode() if isinstance(text, str) else text)
        tokens = estimate_prompt_tokens(prompt)
        keys.append((h.digest(), tokens))
        result = (keys, tokens)
        req.state[slot] = result
        return result
    images = {(i.message, i.index): i for i in req.images}
    media = {(i.message, i.index): i for i in req.media if i.kind != "image"}
    root = None
    for mi, msg in enumerate(req.body.get("messages") or ()):
        if not isinstance(msg, dict):
            continue
        if root is None and keys and mi and _is_user(req.body["messages"][mi - 1]):
            root = keys[-1][0]
        h.update(b"\x00" + str(msg.get("role")).encode() + b"\x01")
        tokens += TEMPLATE_TOKENS_PER_MESSAGE
        extra = {k: v for k, v in msg.items() if k not in ("role", "content")}
        if extra:
            h.update(orjson.dumps(extra, option=orjson.OPT_SORT_KEYS))
        content = msg.get("content")
        if isinstance(content, str):
            h.update(content.encode())
            tokens += estimate_text_tokens(content)
            keys.append((h.digest(), tokens))
            continue
        if not isinstance(content, list):
            continue
        for pi, part in enumerate(content):
            if not isinstance(part, dict):
                continue
            ptype = part.get("type")
            if ptype == "text":
                text = part.get("text") or ""
                h.update(b"\x02" + text.encode())
                tokens += estimate_text_tokens(text)
            elif (mi, pi) in images or ptype == "image_url":
                if not include_images:
                    continue  # as a text-only router does: the image is invisible
                img = images.get((mi, pi))
                h.update(b"\x03" + _image_identity(img, part))
                tokens += _image_tokens(img)
            elif (mi, pi) in media:  # video, audio: by the identity of the bytes sent
                h.update(b"\x04" + _image_identity(media[(mi, pi)], part))
                tokens += media[(mi, pi)].tokens_after or MARKER_TOKENS   # a rewritten video's count
            else:
                h.update(orjson.dumps(part, option=orjson.OPT_SORT_KEYS))
                tokens += MARKER_TOKENS
            keys.append((h.digest(), tokens))
    if root is None and keys:
        root = keys[-1][0]
    req.state[_ROOT if include_images else _ROOT_TEXT] = root or h.digest()
    result = (keys, max(tokens, 1))
    req.state[slot] = result
    return result


def _is_user(msg) -> bool:
    return isinstance(msg, dict) and msg.get("role") == "user"


def root_key(req, include_images: bool = True) -> bytes:
    """The chained key after the conversation's first user message."""
    prefix_keys(req, include_images)
    return req.state[_ROOT if include_images else _ROOT_TEXT]


def home(root: bytes, candidates):
    """Rendezvous (highest random weight) choice: stable for a root, even across roots."""
    return max(candidates, key=lambda b: hashlib.blake2b(root + b.name.encode(), digest_size=8).digest())


class PrefixMap:
    """Bounded LRU of prefix key -> backend name, each entry for ``ttl_s``."""

    def __init__(self, ttl_s: float, max_entries: int, clock: Clock = monotonic) -> None:
        self.ttl = ttl_s
        self._map: LRU[bytes, str] = LRU(max(1, max_entries), ttl_s=ttl_s, clock=clock)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._map)

    def get(self, key: bytes) -> str | None:
        with self._lock:
            return self._map.get(key, touch=False)

    def put_many(self, keys, name: str) -> None:
        with self._lock:
            for k in keys:
                self._map.put(k, name)


class PrefixAffinity(LeastLoaded):
    """Shared by ``affinity`` (images in the keys) and ``text_prefix`` (images ignored)."""

    name = "affinity"
    include_images = True

    def __init__(self, cfg=None) -> None:
        super().__init__(cfg)
        self.max_load = getattr(cfg, "affinity_max_load", 0.9)
        self.min_match = getattr(cfg, "affinity_min_match", 0.5)
        self.max_extra = getattr(cfg, "affinity_max_extra_seqs", 4.0)
        self.map = PrefixMap(getattr(cfg, "affinity_ttl_s", 600.0), getattr(cfg, "affinity_max_entries", 100_000))

    def match(self, req, candidates) -> tuple[object | None, float]:
        """(backend holding the longest known prefix, fraction of the prompt it covers)."""
        keys, total = prefix_keys(req, self.include_images)
        by_name = {b.name: b for b in candidates}
        for key, tokens in reversed(keys):
            name = self.map.get(key)
            if name is not None:
                b = by_name.get(name)
                if b is not None:
                    return b, tokens / total
        return None, 0.0

    def rank(self, req, candidates):
        ranked = super().rank(req, candidates)
        if len(candidates) <= 1:
            return ranked
        b, fraction = self.match(req, candidates)
        followed = "affinity"
        if b is None or fraction < self.min_match:
            # never seen here (or only a short shared prefix): the conversation's home
            b, followed = home(root_key(req, self.include_images), candidates), "home"
        if load(b) > self.max_load or \
                (load(b) - load(ranked[0])) * (b.capacity or DEFAULT_CAPACITY) > self.max_extra:
            metrics.ROUTING.labels(self.name, f"{followed}_overloaded").inc()
            return ranked
        metrics.ROUTING.labels(self.name, followed).inc()
        return [b] + [x for x in ranked if x is not b]

    def served(self, req, backend) -> None:
        keys, _ = prefix_keys(req, self.include_images)
        self.map.put_many([k for k, _ in keys[-MAX_KEYS_PER_REQUEST:]], backend.name)


@register("affinity")
class Affinity(PrefixAffinity):
    name = "affinity"
    include_images = True
