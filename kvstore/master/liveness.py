"""Nodes and their segments, and who is alive: heartbeats within `node_ttl_s`.

The registry knows which node lent which segment; it never touches objects.
`dead_nodes(now)` names the nodes silent for longer than the TTL; the master
then unmounts their segments and drops the replicas on them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from kvstore.errors import BadRequestError, ExistsError, NotFoundError
from kvstore.master.model import Endpoint, NodeInfo, Segment, SpaceAllocator
from kvstore.types import Tier

AllocatorFactory = Callable[[int, int], SpaceAllocator]


def default_allocator(capacity: int, alignment: int) -> SpaceAllocator:
    from kvstore.tiers.allocator import OffsetAllocator

    return OffsetAllocator(capacity, alignment)


class NodeRegistry:
    """Registered nodes, their heartbeats and mounted segments."""

    def __init__(self, node_ttl_s: float, allocator_factory: AllocatorFactory) -> None:
        self._ttl = node_ttl_s
        self._factory = allocator_factory
        self.nodes: dict[str, NodeInfo] = {}
        self.segments: dict[tuple[str, str], Segment] = {}
        self.cordoned: set[str] = set()  # nodes being drained: no new replica goes there
        # Nodes whose data plane clients could not reach: no new replica goes there until
        # the master clock passes the deadline (`fence`). The clock is the last one the
        # registry was told (every heartbeat tells it), so fences end without a timer.
        self.fenced: dict[str, float] = {}
        self._now = 0.0

    def register(
        self, node_id: str, endpoint: Endpoint, now: float, incarnation: str = ""
    ) -> NodeInfo:
        """Add a node, or refresh the endpoint and heartbeat of a known one."""
        if not node_id or len(node_id) > 256:
            raise BadRequestError("node_id must be 1..256 characters")
        old = self.nodes.get(node_id)
        if old is None or old.endpoint != endpoint or old.incarnation != incarnation:
            self.fenced.pop(node_id, None)  # a new process or address: reachable again?
        node = NodeInfo(node_id, endpoint, now, incarnation)
        self.nodes[node_id] = node
        self._now = max(self._now, now)
        return node

    def heartbeat(self, node_id: str, now: float) -> None:
        self.node(node_id).last_heartbeat = now
        self._now = max(self._now, now)

    def fence(self, node_id: str, until: float, now: float) -> bool:
        """Keep new replicas off `node_id` until `until`; False for an unknown node."""
        self._now = max(self._now, now)
        if node_id not in self.nodes:
            return False
        self.fenced[node_id] = max(until, self.fenced.get(node_id, 0.0))
        return True

    def _excluded(self) -> set[str]:
        for node_id in [n for n, until in self.fenced.items() if until <= self._now]:
            del self.fenced[node_id]
        if not self.fenced:
            return self.cordoned
        out = self.cordoned | set(self.fenced)
        if all(s.node_id in out for s in self.segments.values()):
            return self.cordoned  # every node fenced: a fence is a hint, not an outage
        return out

    def node(self, node_id: str) -> NodeInfo:
        node = self.nodes.get(node_id)
        if node is None:
            raise NotFoundError(f"unknown node {node_id!r}: register first")
        return node

    def mount(
        self, node_id: str, name: str, tier: Tier, capacity: int, alignment: int,
        shm: bool = False,
    ) -> tuple[Segment, bool]:  # fmt: skip
        """Mount a segment; (segment, changed): False when the same one was already mounted.

        A remount with the same geometry only updates the `shm` flag (how the node
        serves it, not where the master allocates)."""
        self.node(node_id)
        if not name:
            raise BadRequestError("segment name must not be empty")
        if alignment <= 0 or alignment & (alignment - 1):
            raise BadRequestError(f"alignment must be a power of two, got {alignment}")
        usable = capacity - capacity % alignment
        if usable <= 0:
            raise BadRequestError(f"segment {name!r} capacity {capacity} < alignment {alignment}")
        old = self.segments.get((node_id, name))
        if old is not None:
            if (old.tier, old.capacity, old.alignment) == (tier, usable, alignment):
                changed, old.shm = old.shm != shm, shm
                return old, changed
            raise ExistsError(f"segment {name!r} of {node_id!r} is mounted with other geometry")
        seg = Segment(
            node_id, name, Tier(tier), usable, alignment, self._factory(usable, alignment),
            shm=shm,
        )  # fmt: skip
        self.segments[(node_id, name)] = seg
        return seg, True

    def segment(self, node_id: str, name: str) -> Segment:
        seg = self.segments.get((node_id, name))
        if seg is None:
            raise NotFoundError(f"segment {name!r} of node {node_id!r} is not mounted")
        return seg

    def unmount(self, node_id: str, name: str) -> Segment:
        seg = self.segment(node_id, name)
        del self.segments[(node_id, name)]
        return seg

    def segments_of(self, node_id: str) -> list[Segment]:
        return [s for (n, _), s in self.segments.items() if n == node_id]

    def dead_nodes(self, now: float) -> list[str]:
        """Nodes whose last heartbeat is older than the TTL."""
        return [n.node_id for n in self.nodes.values() if now - n.last_heartbeat > self._ttl]

    def forget(self, node_id: str) -> None:
        self.nodes.pop(node_id, None)
        self.fenced.pop(node_id, None)

    def live_segments(self) -> Iterator[Segment]:
        """Segments new replicas may use: those of cordoned (draining) and fenced
        (unreachable, see `fence`) nodes are left out."""
        out = self._excluded() if self.fenced else self.cordoned
        if not out:
            return iter(self.segments.values())
        return (s for s in self.segments.values() if s.node_id not in out)

    def capacity(self) -> int:
        return sum(s.capacity for s in self.segments.values())

    def used(self) -> int:
        return sum(s.used for s in self.segments.values())

    def check_integrity(self) -> None:
        for (node_id, name), seg in self.segments.items():
            assert node_id in self.nodes, f"segment {name!r} of unknown node {node_id!r}"
            assert (seg.node_id, seg.name) == (node_id, name), "segment indexed wrongly"
            assert 0 <= seg.used <= seg.capacity, f"segment {name!r} used out of range"
            seg.allocator.check_integrity()
