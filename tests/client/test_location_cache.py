"""The location cache holds what its last `ttl_s` of lookups touched, not `capacity`
expired entries (bench/soak.py: 8 clients' caches filling with dead entries were the
driver's RSS growth). A fake clock: no sleeping, no timing."""

from __future__ import annotations

from kvstore.client.locations import LocationCache
from kvstore.types import Location, Tier

TTL_S = 2.0
LEASE_S = 5.0  # leased longer than ttl_s: an entry lives ttl_s


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def loc(i: int) -> Location:
    return Location("n0", Tier.DRAM, "dram0", i * 4096, 4096)


def test_expired_entries_are_swept_as_new_ones_come() -> None:
    clock = Clock()
    cache = LocationCache(16384, TTL_S, clock)
    for i in range(10_000):  # one lookup every half second: 4 of them within ttl_s
        cache.put(f"k{i}", 4096, 1 + i, [loc(i)], LEASE_S)
        clock.now += 0.5
        assert len(cache) <= 4
    assert cache.get("k9999") is not None and cache.get("k0") is None


def test_entries_touched_within_ttl_are_kept() -> None:
    clock = Clock()
    cache = LocationCache(16384, TTL_S, clock)
    for i in range(100):  # a burst: all live
        cache.put(f"k{i}", 4096, 1 + i, [loc(i)], LEASE_S)
    assert len(cache) == 100
    clock.now += TTL_S / 2
    assert cache.get("k0") is not None  # touched: now the most recently used
    cache.put("late", 4096, 7, [loc(100)], LEASE_S)
    assert len(cache) == 101  # nothing had expired yet
    clock.now += TTL_S / 2  # the burst expires now (k0's touch did not extend its life)
    cache.put("later", 4096, 8, [loc(101)], LEASE_S)
    assert len(cache) == 2 and cache.get("late") is not None and cache.get("k5") is None


def test_capacity_still_bounds_a_burst() -> None:
    clock = Clock()
    cache = LocationCache(64, TTL_S, clock)
    for i in range(1000):
        cache.put(f"k{i}", 4096, 1 + i, [loc(i)], LEASE_S)
    assert len(cache) == 64 and cache.get("k999") is not None and cache.get("k0") is None
