"""Simulated engine: scheduling and timing (minimal model; see profiles)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from ...vision_tokens import estimate_text_tokens


@dataclass
class SimProfile:
    name: str = "default"
    max_num_seqs: int = 64
    max_model_len: int = 16384
    ttft_base_s: float = 0.02
    prefill_tokens_per_s: float = 50000.0
    decode_tokens_per_s: float = 100.0
    time_scale: float = 1.0


@dataclass
class Job:
    prompt_tokens: int
    cached_tokens: int = 0
    generated: int = 0
    engine: "SimEngine" = field(default=None, repr=False)
    aborted: bool = False

    async def run(self, n: int):
        e = self.engine
        p = e.profile
        e.waiting += 1
        try:
            await e.slots.acquire()
        finally:
            e.waiting -= 1
        e.running += 1
        try:
            prefill = (p.ttft_base_s + (self.prompt_tokens - self.cached_tokens) / p.prefill_tokens_per_s)
            await asyncio.sleep(prefill * p.time_scale)
            dt = p.time_scale / p.decode_tokens_per_s
            for _ in range(n):
                self.generated += 1
                yield self.generated
                await asyncio.sleep(dt)
            e.finished += 1
            e.prompt_tokens_total += self.prompt_tokens
            e.generation_tokens_total += self.generated
        finally:
            e.running -= 1
            e.slots.release()


class SimEngine:
    def __init__(self, profile: SimProfile, engine: str = "vllm") -> None:
        self.profile = profile
        self.engine = engine
        self.slots = asyncio.Semaphore(profile.max_num_seqs)
        self.reset_stats()

    def reset_stats(self) -> None:
        self.running = getattr(self, "running", 0)
        self.waiting = getattr(self, "waiting", 0)
        self.finished = 0
        self.aborted = 0
        self.received = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0

    def submit(self, body: dict) -> Job:
        self.received += 1
        text = body.get("prompt") if isinstance(body.get("prompt"), str) else str(body.get("messages", ""))
        return Job(prompt_tokens=estimate_text_tokens(text), engine=self)

    def abort(self, job: Job) -> None:
        if not job.aborted:
            job.aborted = True
            self.aborted += 1

    def stats(self) -> dict:
        return {"running": self.running, "waiting": self.waiting, "finished": self.finished,
                "aborted": self.aborted, "received": self.received}

    def render_metrics(self, model: str) -> bytes:
        lbl = f'{{model_name="{model}"}}'
        lines = [
            f"vllm:num_requests_running{lbl} {self.running}",
            f"vllm:num_requests_waiting{lbl} {self.waiting}",
            f"vllm:prompt_tokens_total{lbl} {self.prompt_tokens_total}",
            f"vllm:generation_tokens_total{lbl} {self.generation_tokens_total}",
        ]
        return ("\n".join(lines) + "\n").encode()
