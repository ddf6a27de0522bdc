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

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Any, Protocol

from kvstore.errors import BadRequestError
from kvstore.types import Location, ObjectKey, Tier, check_key

if TYPE_CHECKING:
    from kvstore.master.objects import ObjectTable


class ObjectState(IntEnum):
    WRITING = 0
    COMPLETE = 1


FREE = 255  # the state column of a row that holds no object
_STATES = {int(s): s for s in ObjectState}


class SpaceAllocator(Protocol):
    """What a segment needs from an offset allocator (kvstore.tiers.allocator)."""

    def allocate(self, size: int) -> int | None: ...
    def allocate_many(self, size: int, count: int) -> list[tuple[int, int]]: ...
    def allocate_at(self, offset: int, size: int) -> None: ...
    def claim_free(self, offset: int, size: int) -> list[tuple[int, int]]: ...
    def split(self, offset: int, size: int, pieces: Sequence[tuple[int, int]]) -> None: ...
    def free(self, offset: int, size: int | None = None) -> None: ...
    def aligned(self, size: int) -> int: ...
    def largest_free(self) -> int: ...
    def check_integrity(self, allocations: list[tuple[int, int]] | None = None) -> None: ...
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
    counters: SegmentCounters = field(default_factory=SegmentCounters)
    shm: bool = False  # a /dev/shm file same-host peers may map by name (as the node said)
    slot: int = -1  # its number in the master's object table (set when mounted)
    index: Any = None  # that ObjectTable, while mounted

    @property
    def keys(self) -> frozenset[str]:
        """Keys with a replica here, derived from the object table (nothing is stored
        per key per segment); O(objects): for unmount, announce, stats and tests."""
        return frozenset() if self.index is None else self.index.slot_keys(self.slot)

    @property
    def used(self) -> int:
        return self.allocator.used

    @property
    def free(self) -> int:
        return self.capacity - self.allocator.used

    def allocate(self, size: int) -> int | None:
        return self.allocator.allocate(size)

    def release(self, offset: int, size: int) -> None:
        self.allocator.free(offset, size)


def _column(name: str, doc: str) -> Any:
    """A property reading and writing one column of the object's row."""
    attr = f"{name}_v"

    def get(self: ObjectMeta) -> Any:
        return getattr(self._t, attr)[self.id]

    def put(self: ObjectMeta, value: Any) -> None:
        getattr(self._t, attr)[self.id] = value

    return property(get, put, doc=doc)


class ObjectMeta:
    """One object: a view of its row in the master's `ObjectTable` (see
    kvstore.master.objects). Views are made on demand and hold no state of their own:
    reading a field reads the row, setting one writes it. Keep one only while the
    object lives (a dropped object's id is reused)."""

    __slots__ = ("_t", "id", "key")
    wire: bytes | None = None  # no encoded reply is cached per object any more (kept: readers)

    def __init__(self, table: ObjectTable, i: int, key: str) -> None:
        self._t = table
        self.id = i
        self.key = key

    size = _column("size", "bytes of the object")
    started_at = _column("started", "master clock at PutStart (or adoption)")
    lease_until = _column("lease", "read lease deadline: blocks eviction until then")
    pin_until = _column("pin", "soft pin deadline")
    checksum = _column("checksum", "xxh3_64 of the bytes, recorded at PutEnd; 0 = unknown")

    @property
    def state(self) -> ObjectState:
        return _STATES[self._t.state_v[self.id]]

    @property
    def group(self) -> str:
        g = self._t.group_v[self.id]
        return self.key if g < 0 else self._t.group_name(g)

    @property
    def writer(self) -> str:
        return self._t.writer_names[self._t.writer_v[self.id]]

    @property
    def replicas(self) -> list[Location]:
        """A fresh list (fastest tier first); assign a new list to change them."""
        return self._t.replicas(self.id)

    @replicas.setter
    def replicas(self, locs: list[Location]) -> None:
        self._t.set_replicas(self.id, locs)

    @property
    def slow_hits(self) -> int:
        """Reads served from a slower tier than its node's fastest (promotion)."""
        return self._t.slow_v[self.id]

    @slow_hits.setter
    def slow_hits(self, n: int) -> None:
        self._t.slow_v[self.id] = min(n, 0xFFFF)

    @property
    def hits(self) -> int:
        """Lookup hits since the object was written (or restored); saturates at 2^31 - 1."""
        return self._t.hits_v[self.id]

    @property
    def moving(self) -> int:
        """Id of the tier move in flight for this object; 0 = none."""
        return self._t.moving.get(self.id, 0)

    @moving.setter
    def moving(self, task_id: int) -> None:
        if task_id:
            self._t.moving[self.id] = task_id
        else:
            self._t.moving.pop(self.id, None)

    @property
    def pin_ttl_s(self) -> float:
        """The pin a WRITING object gets at commit (0 = none)."""
        return self._t.pin_ttl.get(self.id, 0.0)

    def protected(self, now: float) -> bool:
        """True while a lease or a pin blocks eviction and plain removal."""
        t, i = self._t, self.id
        return t.lease_v[i] > now or t.pin_v[i] > now

    def __repr__(self) -> str:
        return (
            f"ObjectMeta({self.key!r}, size={self.size}, state={self.state.name}, "
            f"group={self.group!r}, replicas={self.replicas})"
        )


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
        if not isinstance(self.size, int) or not 0 < self.size < 1 << 63:
            raise BadRequestError(f"size of {self.key!r} must be a positive int below 2**63")
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
