"""Unit tests of the simulator's prompt model and block-hash prefix cache."""

from __future__ import annotations

import base64

import pytest

from vlm_gateway.backends.sim.prefix_cache import PrefixCache
from vlm_gateway.backends.sim.prompt import BLOCK_SIZE, PromptError, build_prompt, synthetic_prompt
from vlm_gateway.backends.sim.workload import make_jpeg


def chat(uri: str, text: str = "hi") -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": uri}},
                                                      {"type": "text", "text": text}]}]}


def data_uri(w: int, h: int, seed: int) -> str:
    return "data:image/jpeg;base64," + base64.b64encode(make_jpeg(w, h, seed)).decode()


def test_prompt_tokens_match_measured_vllm():
    # vLLM 0.24 usage.prompt_tokens with the prompt "hi": 13 text tokens + visual + 2 markers
    for (w, h), tokens in {(1920, 1080): 2055, (768, 448): 351, (500, 300): 159}.items():
        assert build_prompt(chat(data_uri(w, h, 1))).num_tokens == tokens
    assert build_prompt({"messages": [{"role": "user", "content": "hi"}]}).num_tokens == 13


def test_bad_image_is_a_prompt_error():
    with pytest.raises(PromptError):
        build_prompt(chat("data:image/jpeg;base64," + base64.b64encode(b"not an image").decode()))


def test_shared_prefix_hits_and_counts_tokens_like_vllm():
    cache = PrefixCache(10_000)
    a = build_prompt(chat(data_uri(1920, 1080, 1), "first question"))
    b = build_prompt(chat(data_uri(1920, 1080, 1), "a different question that is longer"))
    alloc, hit = cache.admit(a.block_hashes, a.num_tokens)
    assert hit == 0
    cache.commit(alloc, a.block_hashes)
    cache.release(alloc)
    alloc_b, hit_b = cache.admit(b.block_hashes, b.num_tokens)
    # the image ends at token 3 + 2042 = 2045: every full block before the question text hits
    assert hit_b == (3 + 2042) // BLOCK_SIZE * BLOCK_SIZE
    assert cache.queries == a.num_tokens + b.num_tokens
    assert cache.hits == hit_b


def test_different_image_of_same_size_misses():
    cache = PrefixCache(10_000)
    a = build_prompt(chat(data_uri(1920, 1080, 1)))
    b = build_prompt(chat(data_uri(1920, 1080, 2)))
    assert a.num_tokens == b.num_tokens
    alloc, _ = cache.admit(a.block_hashes, a.num_tokens)
    cache.commit(alloc, a.block_hashes)
    cache.release(alloc)
    _, hit = cache.admit(b.block_hashes, b.num_tokens)
    assert hit == 0          # the first block already covers image tokens


def test_identical_prompt_recomputes_last_block():
    cache = PrefixCache(10_000)
    a = synthetic_prompt("hi", [(1920, 1080, b"x")])
    alloc, _ = cache.admit(a.block_hashes, a.num_tokens)
    cache.commit(alloc, a.block_hashes)
    cache.release(alloc)
    _, hit = cache.admit(a.block_hashes, a.num_tokens)
    assert hit == (a.num_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE
    assert hit < a.num_tokens


def test_lru_eviction_on_kv_capacity():
    prompts = [synthetic_prompt("hi", [(768, 448, b"img%d" % i)]) for i in range(4)]
    blocks = -(-prompts[0].num_tokens // BLOCK_SIZE)
    cache = PrefixCache(blocks * 3)               # room for three prompts
    for p in prompts[:3]:
        alloc, _ = cache.admit(p.block_hashes, p.num_tokens)
        cache.commit(alloc, p.block_hashes)
        cache.release(alloc)
    # touch prompt 0 so prompt 1 is the least recently used
    alloc, hit = cache.admit(prompts[0].block_hashes, prompts[0].num_tokens)
    assert hit > 0
    cache.release(alloc)
    alloc, _ = cache.admit(prompts[3].block_hashes, prompts[3].num_tokens)   # forces eviction
    cache.commit(alloc, prompts[3].block_hashes)
    cache.release(alloc)
    full = (prompts[0].num_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE
    # the 3 never-cached partial blocks were free; the rest came from prompt 1, tail first
    assert cache.evictions == blocks - 3
    assert cache.match(prompts[1].block_hashes, prompts[1].num_tokens) == 2 * BLOCK_SIZE
    assert cache.match(prompts[0].block_hashes, prompts[0].num_tokens) == full
    assert cache.match(prompts[2].block_hashes, prompts[2].num_tokens) == full
    assert cache.match(prompts[3].block_hashes, prompts[3].num_tokens) == full


def test_blocks_in_use_are_never_evicted_and_pool_refuses_when_full():
    p1 = synthetic_prompt("hi", [(768, 448, b"a")])
    p2 = synthetic_prompt("hi", [(768, 448, b"b")])
    blocks = -(-p1.num_tokens // BLOCK_SIZE)
    cache = PrefixCache(blocks + 2)
    held, _ = cache.admit(p1.block_hashes, p1.num_tokens)
    assert cache.admit(p2.block_hashes, p2.num_tokens) is None
    assert cache.usage() == pytest.approx(blocks / (blocks + 2))
    cache.commit(held, p1.block_hashes)
    cache.release(held)
    assert cache.usage() == 0
    assert cache.admit(p2.block_hashes, p2.num_tokens) is not None
