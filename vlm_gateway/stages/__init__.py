"""The stage chain: one class per stage (the contract is ``core.stage.Stage``), built
from its config section and the shared clients in ``chain.py``, in the order listed
there: auth -> rate limits -> request limits -> media (video, audio) -> images (L1)
-> grounding -> response cache (L3)."""

from __future__ import annotations

from ..core.stage import Reply, Stage

__all__ = ["Reply", "Stage"]
