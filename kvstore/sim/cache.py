"""Block-level prefix caches for the simulator: one LRU, and a DRAM+SSD pair with demotion.

Blocks are the trace's chained ids (one per 512-token block), so a prompt's reusable part is
the leading run of its blocks that the cache holds. Capacities are in blocks; `None` means
unbounded (the infinite-cache bound).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvstore.errors import BadRequestError
from kvstore.sim.traces import BLOCK_TOKENS, TraceRequest
from kvstore.types import Tier


def blocks_for_tokens(tokens: int) -> int:
    """Whole 512-token blocks that fit in `tokens`."""
    return tokens // BLOCK_TOKENS


class LRUBlockCache:
    """An LRU set of block ids with a capacity in blocks (None = unbounded)."""

    def __init__(self, capacity_blocks: int | None) -> None:
        if capacity_blocks is not None and capacity_blocks < 0:
            raise BadRequestError(f"capacity must be >= 0, got {capacity_blocks}")
        self.capacity = capacity_blocks
        self._lru: OrderedDict[int, None] = OrderedDict()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, block: object) -> bool:
        return block in self._lru

    def match_prefix(self, blocks: Sequence[int]) -> int:
        """How many leading blocks of `blocks` are cached (no LRU update)."""
        n = 0
        for b in blocks:
            if b not in self._lru:
                break
            n += 1
        return n

    def insert(self, blocks: Iterable[int]) -> list[int]:
        """Add or touch `blocks` in order (last = most recent); return the evicted ids."""
        lru = self._lru
        for b in blocks:
            lru[b] = None
            lru.move_to_end(b)
        return self._evict_over_capacity()

    def remove(self, block: int) -> bool:
        """Drop `block` if cached; True if it was."""
        if block not in self._lru:
            return False
        del self._lru[block]
        return True

    def _evict_over_capacity(self) -> list[int]:
        if self.capacity is None:
            return []
        evicted = []
        while len(self._lru) > self.capacity:
            evicted.append(self._lru.popitem(last=False)[0])
        self.evictions += len(evicted)
        return evicted

    def lru_order(self) -> list[int]:
        """Block ids from least to most recently used (for tests and debugging)."""
        return list(self._lru)

    def check_integrity(self) -> None:
        if self.capacity is not None and len(self._lru) > self.capacity:
            raise AssertionError(f"{len(self._lru)} blocks over capacity {self.capacity}")


@dataclass(frozen=True, slots=True)
class TierCapacity:
    """Per-node KV capacity per tier, in blocks (HBM is modelled as part of DRAM here)."""

    dram_blocks: int
    ssd_blocks: int = 0

    def __post_init__(self) -> None:
        if self.dram_blocks < 0 or self.ssd_blocks < 0:
            raise BadRequestError(f"tier capacities must be >= 0: {self}")

    @property
    def total(self) -> int:
        return self.dram_blocks + self.ssd_blocks


class TieredBlockCache:
    """DRAM LRU in front of an SSD LRU: DRAM evictions are demoted to SSD, SSD hits promoted.

    A block lives in exactly one tier. `match_prefix` returns per-tier counts of the leading
    run, so the cluster can charge SSD reads at SSD bandwidth.
    """

    def __init__(self, cap: TierCapacity) -> None:
        self.cap = cap
        self.dram = LRUBlockCache(cap.dram_blocks)
        self.ssd = LRUBlockCache(cap.ssd_blocks)
        self.demotions = 0

    def match_prefix(self, blocks: Sequence[int]) -> dict[Tier, int]:
        got = {Tier.DRAM: 0, Tier.SSD: 0}
        for b in blocks:
            if b in self.dram:
                got[Tier.DRAM] += 1
            elif b in self.ssd:
                got[Tier.SSD] += 1
            else:
                break
        return got

    def prefix_len(self, blocks: Sequence[int]) -> int:
        return sum(self.match_prefix(blocks).values())

    def insert(self, blocks: Iterable[int]) -> list[int]:
        """Touch `blocks` in DRAM (promoting SSD copies); return ids dropped from both tiers."""
        blocks = list(blocks)
        for b in blocks:
            self.ssd.remove(b)
        demoted = self.dram.insert(blocks)
        self.demotions += len(demoted)
        return self.ssd.insert(demoted) if demoted else []

    def __contains__(self, block: object) -> bool:
        return block in self.dram or block in self.ssd

    def __len__(self) -> int:
        return len(self.dram) + len(self.ssd)

    def check_integrity(self) -> None:
        self.dram.check_integrity()
        self.ssd.check_integrity()
        both = set(self.dram.lru_order()) & set(self.ssd.lru_order())
        if both:
            raise AssertionError(f"blocks in two tiers: {sorted(both)[:5]}")


@dataclass(frozen=True, slots=True)
class HitStats:
    """Prefix hits of a replay: blocks and tokens hit over blocks and tokens asked."""

    hit_blocks: int
    total_blocks: int
    hit_tokens: int
    total_tokens: int

    @property
    def block_ratio(self) -> float:
        return self.hit_blocks / self.total_blocks if self.total_blocks else 0.0

    @property
    def token_ratio(self) -> float:
        return self.hit_tokens / self.total_tokens if self.total_tokens else 0.0


def hit_tokens(req: TraceRequest, n_blocks: int) -> int:
    """Prompt tokens covered by the first `n_blocks` blocks (the last block may be partial)."""
    return min(req.input_len, n_blocks * BLOCK_TOKENS)


def replay_lru(requests: Iterable[TraceRequest], capacity_blocks: int | None) -> HitStats:
    """Fast path: one global LRU prefix cache over a whole trace (no timing, no routing)."""
    cache = LRUBlockCache(capacity_blocks)
    hb = tb = ht = tt = 0
    for r in requests:
        n = cache.match_prefix(r.blocks)
        hb += n
        tb += len(r.blocks)
        ht += hit_tokens(r, n)
        tt += r.input_len
        cache.insert(r.blocks)
    return HitStats(hb, tb, ht, tt)
