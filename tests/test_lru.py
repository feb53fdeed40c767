"""vlm_gateway/lru.py: the one bounded map (entries, bytes, TTL on an injectable clock)."""

from vlm_gateway.lru import LRU

from transport import ManualClock


def test_least_recently_used_goes_first():
    m = LRU(max_entries=2)
    m.put("a", 1)
    m.put("b", 2)
    assert m.get("a") == 1          # a is now the most recent
    m.put("c", 3)
    assert list(m.keys()) == ["a", "c"] and m.get("b") is None


def test_bounded_by_bytes_and_never_holds_a_value_larger_than_the_bound():
    m = LRU(max_bytes=10, size=len)
    m.put("a", b"x" * 4)
    m.put("b", b"x" * 4)
    m.put("c", b"x" * 4)            # 12 > 10: a goes
    assert list(m.keys()) == ["b", "c"] and m.bytes == 8
    m.put("d", b"x" * 11)
    assert m.get("d") is None and m.bytes == 8
    m.put("b", b"x")                # replacing counts the new size only
    assert m.bytes == 5 and m.pop("b") == b"x" and m.bytes == 4
    assert m.clear() == 1 and m.bytes == 0 and len(m) == 0


def test_entries_expire_on_the_clock():
    clock = ManualClock()
    m = LRU(ttl_s=10, clock=clock)
    m.put("a", 1)
    m.put("b", 2, ttl_s=0)          # this one never expires
    clock.advance(9.9)
    assert m.get("a") == 1
    clock.advance(0.2)
    assert m.get("a") is None and "a" not in m and len(m) == 1 and m.get("b") == 2
