"""Video rewrite: decode -> sample -> dedupe -> plan -> resize -> encode, one pure
synchronous call (``rewrite.rewrite_video``) that the stage runs off the event loop.

Modules, in pipeline order (each states its contract):

- ``errors``   VideoError(code, message) for every refusal
- ``settings`` VideoSettings: rates, caps and limits (the stage fills them from config)
- ``tables``   the container's own counts (samples, indexes, frame sizes) before FFmpeg reads them
- ``probe``    container sniffing from magic bytes and header limits before any decode
- ``decode``   streaming PyAV decode with frame, pixel, duration and wall-clock bounds
- ``sample``   frames on a fixed-rate grid: the scene on screen at each sample time
- ``dedupe``   near-duplicate test on small grey thumbnails against the last kept frame
- ``plan``     output rate and frames: every distinct state in an engine group of its own
               (or, plan "frames", on an output frame at its exact time)
- ``budget``   per-frame size: the image budget, and the hook for a per-state legibility budget
- ``encode``   deterministic H.264/MP4 at a constant rate that vLLM samples 1:1
- ``rewrite``  the whole pipeline, returning bytes, timings and token counts

Around it, in the gateway: ``stage`` (the media stage's video rewrite: decode pool, L1,
headers, metrics, recount per backend) and ``l1`` (rewritten videos by source hash and
settings).
"""
