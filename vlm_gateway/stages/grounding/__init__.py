"""Grounding-safe rewriting: coordinates the model returns stay in the frame of the
client's image. ``conventions`` (which frame a model answers in), ``frames`` (sent
image -> client image), ``text`` (finding and mapping coordinate groups, streamed or
whole), ``response`` (applying that to completions and SSE), ``plan`` (one request's
decisions and headers), ``stage`` (the chain stage). See docs/GROUNDING.md."""
