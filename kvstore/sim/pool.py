"""Where cached blocks live across nodes: per-node local caches, or one pooled store.

`LocalCaches`: each node sees and fills only its own DRAM+SSD LRU (vLLM-style prefix caching).
`PooledStore`: the nodes' memory is one store, as kvstore's master runs it: a new block goes
to the writing node if it has room there, else to the node with the most free room; when the
pool's DRAM is full the globally least recently used block is demoted to SSD (its node's, or
the roomiest), and when the SSD is full too the globally LRU SSD block is dropped. Any node
can use a prefix block by block from whichever node holds it. Both implement the conductor's
`PrefixIndex` (`match`), and tell the simulator which part of a prefix is local or remote.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvstore.conductor.api import PrefixMatch
from kvstore.errors import BadRequestError
from kvstore.sim.cache import TierCapacity, TieredBlockCache
from kvstore.types import Tier


@dataclass(frozen=True, slots=True)
class PoolHit:
    """A usable cached prefix: blocks per tier on the asking node and on other nodes."""

    local: dict[Tier, int]
    remote: dict[Tier, int]

    @property
    def blocks(self) -> int:
        return sum(self.local.values()) + sum(self.remote.values())


def _match(n: int, tiers: dict[Tier, int]) -> PrefixMatch:
    return PrefixMatch(n, {t: k for t, k in tiers.items() if k})


class LocalCaches:
    """One independent tiered LRU cache per node."""

    pooled = False

    def __init__(self, caps: Mapping[str, TierCapacity]) -> None:
        if not caps:
            raise BadRequestError("empty cluster: no node caches")
        self.caches = {node: TieredBlockCache(cap) for node, cap in caps.items()}

    def match(self, hashes: Sequence[object]) -> dict[str, PrefixMatch]:
        found = {}
        for node, cache in self.caches.items():
            tiers = cache.match_prefix(hashes)  # type: ignore[arg-type]
            if any(tiers.values()):
                found[node] = _match(sum(tiers.values()), tiers)
        return found

    def prefix(self, home: str, blocks: Sequence[int]) -> PoolHit:
        return PoolHit(self.caches[home].match_prefix(blocks), {})

    def local_prefix_len(self, home: str, blocks: Sequence[int]) -> int:
        return self.caches[home].prefix_len(blocks)

    def insert(self, home: str, blocks: Sequence[int]) -> None:
        self.caches[home].insert(blocks)

    def check_integrity(self) -> None:
        for cache in self.caches.values():
            cache.check_integrity()


class PooledStore:
    """All nodes' DRAM and SSD as one store with global LRU eviction (see module doc)."""

    pooled = True

    def __init__(self, caps: Mapping[str, TierCapacity]) -> None:
        if not caps:
            raise BadRequestError("empty cluster: no node caches")
        self.caps = dict(caps)
        self.where: dict[int, tuple[str, Tier]] = {}
        self.lru = {Tier.DRAM: OrderedDict[int, None](), Tier.SSD: OrderedDict[int, None]()}
        self.free = {
            Tier.DRAM: {n: c.dram_blocks for n, c in caps.items()},
            Tier.SSD: {n: c.ssd_blocks for n, c in caps.items()},
        }
        self.evictions = 0

    def match(self, hashes: Sequence[object]) -> dict[str, PrefixMatch]:
        """Per node, the leading run of blocks held on that node."""
        found: dict[str, PrefixMatch] = {}
        for node in self.caps:
            tiers = {Tier.DRAM: 0, Tier.SSD: 0}
            for b in hashes:
                loc = self.where.get(b)  # type: ignore[call-overload]
                if loc is None or loc[0] != node:
                    break
                tiers[loc[1]] += 1
            if any(tiers.values()):
                found[node] = _match(sum(tiers.values()), tiers)
        return found

    def prefix(self, home: str, blocks: Sequence[int]) -> PoolHit:
        local = {Tier.DRAM: 0, Tier.SSD: 0}
        remote = {Tier.DRAM: 0, Tier.SSD: 0}
        for b in blocks:
            loc = self.where.get(b)
            if loc is None:
                break
            (local if loc[0] == home else remote)[loc[1]] += 1
        return PoolHit(local, remote)

    def local_prefix_len(self, home: str, blocks: Sequence[int]) -> int:
        return self.prefix(home, blocks).blocks

    def insert(self, home: str, blocks: Sequence[int]) -> None:
        """Touch cached blocks (an SSD hit moves back to DRAM); store new ones."""
        for b in blocks:
            loc = self.where.get(b)
            if loc is not None and loc[1] == Tier.DRAM:
                self.lru[Tier.DRAM].move_to_end(b)
                continue
            if loc is not None:
                self._drop(b)
            self._put(b, home, Tier.DRAM)

    def _drop(self, b: int) -> tuple[str, Tier]:
        node, tier = self.where.pop(b)
        del self.lru[tier][b]
        self.free[tier][node] += 1
        return node, tier

    def _put(self, b: int, home: str, tier: Tier) -> bool:
        """Store `b` in `tier`; False when the tier has no capacity at all."""
        node = self._room(home, tier)
        if node is None:
            return False
        self.where[b] = (node, tier)
        self.lru[tier][b] = None
        self.free[tier][node] -= 1
        return True

    def _room(self, home: str, tier: Tier) -> str | None:
        """A node with a free slot in `tier` (home first), making room by LRU if needed."""
        free = self.free[tier]
        if free[home] > 0:
            return home
        roomiest = max(free, key=lambda n: (free[n], n))
        if free[roomiest] > 0:
            return roomiest
        if not self.lru[tier]:
            return None
        victim = next(iter(self.lru[tier]))
        node, _ = self._drop(victim)
        if tier == Tier.SSD or not self._put(victim, node, Tier.SSD):
            self.evictions += 1
        return node

    def check_integrity(self) -> None:
        for tier, lru in self.lru.items():
            held = {n: 0 for n in self.caps}
            for b in lru:
                node, t = self.where[b]
                if t != tier:
                    raise AssertionError(f"block {b} in {tier.name} LRU but located in {t.name}")
                held[node] += 1
            for node, cap in self.caps.items():
                total = cap.dram_blocks if tier == Tier.DRAM else cap.ssd_blocks
                if held[node] + self.free[tier][node] != total:
                    raise AssertionError(f"{node} {tier.name}: held + free != capacity")
        if len(self.where) != sum(len(lru) for lru in self.lru.values()):
            raise AssertionError("location map and LRU lists disagree")


BlockPool = LocalCaches | PooledStore


def make_pool(caps: Mapping[str, TierCapacity], *, pooled: bool) -> BlockPool:
    """A pooled store or per-node local caches over the given capacities."""
    return PooledStore(caps) if pooled else LocalCaches(caps)
