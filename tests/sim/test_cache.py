"""Block caches: exact LRU order, tier demotion, pooled store, and the published hit ratios."""

from __future__ import annotations

import pytest

from kvstore.sim.cache import (
    LRUBlockCache,
    TierCapacity,
    TieredBlockCache,
    blocks_for_tokens,
    replay_lru,
)
from kvstore.sim.traces import read_mooncake
from kvstore.types import Tier

from .test_traces import MOONCAKE


def test_lru_eviction_order() -> None:
    c = LRUBlockCache(3)
    assert c.insert([1, 2, 3]) == []
    assert c.insert([1]) == []  # touch: 1 becomes most recent
    assert c.insert([4, 5]) == [2, 3]
    assert c.lru_order() == [1, 4, 5]
    assert c.match_prefix([1, 4, 9, 5]) == 2
    assert c.evictions == 2
    c.check_integrity()


def test_tiered_demotes_and_promotes() -> None:
    c = TieredBlockCache(TierCapacity(dram_blocks=2, ssd_blocks=2))
    assert c.insert([1, 2, 3]) == []  # 1 demoted to SSD
    assert c.ssd.lru_order() == [1]
    assert c.match_prefix([1, 2, 3]) == {Tier.DRAM: 2, Tier.SSD: 1}
    assert c.insert([4, 5]) == [1]  # 2, 3 demoted; SSD drops 1
    assert c.ssd.lru_order() == [2, 3]
    c.insert([2])  # promote 2 back to DRAM, 4 goes down
    assert (c.dram.lru_order(), c.ssd.lru_order()) == ([5, 2], [3, 4])
    c.check_integrity()


def test_replay_small_trace_exact() -> None:
    from kvstore.sim.traces import TraceRequest

    reqs = [TraceRequest(i, float(i), 1024, 1, b) for i, b in enumerate([(1, 2), (1, 3), (1, 2)])]
    s = replay_lru(reqs, 3)  # hits: 0, then 1 (block 1), then 2 (1, 2)
    assert (s.hit_blocks, s.total_blocks, s.hit_tokens) == (3, 6, 1536)
    assert replay_lru(reqs, 1).hit_blocks == 0  # capacity 1: block 1 never survives


def test_published_hit_ratios_on_mooncake_trace() -> None:
    reqs = read_mooncake(MOONCAKE).requests
    assert blocks_for_tokens(3_000_000) == 5859
    lru = replay_lru(reqs, blocks_for_tokens(3_000_000))
    inf = replay_lru(reqs, None)
    assert lru.block_ratio * 100 == pytest.approx(13.6, abs=0.3)
    assert inf.block_ratio * 100 == pytest.approx(36.6, abs=0.3)
    assert inf.token_ratio * 100 == pytest.approx(37.4, abs=0.3)
