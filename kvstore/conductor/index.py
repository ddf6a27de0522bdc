"""An in-memory `PrefixIndex`: which blocks each node holds, in which tier."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvstore.conductor.api import BlockId, PrefixMatch
from kvstore.types import Tier


class DictPrefixIndex:
    """node -> {block id: tier}. A node's match is the longest run of leading blocks it holds."""

    def __init__(self) -> None:
        self._blocks: dict[str, dict[BlockId, Tier]] = {}

    def add(self, node_id: str, blocks: Iterable[BlockId], tier: Tier = Tier.HBM) -> None:
        """Record that `node_id` holds `blocks` in `tier` (a later add moves them)."""
        held = self._blocks.setdefault(node_id, {})
        for block in blocks:
            held[block] = tier

    def remove(self, node_id: str, blocks: Iterable[BlockId]) -> None:
        """Forget `blocks` on `node_id`; absent ones are ignored."""
        held = self._blocks.get(node_id, {})
        for block in blocks:
            held.pop(block, None)

    def match(self, hashes: Sequence[BlockId]) -> dict[str, PrefixMatch]:
        out: dict[str, PrefixMatch] = {}
        for node_id, held in self._blocks.items():
            tiers: dict[Tier, int] = {}
            count = 0
            for block in hashes:
                tier = held.get(block)
                if tier is None:
                    break
                tiers[tier] = tiers.get(tier, 0) + 1
                count += 1
            if count:
                out[node_id] = PrefixMatch(count, tiers)
        return out


@dataclass(frozen=True, slots=True)
class Split:
    """Blocks per tier of a pooled prefix: on the asking node and on other nodes."""

    local: dict[Tier, int]
    remote: dict[Tier, int]


class PooledDictIndex(DictPrefixIndex):
    """A DictPrefixIndex that is also a `PooledPrefixIndex`: a prefix may span nodes."""

    def prefix(self, node_id: str, hashes: Sequence[BlockId]) -> Split:
        """Longest prefix held anywhere; a block on `node_id` is local, else the fastest copy."""
        local: dict[Tier, int] = {}
        remote: dict[Tier, int] = {}
        for block in hashes:
            mine = self._blocks.get(node_id, {}).get(block)
            if mine is not None:
                local[mine] = local.get(mine, 0) + 1
                continue
            copies = [held[block] for held in self._blocks.values() if block in held]
            if not copies:
                break
            remote[min(copies)] = remote.get(min(copies), 0) + 1
        return Split(local, remote)
