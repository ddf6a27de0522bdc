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


def rank_segments(segments: Iterable[Segment], item: PutItem, client_node: str) -> list[Segment]:
    """Segments that could hold `item`, in the order placement tries them."""
    eligible = [
        s for s in segments if s.free >= item.size and (item.tier is None or s.tier == item.tier)
    ]

    def key(s: Segment) -> tuple[int, int, int, str, str]:
        if item.preferred_node and s.node_id == item.preferred_node:
            node_rank = 0
        elif client_node and s.node_id == client_node:
            node_rank = 1
        else:
            node_rank = 2
        return (node_rank, int(s.tier), -s.free, s.node_id, s.name)

    return sorted(eligible, key=key)


def place(segments: Iterable[Segment], item: PutItem, client_node: str) -> list[Location] | None:
    """Allocate `item.replicas` ranges on distinct nodes, or None (nothing kept)."""
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
