"""Replica placement: preferred node first, then the writer's node, then most free.

Each replica of one object goes to a distinct node. Within that order, faster
tiers come first (unless the request names a tier), then the segment with the
most free bytes; ties break on node id and segment name, so placement is
deterministic.
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
        seg.release(offset)
    return None
