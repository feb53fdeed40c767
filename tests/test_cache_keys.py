"""L3 cache building blocks: canonical keys, policy, normalisation, guard, stores."""

from __future__ import annotations

import time

import orjson
import pytest

from vlm_gateway.config import CacheConfig
from vlm_gateway.stages.cache import guard
from vlm_gateway.stages.cache.keys import build_keys
from vlm_gateway.stages.cache.normalize import normalize_question
from vlm_gateway.stages.cache.policy import decide, storable
from vlm_gateway.stages.cache.store import TieredStore
from vlm_gateway.core.request import parse_chat


def chat(messages, headers=None, scope="anonymous", hashes=None, **params):
    body = {"model": "m", "temperature": 0, "messages": messages, **params}
    req = parse_chat(orjson.dumps(body), headers or {})
    req.cache_scope = scope
    for p, h in zip(req.images, hashes or []):
        p.content_hash = h
    return req


def user(text, image=None):
    if image is None:
        return {"role": "user", "content": text}
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}},
                                        {"type": "text", "text": text}]}


def test_string_content_and_single_text_part_are_the_same_prompt():
    a = build_keys(chat([user("hi there")]))
    b = build_keys(chat([{"role": "user", "content": [{"type": "text", "text": "hi there"}]}]))
    assert a.exact == b.exact


def test_image_is_identified_by_content_hash():
    same1 = build_keys(chat([user("what?", "http://a/x.png")], hashes=["h1"]))
    same2 = build_keys(chat([user("what?", "http://b/other-url.png")], hashes=["h1"]))
    other = build_keys(chat([user("what?", "http://a/x.png")], hashes=["h2"]))
    assert same1.exact == same2.exact and same1.partition == same2.partition
    assert other.exact != same1.exact and other.partition != same1.partition
    assert other.normalized != same1.normalized


def test_without_content_hash_the_url_identifies_the_image():
    a = build_keys(chat([user("what?", "data:image/png;base64,AAAA")]))
    b = build_keys(chat([user("what?", "data:image/png;base64,AAAB")]))
    assert a.exact != b.exact and a.partition != b.partition


def test_image_detail_and_policy_header_are_part_of_the_key():
    base = chat([user("what?", "http://a/x.png")], hashes=["h"])
    low = chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://a/x.png",
                                                                                  "detail": "low"}},
                                             {"type": "text", "text": "what?"}]}], hashes=["h"])
    pol = chat([user("what?", "http://a/x.png")], headers={"x-vlm-gateway-image-policy": "448"}, hashes=["h"])
    keys = {build_keys(r).exact for r in (base, low, pol)}
    assert len(keys) == 3


def test_earlier_turns_and_system_prompt_matter():
    q = user("and the second?")
    a = build_keys(chat([user("list the rows"), {"role": "assistant", "content": "row A, row B"}, q]))
    b = build_keys(chat([user("list the columns"), {"role": "assistant", "content": "col A, col B"}, q]))
    c = build_keys(chat([{"role": "system", "content": "be terse"}, q]))
    d = build_keys(chat([q]))
    assert len({a.exact, b.exact, c.exact, d.exact}) == 4
    assert len({a.partition, b.partition, c.partition, d.partition}) == 4


@pytest.mark.parametrize("param", [{"temperature": 0.0001}, {"top_p": 0.5}, {"top_k": 5}, {"max_tokens": 7},
                                   {"seed": 3}, {"stop": ["\n"]}, {"n": 2}, {"logprobs": True},
                                   {"response_format": {"type": "json_object"}},
                                   {"tools": [{"type": "function", "function": {"name": "f"}}]},
                                   {"tool_choice": "none"}, {"presence_penalty": 0.1},
                                   {"repetition_penalty": 1.1}])
def test_every_output_changing_parameter_is_in_the_key(param):
    base = build_keys(chat([user("q")]))
    body = {"temperature": 0, **param}
    other = build_keys(chat([user("q")], **body))
    assert other.exact != base.exact and other.partition != base.partition


def test_neutral_parameters_are_not_in_the_key():
    base = build_keys(chat([user("q")]))
    other = build_keys(chat([user("q")], stream=True, stream_options={"include_usage": True}, user="u-42"))
    assert other.exact == base.exact


def test_tenant_scope_separates_every_key():
    a = build_keys(chat([user("what is the total?", "http://x")], scope="team-a", hashes=["h"]))
    b = build_keys(chat([user("what is the total?", "http://x")], scope="team-b", hashes=["h"]))
    assert a.exact != b.exact and a.partition != b.partition and a.normalized != b.normalized


def test_partition_leaves_out_only_the_last_question():
    a = build_keys(chat([user("What's the total?", "http://x")], hashes=["h"]))
    b = build_keys(chat([user("what is the TOTAL", "http://x")], hashes=["h"]))
    c = build_keys(chat([user("What is the tax?", "http://x")], hashes=["h"]))
    assert a.exact != b.exact
    assert a.partition == b.partition == c.partition
    assert a.normalized == b.normalized != c.normalized


def test_no_question_level_when_last_message_is_not_user_text():
    k = build_keys(chat([user("hi"), {"role": "assistant", "content": "hello"}]))
    assert k.exact and not k.partition and not k.normalized
    k = build_keys(chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]))
    assert not k.normalized


def test_normalize_question_keeps_meaning_words():
    assert normalize_question("Hey, can you please tell me what's the TOTAL on this receipt?") == \
        normalize_question("what is the total on this receipt")
    assert normalize_question("Isn't it open?") == "is not it open"
    assert normalize_question("Costs $1,000.50 or 5%?") == "costs $ 1000.50 or 5 %"
    assert normalize_question("row 2") != normalize_question("row 3")
    assert normalize_question("the 2nd row") == "2nd row"


@pytest.mark.parametrize("a,b,reason", [
    ("What is the total?", "What is the tax?", "content"),
    ("Is the door open?", "Isn't the door open?", "negation"),
    ("What was revenue in 2022?", "What was revenue in 2023?", "year"),
    ("What is in row 3?", "What is in row 4?", "number"),
    ("What is on the left?", "What is on the right?", "direction"),
    ("Is the dog left of the cat?", "Is the cat left of the dog?", "order"),
    ("What did Alice pay?", "What did Bob pay?", "entity"),
    ("What is in row 3?", "Is it in row 3?", "content"),
])
def test_guard_rejects_near_misses(a, b, reason):
    v = guard.check(guard.content_words(a, a), guard.content_words(b, b))
    assert not v.ok and v.reason == reason


@pytest.mark.parametrize("a,b", [
    ("What is the total on this receipt?", "On this receipt, what is the total?"),
    ("How many cats are there?", "Count the cats in the picture."),
    ("What is in the second row?", "What is in the 2nd row?"),
    ("What colour is the car?", "What color is the car in the photo?"),
    ("What is the date on the invoice?", "Could you tell me the date on the invoice?"),
])
def test_guard_accepts_trivial_variants(a, b):
    assert guard.check(guard.content_words(a, a), guard.content_words(b, b)).ok


def test_policy_defaults_and_client_control():
    cfg = CacheConfig()
    det = chat([user("q")])
    hot = chat([user("q")], temperature=0.7)
    seeded = chat([user("q")], temperature=0.7, seed=1)
    assert decide(det, cfg) == (True, True) and decide(seeded, cfg) == (True, True)
    assert decide(hot, cfg) == (False, False)
    on = chat([user("q")], headers={"x-vlm-gateway-cache-mode": "on"}, temperature=0.7)
    off = chat([user("q")], headers={"x-vlm-gateway-cache-mode": "off"})
    assert decide(on, cfg) == (True, True) and decide(off, cfg) == (False, False)
    assert decide(chat([user("q")], headers={"cache-control": "no-cache"}), cfg) == (False, True)
    assert decide(chat([user("q")], headers={"cache-control": "no-store"}), cfg) == (False, False)
    locked = CacheConfig(client_control=False)
    assert decide(on, locked) == (False, False) and decide(off, locked) == (True, True)
    assert decide(hot, CacheConfig(mode="always")) == (True, True)
    assert decide(det, CacheConfig(mode="off")) == (False, False)


def test_only_complete_answers_are_storable():
    def comp(fr, **extra):
        return {"object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant",
                                                                                   "content": "x"},
                                                          "finish_reason": fr}], **extra}
    req = chat([user("q")])
    limited = chat([user("q")], max_tokens=5)
    assert storable(req, comp("stop")) and storable(req, comp("tool_calls"))
    assert not storable(req, comp("length"))  # cut by the engine's own limit
    assert storable(limited, comp("length"))  # complete for the max_tokens in the key
    for bad in ("abort", "content_filter", "error", None):
        assert not storable(limited, comp(bad))
    assert not storable(req, {"object": "chat.completion", "choices": []})
    assert not storable(req, comp("stop", error={"message": "x"}))


def test_local_store_is_bounded_by_bytes_and_ttl():
    s = TieredStore(max_bytes=1000, ttl_s=60, max_entry_bytes=10_000)
    for i in range(10):
        s.put_local(f"k{i}", {"i": i}, b"v" * 300, time.time() + 60)
    assert len(s) == 3 and s.bytes <= 1000
    assert s.get_local("k9") == {"i": 9} and s.get_local("k0") is None
    s.get_local("k7")  # touched: k8 is now the oldest
    s.put_local("k10", {"i": 10}, b"v" * 300, time.time() + 60)
    assert s.get_local("k8") is None and s.get_local("k7") is not None
    s.put_local("old", {"x": 1}, b"v" * 10, time.time() - 1)
    assert s.get_local("old") is None
    s.put_local("huge", {"x": 1}, b"v" * 5000, time.time() + 60)
    assert s.get_local("huge") is None


def test_entry_size_cap():
    t = TieredStore(10_000, 60, max_entry_bytes=200)
    assert t.encode({"c": "x" * 10}) is not None
    assert t.encode({"c": "x" * 500}) is None
