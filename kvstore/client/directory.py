"""Where the pool's segments are: SegmentDescriptors for Locations, from master Stats.

A Location names (node, tier, segment, offset, length); the data plane needs the
node's TCP endpoint and host id (Stats.nodes) and the segment's size (Stats.segments).
Segments their node mounted with `shm` set hand their fd to same-host clients, from
the node's fd server (`shm_socket` in its endpoint) by segment name: DRAM (and host
HBM) segments are shared memory the clients map; an SSD segment is its slab file,
which they pread/pwrite (kvstore.transfer.file). A node that serves NIXL publishes
its agent metadata and segment bases in its endpoint (`nixl_metadata`): its segments
then carry `nixl_meta`.
The cache is refreshed from Stats when a location is unknown (a new node or segment).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvstore.errors import BadRequestError
from kvstore.transfer.base import SegmentDescriptor
from kvstore.transfer.nixl_pool import segment_meta
from kvstore.types import Location
from kvstore.v1 import common_pb2, master_pb2


@dataclass(frozen=True, slots=True)
class _Node:
    tcp_address: str
    host_id: str
    nixl_metadata: bytes
    shm_socket: str


class SegmentDirectory:
    """Descriptors of mounted segments, per (node, segment); replaced whole on refresh."""

    def __init__(self) -> None:
        self._descs: dict[tuple[str, str], SegmentDescriptor] = {}
        self.refreshes = 0

    def descriptor(self, loc: Location) -> SegmentDescriptor | None:
        """The descriptor of `loc`'s segment, or None when unknown (refresh, then retry)."""
        return self._descs.get((loc.node_id, loc.segment))

    def update(self, stats: master_pb2.StatsResponse) -> None:
        """Rebuild from a Stats reply (one atomic swap: readers never see half a table)."""
        nodes = {n.node_id: _node(n.endpoint) for n in stats.nodes}
        descs: dict[tuple[str, str], SegmentDescriptor] = {}
        for seg in stats.segments:
            node = nodes.get(seg.node_id)
            if node is None:
                continue
            try:
                slab = seg.tier == common_pb2.TIER_SSD  # `shm` there: its fd is served
                descs[(seg.node_id, seg.segment)] = SegmentDescriptor(
                    name=seg.segment, size=seg.capacity, host_id=node.host_id,
                    endpoint=node.tcp_address, shm=seg.shm and not slab,
                    nixl_meta=segment_meta(node.nixl_metadata, seg.segment),
                    shm_socket=node.shm_socket if seg.shm else "", file=seg.shm and slab,
                )  # fmt: skip
            except BadRequestError:
                continue  # an endpoint we cannot parse: that segment stays unreachable
        self._descs = descs
        self.refreshes += 1

    def __len__(self) -> int:
        return len(self._descs)


def _node(ep: common_pb2.NodeEndpoint) -> _Node:
    return _Node(ep.tcp_address, ep.shm_host_id, ep.nixl_metadata, ep.shm_socket)
