"""Adapters that put the gateway's stages inside other tools (LiteLLM, ...).

Each adapter imports its tool itself; nothing here is imported by the gateway core,
so the tools stay optional extras (``pip install '.[litellm]'`` in the checkout)."""
