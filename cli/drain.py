"""`kvstore drain NODE [--force]`: move a node's objects away before it leaves, then
unmount its segments.

1. Cordon the node (the master places no new replica there).
2. List every object with a replica on it. Those with a replica on another node need
   nothing; those held only there are read (one-sided, through kvstore.Client), removed
   and written again: the cordon sends the new replica elsewhere (group and pin kept).
3. Unmount each of its segments (the master drops the replicas left there).

Refused (exit 5, nothing changed) when the node holds the only replica of objects that
no other node has room for, e.g. the last node of the pool; `--force` then drains anyway
and says what is lost. Puts still in flight on the node are abandoned by the unmount.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from cli.common import cli_settings, emit
from cli.errors import RefusedError
from cli.master_api import MasterApi
from cli.tiers_view import human_bytes
from kvstore.errors import KVStoreError, NotFoundError
from kvstore.v1 import master_pb2


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("node")
    p.add_argument("--force", action="store_true", help="drain even if objects would be lost")


@dataclass(slots=True)
class Plan:
    """What a drain of one node has to do."""

    node: str
    move: list[master_pb2.ObjectInfo] = field(default_factory=list)  # only replica here
    covered: int = 0  # objects with a replica on another node too
    writing: int = 0  # puts in flight with a replica here
    segments: list[str] = field(default_factory=list)
    room_elsewhere: int = 0  # free bytes on other, uncordoned nodes

    @property
    def move_bytes(self) -> int:
        return sum(o.size for o in self.move)


def plan(api: MasterApi, node: str, cordoned: set[str]) -> Plan:
    stats = api.call("Stats", master_pb2.StatsRequest())
    if node not in {n.node_id for n in stats.nodes}:
        raise NotFoundError(f"unknown node {node!r}")
    out = Plan(node, segments=[s.segment for s in stats.segments if s.node_id == node])
    out.room_elsewhere = sum(
        s.capacity - s.used
        for s in stats.segments
        if s.node_id != node and s.node_id not in cordoned
    )
    token = ""
    while True:
        req = master_pb2.ListObjectsRequest(page_size=1000, page_token=token)
        page = api.call("ListObjects", req)
        for o in page.objects:
            _classify(out, o)
        token = page.next_page_token
        if not token:
            return out


def _classify(p: Plan, o: master_pb2.ObjectInfo) -> None:
    nodes = {r.node_id for r in o.replicas}
    if p.node not in nodes:
        return
    if o.state == master_pb2.OBJECT_STATE_WRITING:
        p.writing += 1
    elif nodes - {p.node}:
        p.covered += 1
    else:
        p.move.append(o)


def _refusal(p: Plan) -> str:
    return (
        f"{p.node} holds the only replica of {len(p.move)} objects "
        f"({human_bytes(p.move_bytes)}) and the other nodes have room for "
        f"{human_bytes(p.room_elsewhere)}; --force drains anyway and loses them"
    )


def move_objects(master: str, p: Plan, timeout_s: float) -> tuple[int, list[str]]:
    """Re-write each object held only on the node (the cordon places it elsewhere);
    (moved, keys lost)."""
    from kvstore.client import Client

    moved, lost = 0, []
    with Client(master, timeout_s=max(timeout_s, 10.0)) as client:
        for o in p.move:
            try:
                data = client.get(o.key)  # our own read lease: our remove below may proceed
            except NotFoundError:
                continue  # removed or evicted meanwhile
            # Forced: a reader in flight keeps its bytes, since the cordon keeps any new
            # allocation off this node until the unmount below.
            client.remove(o.key, force=True)
            try:
                client.put(o.key, data, group=o.group, pin_ttl_s=o.pin_ms_left / 1000)
                moved += 1
            except KVStoreError:
                lost.append(o.key)
    return moved, lost


def run(args: argparse.Namespace) -> int:
    cfg = cli_settings(args)
    with MasterApi(cfg.master, cfg.timeout_s) as api:
        cordon = api.call("Cordon", master_pb2.CordonRequest(node_id=args.node, cordon=True))
        p = plan(api, args.node, set(cordon.cordoned))
        short = bool(p.move) and p.room_elsewhere < p.move_bytes
        if short and not args.force:
            api.call("Cordon", master_pb2.CordonRequest(node_id=args.node, cordon=False))
            raise RefusedError(f"refused: {_refusal(p)}")
        moved, lost = move_objects(cfg.master, p, cfg.timeout_s)
        dropped = 0
        for seg in p.segments:
            res = api.call(
                "UnmountSegment", master_pb2.UnmountSegmentRequest(node_id=args.node, segment=seg)
            )
            dropped += res.dropped_replicas
    doc = {
        "node": args.node, "moved": moved, "already_replicated": p.covered,
        "abandoned_puts": p.writing, "lost": lost, "segments_unmounted": p.segments,
        "dropped_replicas": dropped,
    }  # fmt: skip
    emit(args, doc, _text(doc, p))
    return 0


def _text(doc: dict[str, Any], p: Plan) -> str:
    lines = [
        f"drained {doc['node']}: moved {doc['moved']} objects, {doc['already_replicated']} had "
        f"a replica elsewhere; unmounted {', '.join(p.segments) or 'no segments'} "
        f"({doc['dropped_replicas']} replicas dropped)",
    ]
    if doc["abandoned_puts"]:
        lines.append(f"abandoned {doc['abandoned_puts']} puts in flight on {doc['node']}")
    if doc["lost"]:
        lost_bytes = sum(o.size for o in p.move if o.key in set(doc["lost"]))
        lines.append(f"LOST (--force) {len(doc['lost'])} objects ({human_bytes(lost_bytes)})")
    lines.append(f"{doc['node']} stays cordoned: no new replica goes there")
    return "\n".join(lines)
