"""The contract every storage tier implements, and the stats it reports.

An object moves through these states inside one tier:

    (absent) --reserve--> WRITING --commit--> COMMITTED --remove/evict--> (absent)
                             |                    ^  |
                             +--abort--> (absent) |  +-- acquire: readers += 1
                                                  +----- release: readers -= 1

Readers never see WRITING objects (`get` of one raises NotReadyError). An object
with readers, a pin or an unexpired lease is never evicted nor freed; `remove`
of an object with readers marks it doomed and frees it at the last release.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from kvstore.types import ObjectKey, Tier

BytesLike = bytes | bytearray | memoryview

# Called with (key, committed bytes) just before a tier evicts an object, so the
# tiered store can demote it (offload-on-evict). The view is valid only inside
# the call. Raising aborts nothing: the object is evicted anyway.
EvictCallback = Callable[[ObjectKey, memoryview], None]


@dataclass(slots=True)
class TierStats:
    """Counters of one tier; a snapshot is returned by `stats()`."""

    tier: Tier
    capacity: int = 0
    used: int = 0
    objects: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    bytes_written: int = 0
    bytes_read: int = 0
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def hit_ratio(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


class WriteHandle(Protocol):
    """A reserved, not yet visible object: fill `buffer`, then commit or abort."""

    key: ObjectKey
    size: int

    @property
    def buffer(self) -> memoryview: ...


class ReadHandle(Protocol):
    """A committed object held against eviction until released."""

    key: ObjectKey
    size: int

    @property
    def buffer(self) -> memoryview: ...

    def release(self) -> None: ...

    def __enter__(self) -> ReadHandle: ...

    def __exit__(self, *exc: object) -> None: ...


@runtime_checkable
class ObjectTier(Protocol):
    """Byte objects by key in one tier. Single-key calls raise typed errors on bad
    input; lookups return None for "absent". Batch calls return one result per key."""

    tier: Tier

    def reserve(self, key: ObjectKey, size: int) -> WriteHandle: ...
    def commit(self, handle: WriteHandle) -> None: ...
    def abort(self, handle: WriteHandle) -> None: ...

    def put(self, key: ObjectKey, value: BytesLike) -> None: ...
    def get(self, key: ObjectKey) -> bytes | None: ...
    def get_into(self, key: ObjectKey, out: memoryview) -> int | None: ...
    def acquire(self, key: ObjectKey) -> ReadHandle | None: ...
    def size_of(self, key: ObjectKey) -> int | None: ...
    def exists(self, key: ObjectKey) -> bool: ...
    def remove(self, key: ObjectKey) -> bool: ...

    def batch_put(self, items: Sequence[tuple[ObjectKey, BytesLike]]) -> list[Exception | None]: ...
    def batch_get(self, keys: Sequence[ObjectKey]) -> list[bytes | None]: ...
    def batch_exists(self, keys: Sequence[ObjectKey]) -> list[bool]: ...

    def pin(self, key: ObjectKey) -> bool: ...
    def unpin(self, key: ObjectKey) -> bool: ...
    def keys(self) -> list[ObjectKey]: ...
    def set_evict_callback(self, callback: EvictCallback | None) -> None: ...
    def stats(self) -> TierStats: ...
    def check_integrity(self) -> None: ...
    def close(self) -> None: ...
