"""Prefix indexes: in-memory (`DictPrefixIndex`, `PooledDictIndex`) and over one master
MatchPrefix answer (`MatchAnswerIndex`, what the gRPC conductor uses)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvstore.conductor.api import BlockId, PrefixMatch
from kvstore.errors import BadRequestError
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


@dataclass(frozen=True, slots=True)
class Run:
    """`length` leading blocks of one request's chain have a copy on `node_id` in `tier`."""

    node_id: str
    tier: Tier
    length: int


class MatchAnswerIndex:
    """A `PooledPrefixIndex` over one master MatchPrefix answer for one request.

    The master reports, per (storage node, tier), how many leading blocks have a
    complete copy there, and how many leading blocks the pool holds at all
    (`pool_length`; a chain may be spread over nodes). Each block counts in the
    fastest tier holding it; a block only the pool as a whole covers counts as
    `spread_tier`. The answer is for one chain: `match`/`prefix` ignore `hashes`.
    """

    def __init__(self, runs: Sequence[Run], pool_length: int, spread_tier: Tier = Tier.DRAM):
        if pool_length < 0 or any(r.length < 0 for r in runs):
            raise BadRequestError("prefix lengths must be >= 0")
        self.runs = tuple(r for r in runs if r.length > 0)
        self.pool_length = max([pool_length, *(r.length for r in self.runs)])
        self.spread_tier = spread_tier

    def capped(self, limit: int) -> MatchAnswerIndex:
        """The same answer, counting at most the first `limit` blocks."""
        runs = [Run(r.node_id, r.tier, min(r.length, limit)) for r in self.runs]
        return MatchAnswerIndex(runs, min(self.pool_length, limit), self.spread_tier)

    def _fastest(self, block: int, node_id: str | None, mine: bool) -> Tier | None:
        tiers = [
            r.tier
            for r in self.runs
            if r.length > block and (node_id is None or (r.node_id == node_id) == mine)
        ]
        return min(tiers) if tiers else None

    def match(self, hashes: Sequence[BlockId]) -> dict[str, PrefixMatch]:
        """Per storage node: its longest run of leading blocks, each in its fastest tier there."""
        out: dict[str, PrefixMatch] = {}
        for node_id in sorted({r.node_id for r in self.runs}):
            tiers: dict[Tier, int] = {}
            length = max(r.length for r in self.runs if r.node_id == node_id)
            for block in range(length):
                tier = self._fastest(block, node_id, True)
                assert tier is not None
                tiers[tier] = tiers.get(tier, 0) + 1
            out[node_id] = PrefixMatch(length, tiers)
        return out

    def prefix(self, node_id: str, hashes: Sequence[BlockId]) -> Split:
        """The pool's prefix as seen from `node_id`: blocks it holds itself are local."""
        local: dict[Tier, int] = {}
        remote: dict[Tier, int] = {}
        for block in range(self.pool_length):
            tier = self._fastest(block, node_id, True)
            if tier is not None:
                local[tier] = local.get(tier, 0) + 1
                continue
            tier = self._fastest(block, node_id, False)
            tier = self.spread_tier if tier is None else tier
            remote[tier] = remote.get(tier, 0) + 1
        return Split(local, remote)
