"""shared.lru.ExpiringCache: entries live their TTL, the map never holds more than its bound,
and expired entries leave as new ones come (the caches of the registry's definitions, the
dispatcher's tool timeouts and its loop-guard memory)."""

from __future__ import annotations

import pytest

from shared.lru import ExpiringCache


def test_an_entry_lives_its_ttl_and_a_put_renews_it() -> None:
    cache: ExpiringCache[str, int] = ExpiringCache(ttl_s=10, maxsize=4)
    cache.put("a", 1, now=0)
    assert cache.get("a", now=9.9) == 1
    assert cache.get("a", now=10) is None
    cache.put("a", 2, now=5)
    assert cache.get("a", now=14) == 2
    assert cache.get("missing", now=0) is None


def test_expired_entries_leave_as_new_ones_come_and_the_bound_holds() -> None:
    cache: ExpiringCache[int, int] = ExpiringCache(ttl_s=10, maxsize=3)
    for key in range(3):
        cache.put(key, key, now=key)
    cache.put(3, 3, now=3)  # over the bound: the oldest (0) goes
    assert len(cache) == 3 and cache.get(0, now=3) is None and cache.get(1, now=3) == 1
    cache.put(1, 1, now=4)  # renewed: moves to the end, expires last
    cache.put(9, 9, now=12.5)  # 2 (expired at 12) leaves; 3 (13) and 1 (14) stay
    assert len(cache) == 3 and cache.get(1, now=12.5) == 1 and cache.get(3, now=12.5) == 3
    cache.pop(1)
    cache.pop(1)  # popping a missing key is no error
    assert len(cache) == 2
    cache.clear()
    assert len(cache) == 0


def test_a_bound_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ExpiringCache(ttl_s=1, maxsize=0)
