"""Read-only questions about the metadata: prefix matches, paged listings, stats.

They take a `MasterState` and change nothing (no leases, no LRU touch), so the
scheduler and admin tools may ask them freely.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from kvstore.errors import BadRequestError
from kvstore.master.metadata import MasterState
from kvstore.master.model import (
    Counters,
    NodeInfo,
    ObjectMeta,
    ObjectState,
    PrefixMatch,
    PrefixResult,
    Segment,
    SegmentCounters,
)
from kvstore.types import Tier

Pair = tuple[str, Tier]


def match_prefix(state: MasterState, keys: Sequence[str], by_group: bool = False) -> PrefixResult:
    """Longest run of leading keys present in the pool, and on each (node, tier)."""
    where = _group_pairs if by_group else _key_pairs
    alive: dict[Pair, int] | None = None
    done: dict[Pair, int] = {}
    pool_length = 0
    for i, key in enumerate(keys):
        pairs = where(state, key)
        if pairs is not None and pool_length == i:
            pool_length = i + 1
        here = pairs or set()
        alive = dict.fromkeys(here, 0) if alive is None else alive
        for pair in [p for p in alive if p not in here]:
            done[pair] = i
            del alive[pair]
        if not alive and pool_length <= i:
            break
    for pair in alive or {}:
        done[pair] = len(keys)
    matches = [PrefixMatch(n, t, length) for (n, t), length in done.items() if length > 0]
    matches.sort(key=lambda m: (-m.length, int(m.tier), m.node_id))
    return PrefixResult(pool_length, matches)


def _key_pairs(state: MasterState, key: str) -> set[Pair] | None:
    obj = state.objects.get(key)
    if obj is None or obj.state is not ObjectState.COMPLETE:
        return None
    return {(r.node_id, r.tier) for r in obj.replicas}


def _group_pairs(state: MasterState, group: str) -> set[Pair] | None:
    """(node, tier) pairs holding every piece of `group`; None unless all are COMPLETE."""
    members = state.groups.members(group)
    if not members:
        return None
    common: set[Pair] | None = None
    for key in members:
        pairs = _key_pairs(state, key)
        if pairs is None:
            return None
        common = pairs if common is None else common & pairs
    return common


def list_objects(
    state: MasterState, page_size: int, page_token: str = "", prefix: str = ""
) -> tuple[list[ObjectMeta], str]:
    """One page of objects in key order after `page_token`; the next token ("" = end)."""
    if not 0 < page_size <= state.config.max_page_size:
        raise BadRequestError(f"page_size must be in 1..{state.config.max_page_size}")
    keys = sorted(k for k in state.objects if k.startswith(prefix) and k > page_token)
    page = keys[:page_size]
    token = page[-1] if len(keys) > page_size else ""
    return [state.objects[k] for k in page], token


@dataclass(frozen=True, slots=True)
class SegmentReport:
    """One segment at the time of the stats call: geometry, use and its counters."""

    node_id: str
    name: str
    tier: Tier
    capacity: int
    used: int
    replicas: int  # replicas placed here, WRITING ones included
    objects: int  # COMPLETE objects with a replica here
    counters: SegmentCounters
    shm: bool = False  # same-host peers may map it by name


@dataclass(frozen=True, slots=True)
class MasterStats:
    nodes: list[NodeInfo]
    segments: list[SegmentReport]
    objects: int
    writing: int
    capacity: int
    used: int
    counters: Counters = field(default_factory=Counters)


def stats(state: MasterState) -> MasterStats:
    reg = state.registry
    nodes = sorted(reg.nodes.values(), key=lambda n: n.node_id)
    segs = sorted(reg.segments.values(), key=lambda s: (s.node_id, s.name))
    c = state.counters
    snapshot = replace(c)
    counts = state.objects.slot_counts()  # one pass over the table for every segment
    reports = [_segment_report(seg, *counts.get(seg.slot, (0, 0))) for seg in segs]
    return MasterStats(
        nodes, reports, len(state.objects), len(state.writing), reg.capacity(), reg.used(), snapshot
    )


def _segment_report(seg: Segment, replicas: int, complete: int) -> SegmentReport:
    return SegmentReport(
        seg.node_id, seg.name, seg.tier, seg.capacity, seg.used, replicas, complete,
        replace(seg.counters), seg.shm,
    )  # fmt: skip
