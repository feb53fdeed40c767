"""Every HTTP header the gateway reads from a client, writes on a response or sends to an
engine, in one registry.

    Header(name, direction, where, values, doc)   name lowercase; "{n}" = the 1-based index of
                                                   an image or video, "{kind}" = a rate limit kind

The code that reads or writes a header takes its name from here (``CACHE.name``,
``IMAGE_TRANSFORM.nth(2)``); the browser exposure list (CORS ``access-control-expose-headers``)
is every response header, expanded for the configured counts; docs/HEADERS.md is generated from
this module (``python -m vlm_gateway.docgen``) and tests/test_headers.py checks the headers of
real requests against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Direction = Literal["request", "response", "upstream"]
RATE_KINDS = ("requests", "images", "tokens")


@dataclass(frozen=True, slots=True)
class Header:
    name: str
    direction: Direction
    where: str      # which requests or responses carry it
    values: str     # the value's form
    doc: str

    @property
    def raw(self) -> bytes:
        return self.name.encode("latin-1")

    def nth(self, n: int | str) -> str:
        return self.name.replace("{n}", str(n))

    def expand(self, max_n: int = 1) -> list[str]:
        """Concrete names: ``{n}`` for 1..max_n, ``{kind}`` for every rate-limit kind."""
        names = [self.name]
        if "{kind}" in self.name:
            names = [self.name.replace("{kind}", k) for k in RATE_KINDS]
        if "{n}" in self.name:
            names = [nm.replace("{n}", str(i)) for nm in names for i in range(1, max_n + 1)]
        return names

    def matches(self, name: str) -> bool:
        name = name.lower()
        head, _, tail = self.name.partition("{")
        if not tail:
            return name == self.name
        rest = name[len(head):] if name.startswith(head) else None
        if rest is None:
            return False
        if self.name.endswith("{n}"):
            return rest.isdigit() and int(rest) >= 1 and rest[0] != "0"
        return rest in RATE_KINDS and name == self.name.replace("{kind}", rest)


_REGISTRY: list[Header] = []


def _h(name: str, direction: Direction, where: str, values: str, doc: str) -> Header:
    h = Header(name, direction, where, values, doc)
    _REGISTRY.append(h)
    return h


# -- read from the client -------------------------------------------------------------------
AUTHORIZATION = _h("authorization", "request", "every route with API keys (auth.tenants); /admin, /ui APIs",
                   "`Bearer <key>`", "The tenant's API key (its sha256 is in auth.tenants[].key_sha256), or the "
                   "admin key. 401 without one, 403 with an unknown one.")
REQUEST_ID_IN = _h("x-request-id", "request", "any", "1-128 of `A-Z a-z 0-9 - _ . :`",
                   "Used as the request's id when it is sane (else a new one is made); echoed on the response, "
                   "sent upstream and written in the access line.")
CACHE_MODE = _h("x-vlm-gateway-cache-mode", "request", "/v1/chat/completions (with cache.client_control)",
                "`on` | `off`", "`off`: this request neither reads nor fills the response cache (L3); `on`: it "
                "may even when it is not deterministic (cache.mode: deterministic caches only temperature 0, a "
                "seed or top_k 1).")
CACHE_CONTROL_IN = _h("cache-control", "request", "/v1/chat/completions (with cache.client_control)",
                      "`no-cache` | `no-store`", "`no-cache`: skip the response-cache lookup but store the fresh "
                      "answer; `no-store`: neither.")
IMAGE_POLICY = _h("x-vlm-gateway-image-policy", "request", "/v1/chat/completions with images",
                  "`default` | `off` | `below-floor` | a long side in pixels (1-16384)",
                  "This request's images: `off` forwards them unrewritten (a backend cap still applies), a number "
                  "is the long side to rewrite to (over `image_url.detail`), `below-floor` lets the SLO controller "
                  "shrink text below its legibility floor under load. 400 for anything else; part of the cache key.")
GROUNDING_IN = _h("x-vlm-gateway-grounding", "request", "/v1/chat/completions with images", "`on` | `off`",
                  "`off`: do not map coordinates in the answer back to the client's image frame (docs/GROUNDING.md).")
VIDEO_POLICY = _h("x-vlm-gateway-video-policy", "request", "/v1/chat/completions with videos", "`off` | `default`",
                  "`off`: forward this request's videos as they came, without the rewrite (docs/VIDEO.md).")
HOST = _h("host", "request", "any", "a host name", "Checked against server.allowed_hosts (DNS-rebinding guard): "
          "another name gets 400.")
ORIGIN = _h("origin", "request", "any (browsers)", "an origin", "Cross-origin requests need the origin in "
            "server.allowed_origins (403 otherwise); allowed ones get CORS headers.")

# -- written on responses ---------------------------------------------------------------------
REQUEST_ID = _h("x-request-id", "response", "every response", "the request's id",
                "The client's `x-request-id` if it was sane, else a new one; also in the access line.")
OVERHEAD = _h("x-vlm-gateway-overhead-ms", "response", "every response", "milliseconds, 3 decimals",
              "Time spent in the gateway, upstream excluded; on the completion routes from the request's "
              "first byte (receiving the body counts).")
SERVER_TIMING = _h("server-timing", "response", "completion answers, errors included",
                   "`receive;dur=..., parse;dur=..., queue;dur=..., media;dur=..., route;dur=..., other;dur=..., "
                   "gateway;dur=...` (ms)",
                   "The gateway's time from the request's first byte to its first byte upstream, split by phase; "
                   "`gateway` is the whole and the parts add up to it (media work of several images in parallel "
                   "counts its wall time).")
BACKEND = _h("x-vlm-gateway-backend", "response", "completion answers, errors included",
             "a backend name, or `none`", "The backend that answered (`none`: a cache hit or a refusal before one "
             "was picked).")
CACHE = _h("x-vlm-gateway-cache", "response", "/v1/chat/completions answers while the response cache is on "
           "(cache.enabled)",
           "`miss` | `bypass` | `hit-exact` | `hit-normalized` | `hit-semantic`",
           "The response cache's (L3) result. `miss`: looked up, not found (a complete answer is stored). "
           "`bypass`: not looked up, most often because the request is not deterministic (the default "
           "cache.mode: deterministic caches only requests with temperature 0, a seed or top_k 1), or the "
           "client asked (`x-vlm-gateway-cache-mode: off`, `Cache-Control: no-cache` / `no-store`), or a media "
           "part is known only by its URL (images.url_mode: passthrough). `hit-exact`: the same request "
           "(tenant, model, messages with media by content hash, output parameters). `hit-normalized`: the same "
           "but for the wording of the last question, equal once normalised (cache.normalized). "
           "`hit-semantic`: a close question in the same conversation about the same media (cache.semantic). "
           "Absent on /v1/completions and with cache.enabled: false.")
CACHE_SIMILARITY = _h("x-vlm-gateway-cache-similarity", "response", "with `x-vlm-gateway-cache: hit-semantic`",
                      "cosine similarity, 4 decimals", "How close the cached question was.")
VISUAL_TOKENS = _h("x-vlm-gateway-visual-tokens", "response", "chat answers with images",
                   "`before=N;after=M`", "Visual tokens of the request's images as sent by the client and as "
                   "rewritten (the model's own count).")
IMAGE_CONVERTED = _h("x-vlm-gateway-image-converted", "response", "chat answers with an image that was converted",
                     "`PARAM=conv,conv; ...`", "What was converted for the engine per image (animation -> first "
                     "frame, colour profile -> sRGB, alpha -> flattened, ...).")
IMAGE_BUDGET = _h("x-vlm-gateway-image-budget", "response", "chat answers with images",
                  "`PARAM;class=C;text_px=T;long_side=N;legible_floor=F;reason=R;level=L, ...` (one entry per "
                  "image; `PARAM;long_side=original;level=L` when not measured)",
                  "The long side each image was budgeted to, why (its text size and legibility floor, the "
                  "fixed rule, a cap), and the SLO budget level (docs/IMAGES.md).")
GROUNDING = _h("x-vlm-gateway-grounding", "response", "chat answers with images, for a model with a coordinate "
               "convention", "`convention=NAME; mapping=on|by-image-marker|off[; reason=...]`",
               "Whether coordinates in the answer are mapped back to the client's frame (docs/GROUNDING.md).")
IMAGE_TRANSFORM = _h("x-vlm-gateway-image-transform-{n}", "response", "with `x-vlm-gateway-grounding`, one per "
                     "image (request order)",
                     "`part=PARAM; client=WxH; crop=l,t,r,b; sent=WxH; scale=sx,sy[; model=WxH; answer=WxH]`",
                     "What was cropped and scaled for the n-th image, to map coordinates yourself.")
VIDEO_TOKENS = _h("x-vlm-gateway-video-tokens", "response", "chat answers with videos", "`before=N;after=M`",
                  "Prompt tokens of the request's videos as sent and as rewritten (what vLLM counts).")
VIDEO = _h("x-vlm-gateway-video-{n}", "response", "chat answers with videos, one per video (request order)",
           "`part=PARAM; outcome=...; frames=A->B; rate=...; ...`",
           "What the rewrite did to the n-th video: outcome, frames, rate, size, plan (docs/VIDEO.md).")
RATE_LIMIT = _h("x-ratelimit-limit-{kind}", "response", "completion answers of a tenant with that limit "
                "(kind: requests, images, tokens)", "an integer", "The tenant's per-minute limit.")
RATE_REMAINING = _h("x-ratelimit-remaining-{kind}", "response", "as x-ratelimit-limit-{kind}", "an integer",
                    "What is left of it now.")
RATE_RESET = _h("x-ratelimit-reset-{kind}", "response", "as x-ratelimit-limit-{kind}", "a duration (`1s`, `6m0s`)",
                "When the bucket is full again.")
RETRY_AFTER = _h("retry-after", "response", "429, 503", "seconds", "When to retry (rate limits, full queues, "
                 "no healthy backend).")
STREAM_NO_BUFFER = _h("x-accel-buffering", "response", "streamed answers", "`no`",
                      "Tells nginx-like proxies in front of the gateway not to buffer the stream.")

# -- sent to the engine ------------------------------------------------------------------------
UPSTREAM_REQUEST_ID = _h("x-request-id", "upstream", "every completion request sent to a backend",
                         "the request's id", "vLLM uses it as its own request id, so engine logs match the gateway's.")
UPSTREAM_AUTHORIZATION = _h("authorization", "upstream", "backends with backends[].api_key", "`Bearer <api_key>`",
                            "The backend's own key; the client's key is never forwarded.")

REGISTRY: tuple[Header, ...] = tuple(_REGISTRY)
RESPONSE: tuple[Header, ...] = tuple(h for h in REGISTRY if h.direction == "response")
REQUEST: tuple[Header, ...] = tuple(h for h in REGISTRY if h.direction == "request")


def lookup(name: str, direction: Direction = "response") -> Header | None:
    return next((h for h in REGISTRY if h.direction == direction and h.matches(name)), None)


def exposed(max_images: int, max_videos: int) -> list[str]:
    """Every response header a browser page may read (CORS), for these per-request counts."""
    out: list[str] = []
    for h in RESPONSE:
        n = max_videos if h is VIDEO else max_images
        out += [nm for nm in h.expand(max(1, n)) if nm not in out]
    return out
