"""The master's records: nodes, segments, objects, and the per-key request types.

Object state machine (the master holds metadata only):

    (absent) --put_start--> WRITING --put_end--> COMPLETE --remove/evict--> (absent)
                               |                    |
                               +-- put_revoke, writer timeout, node death --> (absent)
                                                    +-- last replica lost --> (absent)

Only COMPLETE objects are visible to lookups. An object with a live lease or pin,
or any WRITING member in its group, is never evicted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Protocol

from kvstore.errors import BadRequestError
from kvstore.types import Location, ObjectKey, Tier, check_key


class ObjectState(IntEnum):
    WRITING = 0
    COMPLETE = 1


class SpaceAllocator(Protocol):
    """What a segment needs from an offset allocator (kvstore.tiers.allocator)."""

    def allocate(self, size: int) -> int | None: ...
    def allocate_at(self, offset: int, size: int) -> None: ...
    def free(self, offset: int) -> None: ...
    def size_of(self, offset: int) -> int: ...
    def check_integrity(self) -> None: ...
    @property
    def used(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Endpoint:
    """How to reach a node's data plane (and its node RPC service)."""

    tcp_address: str = ""
    shm_host_id: str = ""
    rpc_address: str = ""
    nixl_metadata: bytes = b""  # opaque to the master; see kvstore.transfer.nixl_pool
    shm_socket: str = ""  # fd server of its shared-memory segments; see kvstore.tiers.shm


@dataclass(slots=True)
class NodeInfo:
    node_id: str
    endpoint: Endpoint
    last_heartbeat: float
    incarnation: str = ""  # changes per node process start ("" = not told)


@dataclass(slots=True)
class SegmentCounters:
    """What happened in one segment since it was mounted (for `kvstore tiers`).

    `hits`/`bytes_out`: lookups answered with this segment's replica listed first
    (the one clients read first) and their bytes; `bytes_in`: bytes of committed
    puts with a replica here; `evictions`: replicas here dropped by eviction.
    """

    hits: int = 0
    evictions: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    offloads_in: int = 0
    promotions_in: int = 0
    corrupt: int = 0


@dataclass(slots=True)
class Segment:
    """A byte range a node lent to the pool; the master allocates inside it."""

    node_id: str
    name: str
    tier: Tier
    capacity: int
    alignment: int
    allocator: SpaceAllocator
    keys: set[str] = field(default_factory=set)
    counters: SegmentCounters = field(default_factory=SegmentCounters)
    shm: bool = False  # a /dev/shm file same-host peers may map by name (as the node said)

    @property
    def used(self) -> int:
        return self.allocator.used

    @property
    def free(self) -> int:
        return self.capacity - self.allocator.used

    def allocate(self, size: int) -> int | None:
        return self.allocator.allocate(size)

    def release(self, offset: int) -> None:
        self.allocator.free(offset)


@dataclass(slots=True)
class ObjectMeta:
    """One object: its replicas and the clocks that protect it."""

    key: str
    size: int
    group: str
    state: ObjectState
    replicas: list[Location]
    writer: str
    started_at: float
    lease_until: float = 0.0
    pin_until: float = 0.0
    pin_ttl_s: float = 0.0
    checksum: int = 0  # xxh3_64 of the bytes, recorded at PutEnd; 0 = unknown
    slow_hits: int = 0  # reads served from a slower tier than its node's fastest (promotion)
    moving: int = 0  # id of the tier move in flight for this object; 0 = none
    # Opaque cache for the service layer (its encoded lookup result); the core
    # resets it to None whenever `replicas` changes.
    wire: bytes | None = None

    def protected(self, now: float) -> bool:
        """True while a lease or a pin blocks eviction and plain removal."""
        return self.lease_until > now or self.pin_until > now


@dataclass(frozen=True, slots=True)
class PutItem:
    """One key of a PutStart batch."""

    key: ObjectKey
    size: int
    replicas: int = 1
    preferred_node: str = ""
    group: str = ""
    tier: Tier | None = None
    pin_ttl_s: float = 0.0

    def __post_init__(self) -> None:
        check_key(self.key)
        if not isinstance(self.size, int) or self.size <= 0:
            raise BadRequestError(f"size of {self.key!r} must be a positive int")
        if not 1 <= self.replicas <= 16:
            raise BadRequestError(f"replicas of {self.key!r} must be in 1..16")
        if self.pin_ttl_s < 0:
            raise BadRequestError("pin_ttl_s must be >= 0")


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    node_id: str
    tier: Tier
    length: int


@dataclass(frozen=True, slots=True)
class PrefixResult:
    pool_length: int
    matches: list[PrefixMatch]


@dataclass(slots=True)
class Counters:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    reclaimed_puts: int = 0
    dead_nodes: int = 0
    dropped_replicas: int = 0
    offloads: int = 0
    promotions: int = 0
    promotions_skipped: int = 0
    corrupt_replicas: int = 0
    adopted: int = 0
    failed_moves: int = 0
