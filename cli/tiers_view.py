"""What `kvstore tiers` shows: the master's Stats folded per node and tier.

`tier_rows` sums the segments of one (node, tier); `render_table` prints them
readably; `to_document` is the one JSON document of `--json`. A row's hit ratio
is the share of all pool lookups (hits + misses) that this node and tier served.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kvstore.types import Tier
from kvstore.v1 import master_pb2


@dataclass(frozen=True, slots=True)
class TierRow:
    """One node's segments of one tier, summed."""

    node_id: str
    tier: str
    segments: int
    capacity: int
    used: int
    objects: int
    hits: int
    hit_ratio: float
    evictions: int
    bytes_in: int
    bytes_out: int


@dataclass(frozen=True, slots=True)
class PoolRow:
    """The whole pool: totals and the pool-level hit ratio."""

    nodes: int
    capacity: int
    used: int
    objects: int
    writing: int
    hits: int
    misses: int
    hit_ratio: float
    evictions: int
    bytes_in: int
    bytes_out: int


def _ratio(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def tier_rows(stats: master_pb2.StatsResponse) -> list[TierRow]:
    """Rows sorted by node, then tier (fastest first)."""
    sums: dict[tuple[str, int], list[int]] = {}
    for s in stats.segments:
        acc = sums.setdefault((s.node_id, s.tier), [0] * 8)
        for i, v in enumerate(
            (1, s.capacity, s.used, s.objects, s.hits, s.evictions, s.bytes_in, s.bytes_out)
        ):
            acc[i] += v
    lookups = stats.hits + stats.misses
    rows = []
    for (node, tier), (n, cap, used, objs, hits, ev, b_in, b_out) in sorted(sums.items()):
        name = Tier(tier).name if tier in Tier._value2member_map_ else str(tier)
        rows.append(
            TierRow(node, name, n, cap, used, objs, hits, _ratio(hits, lookups), ev, b_in, b_out)
        )
    return rows


def pool_row(stats: master_pb2.StatsResponse) -> PoolRow:
    return PoolRow(
        nodes=len(stats.nodes),
        capacity=stats.capacity,
        used=stats.used,
        objects=stats.objects,
        writing=stats.writing,
        hits=stats.hits,
        misses=stats.misses,
        hit_ratio=_ratio(stats.hits, stats.hits + stats.misses),
        evictions=stats.evictions,
        bytes_in=sum(s.bytes_in for s in stats.segments),
        bytes_out=sum(s.bytes_out for s in stats.segments),
    )


def human_bytes(n: int) -> str:
    """1536 -> '1.5 KiB'; exact bytes below 1 KiB."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"


_HEAD = ("node", "tier", "capacity", "used", "use%", "objects", "hits", "hit%", "evictions",
         "bytes in", "bytes out")  # fmt: skip


def _cells(name: str, tier: str, r: TierRow | PoolRow) -> tuple[str, ...]:
    return (
        name, tier, human_bytes(r.capacity), human_bytes(r.used),
        f"{100 * _ratio(r.used, r.capacity):.1f}", str(r.objects), str(r.hits),
        f"{100 * r.hit_ratio:.1f}", str(r.evictions), human_bytes(r.bytes_in),
        human_bytes(r.bytes_out),
    )  # fmt: skip


def render_table(rows: list[TierRow], pool: PoolRow) -> str:
    """A fixed-width table: one line per node and tier, then the pool total."""
    lines = [_cells(r.node_id, r.tier, r) for r in rows]
    lines.append(_cells(f"pool ({pool.nodes} nodes)", "all", pool))
    widths = [max(len(c[i]) for c in [_HEAD, *lines]) for i in range(len(_HEAD))]

    def fmt(cells: tuple[str, ...]) -> str:
        left = [c.ljust(w) for c, w in zip(cells[:2], widths[:2], strict=True)]
        right = [c.rjust(w) for c, w in zip(cells[2:], widths[2:], strict=True)]
        return "  ".join(left + right).rstrip()

    rule = "-" * len(fmt(_HEAD))
    body = [fmt(c) for c in lines]
    footer = f"lookups: {pool.hits} hits, {pool.misses} misses; {pool.writing} puts in flight"
    return "\n".join([fmt(_HEAD), rule, *body[:-1], rule, body[-1], footer])


def to_document(stats: master_pb2.StatsResponse, master: str) -> dict[str, Any]:
    """The `--json` document: pool totals, per node/tier rows, nodes."""
    nodes = [
        {"node_id": n.node_id, "tcp_address": n.endpoint.tcp_address,
         "ms_since_heartbeat": n.ms_since_heartbeat}
        for n in stats.nodes
    ]  # fmt: skip
    return {
        "master": master,
        "epoch": stats.master_epoch,
        "pool": asdict(pool_row(stats)),
        "tiers": [asdict(r) for r in tier_rows(stats)],
        "nodes": nodes,
    }
