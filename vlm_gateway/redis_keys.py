"""Every Redis key the gateway writes derives from one prefix, ``redis_prefix``:

    <redis_prefix>:<namespace>:<rest>

Namespaces: ``rl`` (rate-limit buckets and concurrency slots), ``img1`` (L1
rewritten images), ``vid1`` (L1 rewritten videos), ``l3`` (L3 exact and
normalised answers) and ``l3:semantic`` (the semantic level's shared stream,
inside ``l3`` so the L3 flush takes it too).

Redis Cluster: every key is one slot's business except the rate-limit keys of a
tenant, which one Lua script reads together: they carry the hash tag
``{<tenant>}`` (``vlmgw:rl:{acme}:req``), so they share a slot. Cache keys have
no tag and spread over every primary.

Deployments that share one Redis set different prefixes. A flush deletes
``<prefix>:<namespace>:*`` of its own deployment only: the prefix is one segment
of ``[A-Za-z0-9_.-]`` (checked in config.py), so it holds no ``:`` that could nest
one deployment's keys under another's pattern and no glob character for SCAN.
"""

from __future__ import annotations

import re

DEFAULT_PREFIX = "vlmgw"
PREFIX_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")

RATE_LIMITS = "rl"
L1_IMAGES = "img1"
L1_VIDEOS = "vid1"
L3_ANSWERS = "l3"
L3_SEMANTIC = "l3:semantic"


def namespace(prefix: str, name: str) -> str:
    """The key prefix of one namespace, ending in ``:`` (``vlmgw:rl:``)."""
    if not PREFIX_RE.match(prefix):
        raise ValueError(f"invalid Redis key prefix {prefix!r}")
    return f"{prefix}:{name}:"


def key(prefix: str, name: str) -> str:
    """A single key named by its namespace (``vlmgw:l3:semantic``)."""
    return namespace(prefix, name)[:-1]
