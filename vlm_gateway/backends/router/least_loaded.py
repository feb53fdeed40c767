"""least_loaded: the candidate with the lowest normalised load first.

    seqs(b) = max(inflight(b), running(b) + waiting(b) + inflight(b) - inflight_at_scrape(b))
    load(b) = max(seqs(b) / capacity(b), kv_usage(b))

``running``/``waiting``/``kv_usage`` come from the engine's /metrics (scraped every
``routing.scrape_interval_s``, used while younger than ``STALE_S``); the gateway's
own in-flight count keeps the figure fresh between scrapes (requests sent or
finished since the scrape shift it), and other gateway replicas' traffic shows
up through the engine's counts. ``capacity`` is the profile's ``max_num_seqs``
(``DEFAULT_CAPACITY`` without a profile). The score is ``load``; ties rotate
(the ``Policy`` base), so equal backends share the traffic. No parameters.
"""

from __future__ import annotations

import time

from .policy import Policy, register

DEFAULT_CAPACITY = 64
# scraped figures older than this are ignored (engine unreachable for metrics)
STALE_S = 2.0


def load(b) -> float:
    """Normalised load of backend ``b`` (0 = idle, 1 = every profile slot busy)."""
    cap = b.capacity or DEFAULT_CAPACITY
    seqs = float(b.inflight)
    kv = 0.0
    st = b.stats
    if st is not None and time.monotonic() - st.at <= STALE_S:
        engine = (st.running or 0.0) + (st.waiting or 0.0)
        seqs = max(seqs, engine + b.inflight - st.inflight_at_scrape)
        kv = st.kv_usage or 0.0
    return max(seqs / cap, kv)


@register("least_loaded")
class LeastLoaded(Policy):
    name = "least_loaded"

    def score(self, req, b) -> float:
        return load(b)
