"""The DRAM tier's config and metadata: entries, LRU order, protections, eviction,
counters and their consistency check.

Knows where each object lives but never touches its bytes, so it is plain,
deterministic bookkeeping; `DramTier` adds the lock and the copies. Not
thread-safe on its own.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from kvstore.errors import BadRequestError, ExistsError, NoSpaceError, NotReadyError
from kvstore.tiers.allocator import OffsetAllocator
from kvstore.tiers.eviction import choose_victims
from kvstore.tiers.shm import check_segment_name
from kvstore.types import ObjectKey


@dataclass(frozen=True, slots=True)
class DramConfig:
    """One DRAM tier: its size, shared-memory label (None: a fresh unique one),
    eviction watermarks (fractions of capacity) and allocation alignment."""

    capacity_bytes: int
    segment_name: str | None = None
    high_watermark: float = 0.95
    low_watermark: float = 0.85
    alignment: int = 64

    def __post_init__(self) -> None:
        align = self.alignment
        if not _is_int(align) or align <= 0 or align & (align - 1):
            raise BadRequestError(f"alignment must be a power of two, got {align!r}")
        cap = self.capacity_bytes
        if not _is_int(cap) or cap <= 0 or cap % align:
            raise BadRequestError(f"capacity_bytes must be a positive multiple of {align}: {cap!r}")
        if self.segment_name is not None:
            check_segment_name(self.segment_name)
        low, high = self.low_watermark, self.high_watermark
        if not all(isinstance(w, int | float) and not isinstance(w, bool) for w in (low, high)):
            raise BadRequestError("watermarks must be numbers")
        if not 0.0 < low <= high <= 1.0:
            raise BadRequestError(f"need 0 < low_watermark <= high_watermark <= 1: {low}, {high}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(slots=True, eq=False)
class DramEntry:
    """One object's bookkeeping: where it lives and what protects it."""

    key: ObjectKey
    offset: int
    size: int
    committed: bool = False
    readers: int = 0
    pins: int = 0
    lease_until: float = -math.inf
    doomed: bool = False


@dataclass(slots=True)
class DramCounters:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    bytes_written: int = 0
    bytes_read: int = 0


class DramIndex:
    """Entries by key plus an LRU of committed ones; allocates, evicts, frees.

    `on_evict(entry)` runs just before a victim's range is freed.
    """

    def __init__(
        self,
        config: DramConfig,
        clock: Callable[[], float],
        on_evict: Callable[[DramEntry], None],
    ) -> None:
        self.alloc = OffsetAllocator(config.capacity_bytes, config.alignment)
        self.counters = DramCounters()
        self.objects: dict[ObjectKey, DramEntry] = {}  # WRITING and COMMITTED
        self.lru: OrderedDict[ObjectKey, DramEntry] = OrderedDict()  # COMMITTED, oldest first
        self.doomed: dict[int, DramEntry] = {}  # offset -> removed, awaiting release/lease end
        self._clock = clock
        self._on_evict = on_evict
        self._high = int(config.high_watermark * config.capacity_bytes)
        self._low = int(config.low_watermark * config.capacity_bytes)

    # -- lifecycle ------------------------------------------------------------------------

    def new_entry(self, key: ObjectKey, size: int) -> DramEntry:
        """A WRITING entry with space for `size` bytes, evicting if needed."""
        existing = self.objects.get(key)
        if existing is not None:
            state = "committed" if existing.committed else "being written"
            raise ExistsError(f"{key!r} is already {state}")
        entry = DramEntry(key, self._allocate(size), size)
        self.objects[key] = entry
        return entry

    def commit(self, entry: DramEntry) -> None:
        entry.committed = True
        self.lru[entry.key] = entry
        self.counters.bytes_written += entry.size

    def abort(self, entry: DramEntry) -> None:
        del self.objects[entry.key]
        self.alloc.free(entry.offset)

    def remove(self, key: ObjectKey) -> bool:
        """Drop a committed entry; free now unless read or leased (then doom it)."""
        entry = self.visible(key)
        if entry is None:
            return False
        del self.objects[key]
        del self.lru[key]
        entry.pins = 0
        if entry.readers or entry.lease_until > self._clock():
            entry.doomed = True
            self.doomed[entry.offset] = entry
        else:
            self.alloc.free(entry.offset)
        return True

    def release(self, entry: DramEntry) -> None:
        """One reader is done; a doomed entry is freed at its last release."""
        entry.readers -= 1
        if entry.doomed and not entry.readers and entry.lease_until <= self._clock():
            del self.doomed[entry.offset]
            self.alloc.free(entry.offset)

    def clear(self) -> None:
        self.objects.clear()
        self.lru.clear()
        self.doomed.clear()

    # -- lookups ----------------------------------------------------------------------------

    def visible(self, key: ObjectKey) -> DramEntry | None:
        """The committed entry of `key`, None if absent; NotReadyError if WRITING."""
        entry = self.objects.get(key)
        if entry is not None and not entry.committed:
            raise NotReadyError(f"{key!r} is still being written")
        return entry

    def read(self, key: ObjectKey) -> DramEntry | None:
        """Like `visible`, counting the hit or miss and touching the LRU."""
        entry = self.visible(key)
        if entry is None:
            self.counters.misses += 1
            return None
        self.touch(entry)
        return entry

    def touch(self, entry: DramEntry) -> None:
        self.lru.move_to_end(entry.key)
        self.counters.hits += 1
        self.counters.bytes_read += entry.size

    # -- protection -------------------------------------------------------------------------

    def pin(self, key: ObjectKey) -> bool:
        entry = self.objects.get(key)
        if entry is None:
            return False
        entry.pins += 1
        return True

    def unpin(self, key: ObjectKey) -> bool:
        entry = self.objects.get(key)
        if entry is None or not entry.pins:
            return False
        entry.pins -= 1
        return True

    def lease(self, key: ObjectKey, ttl_s: float) -> bool:
        entry = self.objects.get(key)
        if entry is None:
            return False
        entry.lease_until = max(entry.lease_until, self._clock() + ttl_s)
        return True

    def check_integrity(self, closed: bool) -> None:
        """Raise AssertionError unless every entry owns exactly one live allocation."""
        objects, lru, doomed, alloc = self.objects, self.lru, self.doomed, self.alloc
        if closed:
            assert not (objects or lru or doomed), "a closed tier still holds objects"
            return
        alloc.check_integrity()
        committed = {key for key, entry in objects.items() if entry.committed}
        assert set(lru) == committed, "LRU keys differ from the committed keys"
        for key, entry in objects.items():
            assert entry.key == key and not entry.doomed, f"bad entry under {key!r}"
            assert entry.committed or entry.readers == 0, f"WRITING {key!r} has readers"
            assert not entry.committed or lru[key] is entry, f"LRU holds another entry for {key!r}"
        for offset, entry in doomed.items():
            assert entry.doomed and entry.offset == offset, f"bad doomed entry at {offset}"
            assert objects.get(entry.key) is not entry, f"doomed {entry.key!r} is still visible"
        entries = [*objects.values(), *doomed.values()]
        for entry in entries:
            assert entry.readers >= 0 and entry.pins >= 0, f"negative counts on {entry.key!r}"
            assert entry.size > 0, f"empty object {entry.key!r}"
            assert alloc.is_allocated(entry.offset), f"{entry.key!r} at unallocated {entry.offset}"
            assert alloc.size_of(entry.offset) == alloc.aligned(entry.size), f"{entry.key!r} size"
        assert len({e.offset for e in entries}) == len(entries), "two objects share an offset"
        assert alloc.stats().allocations == len(entries), "allocations leak or are missing"

    # -- space ------------------------------------------------------------------------------

    def _allocate(self, size: int) -> int:
        if self.doomed:
            self._reap_doomed()
        alloc = self.alloc
        if alloc.used + alloc.aligned(size) <= self._high:
            offset = alloc.allocate(size)
            if offset is not None:
                return offset
        self._evict_for(size)
        offset = alloc.allocate(size)
        assert offset is not None, "eviction plan promised a fit"
        return offset

    def _evict_for(self, size: int) -> None:
        """Evict LRU-first until `size` fits and usage reaches the low watermark."""
        now, alloc = self._clock(), self.alloc
        candidates = (
            e for e in self.lru.values() if not (e.pins or e.readers or e.lease_until > now)
        )
        span = lambda e: (e.offset, alloc.aligned(e.size))  # noqa: E731
        victims = choose_victims(candidates, span, alloc, alloc.aligned(size), self._low)
        if victims is None:
            stats = alloc.stats()
            raise NoSpaceError(
                f"no room for {size} bytes: {stats.used} of {stats.capacity} used, "
                f"largest free {stats.largest_free}, the rest pinned, leased, read or written"
            )
        for entry in victims:
            self._on_evict(entry)
            del self.objects[entry.key]
            del self.lru[entry.key]
            self.alloc.free(entry.offset)
            self.counters.evictions += 1

    def _reap_doomed(self) -> None:
        now = self._clock()
        for offset, entry in list(self.doomed.items()):
            if not entry.readers and entry.lease_until <= now:
                del self.doomed[offset]
                self.alloc.free(offset)
