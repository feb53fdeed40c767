"""The simulator: a test instrument that behaves like vLLM where a gateway can
observe it (or, with ``--engine trtllm``, serves trtllm-serve's load endpoints).
Never presented as a model."""

from .app import create_sim_app
from .engine import SimEngine, SimProfile

__all__ = ["create_sim_app", "SimEngine", "SimProfile"]
