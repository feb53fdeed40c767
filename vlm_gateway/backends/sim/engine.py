"""The simulated engine: vLLM's request path, timed by a profile.

A request passes four stages (asyncio tasks on the server's event loop):

0. **Arrival** (``request_latency_s``): HTTP, JSON and base64 parsing, chat
   template and tokenisation. Pure latency: requests do not queue for it.
1. **API server** (``api_servers`` processes, like vLLM's ``--api-server-count``;
   each one FIFO worker: vLLM's single renderer thread plus the process's event
   loop): ``cpu_base_s`` + per image ``cpu_decode_s_per_mpx`` x source megapixels
   (decode + hash, always) + ``cpu_preproc_s_per_mpx`` x source megapixels
   (resize / normalise / patchify; skipped when the same image was processed
   recently by the same API server: vLLM's multimodal processor cache, one per
   API-server process, LRU over ``mm_cache_items`` images and, where set,
   ``mm_cache_tokens`` visual tokens: vLLM bounds it in bytes, so it holds many
   small images but few 12 MP ones), times ``1 + cpu_contention x (requests in
   that server - 1)``. The same process streams its running requests' tokens:
   each token the engine emits adds ``cpu_token_s`` of work that delays the
   preprocessing in progress. An image's identity (processor cache, prefix
   cache) is its content hash, or the part's ``uuid`` where the client gave one:
   vLLM 0.24 then uses that string as the item's hash, whatever the bytes.
   A connection is served by one API server (vLLM's processes share one listening
   socket; keep-alive keeps a connection on the process that accepted it): new
   connections are dealt to the servers in turn; offline, requests are.
   A streaming request's response headers leave when it leaves this stage (vLLM
   answers them once the chat template, the media and the HF processor are done,
   just before ``add_request``): ``Job.rendered``. ``vllm:num_requests_waiting``
   does not count requests still here, as in vLLM.
2. **Hand-over to the engine process** (one FIFO worker): ``ipc_s_per_ktok`` x
   visual ktokens of images that were preprocessed (the pixel tensors travel to
   the engine core; a cache hit sends only the hash). With more than one API
   server vLLM keeps no processor cache in the engine core (its caches are then
   "processor only"), so a hit in an API server's cache still sends the tensors.
3. **Engine steps** (continuous batching with chunked prefill, vLLM V1): each
   step schedules one token for every decoding sequence, then prefill chunks of
   the running, then of the waiting requests (FIFO) within
   ``max_num_batched_tokens``; at most ``max_num_seqs`` run at once and a
   request is admitted only when the KV pool can hold it. A prompt's cached
   prefix (prefix_cache.py) is not prefilled, and an image whose tokens are all
   cached is not encoded again. Step time::

       step_base_s + step_seq_s x sequences in the step
       + kv_read_s_per_ktok x context ktokens of the decoding sequences
       + prefill_s_per_ktok x prefill ktokens
       + per image encoded in the step: vit_base_s + vit_s_per_ktok x t + vit_quad_s_per_ktok2 x t^2
         (t = its visual ktokens; the square is the ViT's full attention over the patches)

   (times ``1 + step_contention x (requests in the server - 1)``; 0 in the
   shipped profiles). Every sequence of a step gets its token when the step ends (the first token
   comes with the step that completes the prefill), so one request's prefill
   stretches everybody's decode and concurrent prefills share the GPU, as on
   the real engine; decode slows as sequences are added.

Fitted constants of ``h200-qwen3vl-2b`` (profiles.yaml; fit and reproduction
table in docs/benchmarks/simulator.md, ``benchmarks/sim_calibration.py``):
    =====================  ==========  ==============================================
    request_latency_s      24.9 ms     HTTP, parsing, template (parallel)
    cpu_base_s             4.7 ms      API-server work per request
    cpu_decode_s_per_mpx   3.3 ms/MP   image decode + hash (always)
    cpu_preproc_s_per_mpx  43.9 ms/MP  HF processor (skipped on a processor-cache hit)
    cpu_contention         0.0022      per other request in the server
    cpu_token_s            0.14 ms     API-server time per streamed token
    ipc_s_per_ktok         23.7 ms/kt  pixel tensors to the engine process
    step_base_s            2.64 ms     engine step (~380 tokens/s for one sequence)
    step_seq_s             0.040 ms    per sequence in the step
    kv_read_s_per_ktok     0.026 ms    per 1000 context tokens decoded
    prefill_s_per_ktok     6.9 ms      LLM prefill per 1000 tokens
    vit_base_s             25.1 ms     per image encoded (ViT launch, eager)
    vit_s_per_ktok         7.8 ms      ViT per 1000 visual tokens
    vit_quad_s_per_ktok2   2.8 ms      ViT attention per (1000 visual tokens)^2
    max_num_batched_tokens 8192        vLLM's default on an H200 (max_num_seqs 1024)
    =====================  ==========  ==============================================

Offline (virtual clock) every measured row is reproduced within 18% (TTFT p50
and req/s); the worst are 1080p at concurrency 64 (8.0 vs 6.86 req/s: the
measured throughput fell from concurrency 16 to 64, which no single setting of
this model follows) and the 768x576 rows (measured faster than 768x448 although
they carry more tokens: a separate run).

``h200-vllm024-2026-11-30`` (what ``h200`` points at) is fitted to the
2026-11-30 run of benchmarks/gpu/loadgen.py, replayed cell by cell on one
engine (its cells reuse images, so both caches carry over); in brackets the
``h200-qwen3vl-2b`` value:
    =====================  ==========  ==============================================
    request_latency_s      18.8 ms     (24.9)
    cpu_base_s             4.7 ms      (4.7)
    cpu_decode_s_per_mpx   6.3 ms/MP   (3.3)
    cpu_preproc_s_per_mpx  51.7 ms/MP  (43.9): a fresh 1080p image 125 ms of API server
    cpu_contention         0.0021      (0.0022)
    cpu_token_s            0.089 ms    (0.14)
    ipc_s_per_ktok         7.6 ms/kt   (23.7)
    step_base_s            2.06 ms     (2.64): 64 tokens in ~140 ms, as measured
    step_seq_s             0.035 ms    (0.040)
    kv_read_s_per_ktok     0.032 ms    (0.026)
    prefill_s_per_ktok     6.6 ms      (6.9)
    vit_base_s             5.9 ms      (25.1): 46 small images/s leave no room for 25 ms each
    vit_s_per_ktok         8.5 ms      (7.8)
    vit_quad_s_per_ktok2   2.5 ms      (2.8)
    mm_cache_tokens        349525      (none): 4 GiB at 12 KiB a visual token
    =====================  ==========  ==============================================
23 of its 24 figures (TTFT p50, req/s of 12 cells) within 25% offline; the
other is 768x576 c16 TTFT (x1.37): that cell answered faster than 768x448 c16
with more pixels and tokens, which this model, whose costs grow with both,
cannot follow.

``h200-vllm024-2026-12-01`` is fitted to the third H200 lease's cells (issue #28: raw and
pre-resized desktops, terminals and a mix, with the share of TTFT before the response
headers; split_run.py): API-server constants refitted (38.2 ms/MP of preprocessing), the
split and the fit's limits in docs/benchmarks/simulator.md, "The API-server stage".

In TensorRT-LLM mode (``engine="trtllm"``) each step also records an IterationStats
entry and completions feed trtllm-serve's Prometheus series (trtllm.py); the timing
model is the same.

``time_scale`` multiplies every delay (0.1 = ten times faster than real time).
Stages pace themselves on a running schedule, so a busy event loop's lag is
caught up (up to 0.25 s) instead of accumulating. Latency metrics are in
simulated seconds.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict, deque
from dataclasses import dataclass, field, fields

from .metrics_text import E2E_BUCKETS, TTFT_BUCKETS, Histogram
from .prefix_cache import Allocation, PrefixCache
from .prompt import BLOCK_SIZE, PromptSpec


@dataclass
class SimProfile:
    name: str = "default"
    max_num_seqs: int = 1024
    max_model_len: int = 16384
    max_num_batched_tokens: int = 8192
    kv_capacity_tokens: int = 900_000
    enable_prefix_caching: bool = True
    mm_cache_items: int = 256
    mm_cache_tokens: int = 0          # processor-cache size in visual tokens (vLLM bounds it in bytes); 0: none
    api_servers: int = 1              # API-server processes (vLLM's --api-server-count), each its own cache
    # API-server CPU stage
    request_latency_s: float = 0.0    # pure delay before preprocessing (HTTP, parsing: in parallel)
    cpu_base_s: float = 0.0
    cpu_decode_s_per_mpx: float = 0.0
    cpu_preproc_s_per_mpx: float = 0.0
    cpu_contention: float = 0.0
    cpu_token_s: float = 0.0          # API-server time to stream one token (delays preprocessing)
    ipc_s_per_ktok: float = 0.0       # hand-over of processed images to the engine process
    # engine step
    step_base_s: float = 0.0
    step_seq_s: float = 0.0
    kv_read_s_per_ktok: float = 0.0
    prefill_s_per_ktok: float = 0.0
    vit_base_s: float = 0.0
    vit_s_per_ktok: float = 0.0
    vit_quad_s_per_ktok2: float = 0.0
    step_contention: float = 0.0
    # overrides
    decode_tokens_per_s: float | None = None   # single-sequence decode rate; sets step_base_s
    time_scale: float = 1.0
    description: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.api_servers, int) or self.api_servers < 1:
            raise ValueError(f"simulator profile {self.name!r}: api_servers must be an integer >= 1")
        if self.decode_tokens_per_s:
            self.step_base_s = max(0.0, 1.0 / self.decode_tokens_per_s - self.step_seq_s)

    @classmethod
    def from_dict(cls, name: str, d: dict) -> "SimProfile":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known - {"base", "speed"}
        if unknown:
            raise ValueError(f"simulator profile {name!r}: unknown keys {sorted(unknown)}")
        return cls(name=name, **{k: v for k, v in d.items() if k in known and k != "name"})


class Job:
    """One request inside the simulator."""

    _ids = itertools.count(1)

    def __init__(self, engine: "SimEngine", spec: PromptSpec, max_tokens: int, api: int = 0) -> None:
        self.id = next(self._ids)
        self.api = api              # the API server (process) that serves it
        self.engine = engine
        self.spec = spec
        self.max_tokens = max(1, int(max_tokens))
        self.state = "preprocessing"
        self.computed = 0           # prompt tokens with KV in the cache
        self.cached_tokens = 0      # prefix-cache hit at admission
        self.generated = 0
        self.alloc: Allocation | None = None
        self.encoded: set[int] = set()
        self.needs_transfer = False
        self.transfer_ktok = 0.0
        self.t_arrival = engine.now()
        self.t_ready = self.t_arrival   # scheduled time it is due at its next stage
        self.t_first: float | None = None
        self.t_admitted: float | None = None
        self.t_rendered: float | None = None   # left the API server: a stream's response headers
        self.t_queued: float | None = None     # entered the scheduler's waiting queue
        self._queue: asyncio.Queue[int] = asyncio.Queue()
        self._rendered = asyncio.Event()

    @property
    def prompt_tokens(self) -> int:
        return self.spec.num_tokens

    @property
    def aborted(self) -> bool:
        return self.state == "aborted"

    def _push(self, n: int) -> None:
        self._queue.put_nowait(n)

    async def rendered(self) -> bool:
        """Wait until the request has left the API server (True) or was aborted (False):
        when vLLM sends a streaming request's response headers."""
        await self._rendered.wait()
        return not self.aborted

    async def run(self, n: int | None = None):
        """Yield once per generated token (``n`` is accepted for compatibility)."""
        emitted = 0
        while emitted < self.max_tokens:
            got = await self._queue.get()
            if got < 0:
                return
            for _ in range(got):
                emitted += 1
                yield emitted


class _SerialStage:
    """One FIFO worker (a single-threaded process): jobs are served one at a
    time, each for ``cost(job)`` seconds plus any ``debt`` that other work on the
    same thread (token streaming) added meanwhile."""

    def __init__(self, engine: "SimEngine", name: str, cost, nxt) -> None:
        self.engine = engine
        self.name = name
        self.cost = cost
        self.nxt = nxt
        self.queue: deque[Job] = deque()
        self.debt = 0.0
        self.wake = asyncio.Event()

    def put(self, job: Job) -> None:
        job.state = self.name
        self.queue.append(job)
        self.wake.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        clock = _Pacer(loop)
        while True:
            scale = self.engine.profile.time_scale
            if not self.queue:
                self.wake.clear()
                await self.wake.wait()
                clock.idle()
                self.debt = 0.0              # streaming done while idle delayed nobody
                continue
            job = self.queue[0]
            end = await clock.sleep(self.cost(job) * scale, job.t_ready)
            while self.debt > 1e-9:
                d, self.debt = self.debt, 0.0
                end = await clock.sleep(d * scale)
            if job.state != self.name:
                continue                     # aborted meanwhile (already removed)
            self.queue.popleft()
            job.t_ready = end
            self.nxt(job)


class _ApiServer:
    """One API-server process: its FIFO worker, its processor cache (image identity ->
    visual tokens) and the requests it serves (for its contention and its streaming)."""

    def __init__(self, engine: "SimEngine", index: int) -> None:
        self.index = index
        self.stage = _SerialStage(engine, "preprocessing", engine._api_cost, engine._after_api)
        self.mm_cache: OrderedDict[bytes, int] = OrderedDict()
        self.jobs = 0


class SimEngine:
    def __init__(self, profile: SimProfile, engine: str = "vllm", trtllm_release: str = "1.2") -> None:
        self.profile = profile
        self.engine = engine
        # TensorRT-LLM mode: trtllm-serve's iteration statistics and Prometheus series (trtllm.py)
        self.trtllm = None
        if engine == "trtllm":
            from .trtllm import TrtllmSurface
            self.trtllm = TrtllmSurface(self, trtllm_release)
        elif engine != "vllm":
            raise ValueError(f"unknown simulator engine {engine!r}; known: vllm, trtllm")
        self.cache = PrefixCache(profile.kv_capacity_tokens // BLOCK_SIZE, profile.enable_prefix_caching)
        self.arriving: list[Job] = []
        self.apis = [_ApiServer(self, i) for i in range(profile.api_servers)]
        self._next_api = itertools.cycle(range(profile.api_servers))
        self._conn_api: OrderedDict[object, int] = OrderedDict()   # connection -> its API server
        self.ipc = _SerialStage(self, "transfer", self._ipc_cost, self._enqueue)
        self.waiting: deque[Job] = deque()
        self.running: list[Job] = []
        self._wake_step: asyncio.Event | None = None
        self._tasks: list[asyncio.Task] = []
        self.admitted_in_step = self.completed_in_step = 0
        self.reset_stats()

    # -- counters -------------------------------------------------------------
    def reset_stats(self) -> None:
        self.finished = 0
        self.aborted = 0
        self.received = 0
        self.rejected = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.cache.queries = self.cache.hits = 0
        self.mm_queries = self.mm_hits = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.queue_time = Histogram(E2E_BUCKETS)
        self.prefill_time = Histogram(E2E_BUCKETS)
        if getattr(self, "trtllm", None) is not None:
            self.trtllm.reset()

    @staticmethod
    def now() -> float:
        return asyncio.get_running_loop().time()

    @property
    def preprocessing(self) -> int:
        return len(self.arriving) + sum(len(a.stage.queue) for a in self.apis) + len(self.ipc.queue)

    def reset_caches(self) -> None:
        """Drop cached prefix blocks and every API server's processor cache."""
        self.cache.reset()
        for a in self.apis:
            a.mm_cache.clear()

    def api_for(self, connection: object | None) -> int:
        """The API server of a connection: dealt in turn to new connections (the
        processes share one listening socket), kept for its later requests."""
        if connection is None:
            return next(self._next_api)
        got = self._conn_api.get(connection)
        if got is None:
            got = self._conn_api[connection] = next(self._next_api)
            while len(self._conn_api) > 4096:
                self._conn_api.popitem(last=False)
        else:
            self._conn_api.move_to_end(connection)
        return got

    @property
    def in_system(self) -> int:
        return self.preprocessing + len(self.waiting) + len(self.running)

    def stats(self) -> dict:
        return {"running": len(self.running), "waiting": len(self.waiting),
                "preprocessing": self.preprocessing, "finished": self.finished,
                "aborted": self.aborted, "received": self.received, "rejected": self.rejected,
                "prompt_tokens": self.prompt_tokens_total, "generation_tokens": self.generation_tokens_total,
                "prefix_cache_queries": self.cache.queries, "prefix_cache_hits": self.cache.hits,
                "prefix_cache_blocks": self.cache.cached_blocks(), "prefix_cache_evictions": self.cache.evictions,
                "kv_cache_usage": round(self.cache.usage(), 6), "profile": self.profile.name,
                "time_scale": self.profile.time_scale, "api_servers": len(self.apis),
                "preprocessing_per_api_server": [len(a.stage.queue) for a in self.apis],
                "mm_cache_queries": self.mm_queries, "mm_cache_hits": self.mm_hits}

    def render_metrics(self, model: str) -> bytes:
        """vLLM mode's /metrics (Prometheus text)."""
        from .metrics_text import render
        return render(self, model)

    # -- request lifecycle ----------------------------------------------------
    def submit(self, spec: PromptSpec, max_tokens: int, connection: object | None = None) -> Job:
        """Queue a request (call from the event loop that serves it); ``connection`` names
        the client connection it came on (its API server), None offline."""
        self._ensure_tasks()
        self.received += 1
        if self.trtllm is not None:
            self.trtllm.submitted()
        job = Job(self, spec, max_tokens, self.api_for(connection))
        self.apis[job.api].jobs += 1
        delay = self.profile.request_latency_s * self.profile.time_scale
        job.t_ready = job.t_arrival + delay
        if delay > 0:
            job.state = "arriving"
            self.arriving.append(job)
            asyncio.get_running_loop().call_at(job.t_ready, self._arrive, job)
        else:
            self.apis[job.api].stage.put(job)
        return job

    def _arrive(self, job: Job) -> None:
        if job.state == "arriving":
            self.arriving.remove(job)
            self.apis[job.api].stage.put(job)

    def _after_api(self, job: Job) -> None:
        job.t_rendered = job.t_ready
        job._rendered.set()
        if job.needs_transfer:
            self.ipc.put(job)
        else:
            self._enqueue(job)

    def _enqueue(self, job: Job) -> None:
        job.state = "waiting"
        job.t_queued = self.now()
        self.waiting.append(job)
        self._wake_step.set()

    def abort(self, job: Job) -> None:
        """The client went away: drop the request wherever it is and free its slot."""
        if job.state in ("done", "aborted"):
            return
        prev, job.state = job.state, "aborted"
        self.aborted += 1
        self.apis[job.api].jobs -= 1
        job._rendered.set()
        if prev == "arriving":
            _remove(self.arriving, job)
        elif prev == "preprocessing":
            _remove(self.apis[job.api].stage.queue, job)
        elif prev == "transfer":
            _remove(self.ipc.queue, job)
        elif prev == "waiting":
            _remove(self.waiting, job)
        elif prev == "running":
            self._release(job)
        job._push(-1)
        if self._wake_step:
            self._wake_step.set()

    def _release(self, job: Job) -> None:
        if job in self.running:
            self.running.remove(job)
        if job.alloc is not None:
            self.cache.release(job.alloc)
            job.alloc = None

    def _ensure_tasks(self) -> None:
        if self._tasks and not any(t.done() for t in self._tasks):
            return
        for t in self._tasks:
            t.cancel()
        self._wake_step = asyncio.Event()
        for a in self.apis:
            a.stage.wake = asyncio.Event()
        self.ipc.wake = asyncio.Event()
        self._tasks = [*(asyncio.ensure_future(a.stage.run()) for a in self.apis),
                       asyncio.ensure_future(self.ipc.run()), asyncio.ensure_future(self._step_loop())]

    def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        self._tasks = []

    # -- stage 1: API server (CPU) and hand-over to the engine process ---------
    def _api_cost(self, job: Job) -> float:
        p = self.profile
        srv = self.apis[job.api]
        cache = srv.mm_cache
        # one API server: a hit is found in the engine core's mirror cache too and only its
        # hash travels; several: each keeps its own "processor only" cache, the tensors travel
        hit_travels = len(self.apis) > 1
        cost = p.cpu_base_s
        job.needs_transfer = False
        for img in job.spec.images:
            cost += p.cpu_decode_s_per_mpx * img.decode_mpx      # a video: every frame the loader grabs
            self.mm_queries += 1
            if img.digest in cache:
                cache.move_to_end(img.digest)
                self.mm_hits += 1
                if not hit_travels:
                    continue
            else:
                cost += p.cpu_preproc_s_per_mpx * img.preproc_mpx   # a video: its sampled frames
                cache[img.digest] = img.tokens
                size = sum(cache.values()) if p.mm_cache_tokens else 0
                while len(cache) > p.mm_cache_items or size > p.mm_cache_tokens > 0:
                    size -= cache.popitem(last=False)[1]
            job.transfer_ktok += img.tokens / 1000.0
            job.needs_transfer = p.ipc_s_per_ktok > 0
        return cost * (1.0 + p.cpu_contention * max(0, srv.jobs - 1))

    def _ipc_cost(self, job: Job) -> float:
        return self.profile.ipc_s_per_ktok * job.transfer_ktok

    # -- stage 2: engine steps ------------------------------------------------
    def _vit_cost(self, job: Job, lo: int, hi: int) -> float:
        p = self.profile
        cost = 0.0
        for i, img in enumerate(job.spec.images):
            if i in job.encoded or img.start + img.tokens <= job.cached_tokens:
                continue
            if img.start < hi and img.start + img.tokens > lo:
                job.encoded.add(i)
                kt = img.tokens / 1000.0
                kg = kt / img.groups      # a video's frame pairs attend within themselves
                cost += p.vit_base_s + p.vit_s_per_ktok * kt + p.vit_quad_s_per_ktok2 * kg * kt
        return cost

    def _schedule(self) -> tuple[list[Job], list[tuple[Job, int]], float]:
        """Pick this step's work: (decoding jobs, prefill chunks, step seconds)."""
        p = self.profile
        decode = [j for j in self.running if j.computed >= j.spec.num_tokens]
        budget = max(1, p.max_num_batched_tokens - len(decode))
        chunks: list[tuple[Job, int]] = []
        vit = 0.0
        for j in self.running:
            if j.computed < j.spec.num_tokens and budget > 0:
                n = min(budget, j.spec.num_tokens - j.computed)
                vit += self._vit_cost(j, j.computed, j.computed + n)
                chunks.append((j, n))
                budget -= n
        while self.waiting and budget > 0 and len(self.running) < p.max_num_seqs:
            j = self.waiting[0]
            got = self.cache.admit(j.spec.block_hashes, j.spec.num_tokens, j.max_tokens)
            if got is None:
                break                        # KV pool full: wait for someone to finish
            self.waiting.popleft()
            j.alloc, j.cached_tokens = got
            j.computed = j.cached_tokens
            j.t_admitted = self.now()
            if j.t_queued is not None:
                self.queue_time.observe((j.t_admitted - j.t_queued) / self.profile.time_scale)
            self.admitted_in_step += 1
            j.state = "running"
            self.running.append(j)
            n = min(budget, j.spec.num_tokens - j.computed)
            vit += self._vit_cost(j, j.computed, j.computed + n)
            chunks.append((j, n))
            budget -= n
        ctx = sum(j.spec.num_tokens + j.generated for j in decode)
        pre = sum(n for _, n in chunks)
        seqs = len(decode) + len(chunks)
        if not seqs:
            return decode, chunks, 0.0
        dt = (p.step_base_s + p.step_seq_s * seqs + p.kv_read_s_per_ktok * ctx / 1000.0
              + p.prefill_s_per_ktok * pre / 1000.0 + vit)
        return decode, chunks, dt * (1.0 + p.step_contention * max(0, self.in_system - 1))

    def _emit(self, job: Job) -> None:
        job.generated += 1
        if job.generated == 1:
            job.t_first = self.now()
            self.ttft.observe((job.t_first - job.t_arrival) / self.profile.time_scale)
            if job.t_admitted is not None:
                self.prefill_time.observe((job.t_first - job.t_admitted) / self.profile.time_scale)
        if job.generated % BLOCK_SIZE == 0 and job.alloc is not None:
            self.cache.grow(job.alloc)
        job._push(1)
        self.apis[job.api].stage.debt += self.profile.cpu_token_s
        if job.generated >= job.max_tokens:
            job.state = "done"
            self.apis[job.api].jobs -= 1
            self._release(job)
            self.finished += 1
            self.completed_in_step += 1
            self.prompt_tokens_total += job.spec.num_tokens
            self.generation_tokens_total += job.generated
            self.e2e.observe((self.now() - job.t_arrival) / self.profile.time_scale)
            if self.trtllm is not None:
                self.trtllm.finished(job, self.now(), self.profile.time_scale)

    async def _step_loop(self) -> None:
        loop = asyncio.get_running_loop()
        clock = _Pacer(loop)
        while True:
            if not self.running and not self.waiting:
                self._wake_step.clear()
                await self._wake_step.wait()
                clock.idle()
                continue
            running_before = len(self.running)
            self.admitted_in_step = self.completed_in_step = 0
            decode, chunks, dt = self._schedule()
            if not decode and not chunks:
                # admitted nothing (KV pool full and nobody running): wait for a change
                self._wake_step.clear()
                await self._wake_step.wait()
                continue
            await clock.sleep(dt * self.profile.time_scale,
                              min((j.t_ready for j, _ in chunks), default=None))
            for j in decode:
                if j.state == "running":
                    self._emit(j)
            for j, n in chunks:
                if j.state != "running":
                    continue
                j.computed += n
                if j.computed >= j.spec.num_tokens:
                    self.cache.commit(j.alloc, j.spec.block_hashes)
                    self._emit(j)
            if self.trtllm is not None:
                # counted as the PyTorch executor does: requests active when the step began
                # (those admitted in it included), the queue as it is when the step ends
                self.trtllm.step(running=running_before + self.admitted_in_step, waiting=len(self.waiting),
                                 admitted=self.admitted_in_step, completed=self.completed_in_step,
                                 decode=len(decode), prefill=len(chunks), prefill_tokens=sum(n for _, n in chunks),
                                 latency_s=dt, now=self.now())


class _Pacer:
    """Sleeps on a running schedule. A step that overran (a busy event loop) is
    absorbed by shortening the next sleeps, up to ``max_debt_s`` behind; after
    an idle spell the schedule resumes at the time the work was due
    (``not_before``: when the previous stage was scheduled to hand it over), so
    wake-up delays do not add up from stage to stage."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_debt_s: float = 0.25) -> None:
        self.loop = loop
        self.t: float | None = None
        self.max_debt = max_debt_s

    def idle(self) -> None:
        self.t = None

    async def sleep(self, dt: float, not_before: float | None = None) -> float:
        """Sleep until the scheduled end of ``dt`` of work; returns that time."""
        now = self.loop.time()
        start = self.t if self.t is not None else not_before
        start = now if start is None else max(start, not_before or start, now - self.max_debt)
        deadline = start + dt
        await asyncio.sleep(max(0.0, deadline - now))
        self.t = deadline
        return deadline


def _remove(q: deque, job: Job) -> None:
    try:
        q.remove(job)
    except ValueError:
        pass
