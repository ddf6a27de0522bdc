"""Replica placement: preferred node first, then the writer's node, then most free.

Each replica of one object goes to a distinct node. Within that order, faster
tiers come first (unless the request names a tier), then the segment with the
most free bytes; ties break on node id and segment name, so placement is
deterministic.

`place_run` places a run of identical single-replica items in one go: it finds
how many consecutive items the best segment keeps winning (its free bytes drop by
one aligned size per item) and claims them with one `allocate_many`, so a batch
of 1,000 like puts costs a few allocator calls instead of 1,000 rankings.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvstore.master.model import PutItem, Segment
from kvstore.types import Location

Rank = tuple[int, int, int, str, str, Segment]


def _ranks(segments: Iterable[Segment], item: PutItem, client_node: str) -> list[Rank]:
    """(node rank, tier, -free, node, name, segment) of each segment that could hold `item`
    ((node, name) is unique, so comparing ranks never reaches the segment)."""
    size, tier, pref = item.size, item.tier, item.preferred_node
    out = []
    for s in segments:
        free = s.capacity - s.allocator.used
        if free < size or (tier is not None and s.tier != tier):
            continue
        node_rank = 0 if pref and s.node_id == pref else 1 if s.node_id == client_node else 2
        out.append((node_rank, int(s.tier), -free, s.node_id, s.name, s))
    return out


def rank_segments(segments: Iterable[Segment], item: PutItem, client_node: str) -> list[Segment]:
    """Segments that could hold `item`, in the order placement tries them."""
    return [r[-1] for r in sorted(_ranks(segments, item, client_node))]


def place(segments: Iterable[Segment], item: PutItem, client_node: str) -> list[Location] | None:
    """Allocate `item.replicas` ranges on distinct nodes, or None (nothing kept)."""
    if item.replicas == 1:  # the common case: the best segment, without sorting them all
        ranks = _ranks(segments, item, client_node)
        if not ranks:
            return None
        best = min(ranks)[-1]
        offset = best.allocate(item.size)
        if offset is not None:
            return [Location(best.node_id, best.tier, best.name, offset, item.size)]
        segments = [r[-1] for r in ranks]  # fragmented: try them all in order
    chosen: list[tuple[Segment, int]] = []
    used_nodes: set[str] = set()
    for seg in rank_segments(segments, item, client_node):
        if seg.node_id in used_nodes:
            continue
        offset = seg.allocate(item.size)
        if offset is None:
            continue
        chosen.append((seg, offset))
        used_nodes.add(seg.node_id)
        if len(chosen) == item.replicas:
            return [Location(s.node_id, s.tier, s.name, off, item.size) for s, off in chosen]
    for seg, offset in chosen:
        seg.release(offset, item.size)
    return None


Run = tuple[Segment, int, int]  # segment, first offset, ranges (aligned size apart)


def place_run(
    segments: Iterable[Segment], item: PutItem, client_node: str, count: int
) -> list[Run]:
    """Place up to `count` copies of single-replica `item` exactly as `count` calls of
    `place` would, while each call's best segment has a fitting range; stops at the
    first item `place` would have to look further for (the caller places it alone)."""
    ranks = _ranks(segments, item, client_node)
    runs: list[Run] = []
    left = count
    while left and ranks:
        ranks.sort()
        best = ranks[0]
        seg = best[-1]
        a = seg.allocator.aligned(item.size)
        wins = _wins(best, ranks[1] if len(ranks) > 1 else None, item.size, a)
        got = seg.allocator.allocate_many(item.size, min(wins, left))
        runs.extend((seg, off, n) for off, n in got)
        placed = sum(n for _, n in got)
        left -= placed
        if placed < min(wins, left + placed):
            break  # fragmented: `place` would try the other segments for the next item
        free = seg.capacity - seg.allocator.used
        if free < item.size:
            ranks.pop(0)
        else:
            ranks[0] = (best[0], best[1], -free, best[3], best[4], seg)
    return runs


def _wins(best: Rank, second: Rank | None, size: int, aligned: int) -> int:
    """How many consecutive items `best` (ranked first) takes before it stops ranking
    first or stops having `size` free bytes."""
    free = -best[2]
    n = (free - size) // aligned + 1  # items after which it still has `size` free, +1
    if second is not None and best[:2] == second[:2]:
        margin = free - (-second[2])  # it wins while its free bytes exceed the second's
        ties = best[3:5] < second[3:5]  # equal free bytes: node id, then name, decide
        n = min(n, (margin if ties else margin - 1) // aligned + 1)
    return max(n, 1)
