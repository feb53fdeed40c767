"""text_prefix: the text-only prefix router, kept as a benchmark baseline.

Same formula and parameters as ``affinity`` (longest remembered prefix key,
followed if it covers >= ``affinity_min_match`` of the prompt and its backend's
load is <= ``affinity_max_load``, else least load), but image parts are left out
of the keys and of the token counts, as text-hashing routers do (vLLM
production-stack's prefix-aware router drops them; SGLang's cache-aware router
hashes raw text). Two chats asking the same question about different images
therefore look identical to it.
"""

from __future__ import annotations

from .policy import register
from .affinity import PrefixAffinity


@register("text_prefix")
class TextPrefix(PrefixAffinity):
    name = "text_prefix"
    include_images = False
