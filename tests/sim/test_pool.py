"""Pooled store vs local caches: placement, global LRU demotion/eviction, remote prefixes."""

from __future__ import annotations

import pytest

from kvstore.errors import BadRequestError
from kvstore.sim.cache import TierCapacity
from kvstore.sim.pool import LocalCaches, PooledStore
from kvstore.types import Tier


def test_pooled_places_on_writer_then_roomiest_then_global_lru() -> None:
    pool = PooledStore({"a": TierCapacity(2), "b": TierCapacity(2)})
    pool.insert("a", [1, 2, 3])  # a is full after 1, 2: 3 goes to b
    assert pool.where == {1: ("a", Tier.DRAM), 2: ("a", Tier.DRAM), 3: ("b", Tier.DRAM)}
    pool.insert("b", [1])  # a hit only refreshes block 1 where it lives
    pool.insert("b", [4, 5])  # b has room for 4; then evict global LRU (2, on a) for 5
    assert pool.where == {
        1: ("a", Tier.DRAM),
        3: ("b", Tier.DRAM),
        4: ("b", Tier.DRAM),
        5: ("a", Tier.DRAM),
    }
    assert list(pool.lru[Tier.DRAM]) == [3, 1, 4, 5]
    assert pool.evictions == 1
    pool.check_integrity()


def test_pooled_demotes_to_ssd_and_promotes_back() -> None:
    pool = PooledStore({"a": TierCapacity(1, 1), "b": TierCapacity(1, 0)})
    pool.insert("a", [1, 2, 3])  # 1 -> a, 2 -> b, 3 evicts 1 to a's SSD and takes a's DRAM
    assert pool.where == {1: ("a", Tier.SSD), 2: ("b", Tier.DRAM), 3: ("a", Tier.DRAM)}
    hit = pool.prefix("b", [1, 2, 3, 9])
    assert (hit.local, hit.remote) == ({Tier.DRAM: 1, Tier.SSD: 0}, {Tier.DRAM: 1, Tier.SSD: 1})
    assert pool.match([3, 1])["a"].tier_blocks == {Tier.DRAM: 1, Tier.SSD: 1}
    pool.insert("b", [1])  # SSD hit: back to DRAM; global LRU DRAM block (2) goes down
    assert pool.where[1][1] == Tier.DRAM
    assert pool.where[2] == ("a", Tier.SSD)
    pool.check_integrity()


def test_match_is_per_node_leading_run() -> None:
    pool = PooledStore({"a": TierCapacity(4), "b": TierCapacity(4)})
    pool.insert("a", [1, 2])
    pool.insert("b", [1, 2, 3])
    found = pool.match([1, 2, 3])
    assert list(found) == ["a"] and found["a"].blocks == 2
    assert pool.prefix("b", [1, 2, 3]).blocks == 3


def test_local_caches_are_separate() -> None:
    local = LocalCaches({"a": TierCapacity(4), "b": TierCapacity(4)})
    local.insert("a", [1, 2])
    assert local.prefix("b", [1, 2]).blocks == 0
    assert local.prefix("a", [1, 2]).local == {Tier.DRAM: 2, Tier.SSD: 0}
    assert local.match([1, 2, 3])["a"].blocks == 2
    local.check_integrity()


def test_empty_pool_rejected() -> None:
    with pytest.raises(BadRequestError, match="empty cluster"):
        PooledStore({})
    with pytest.raises(BadRequestError, match="empty cluster"):
        LocalCaches({})
