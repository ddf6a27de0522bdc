"""The DRAM tier: objects packed into one shared-memory segment, LRU-evicted.

All objects live in a single shared-memory segment, so a peer process on the host
can map it (by fd, once the segment serves) and read an object one-sided at the
range `locate` returns (protect it with a `lease` meanwhile). Ranges come from an
O(1) `OffsetAllocator`.

Object states (see kvstore.tiers.base):

    reserve -> WRITING --commit--> COMMITTED (in LRU) --remove/evict--> freed
                  +------abort---> freed           \\--remove with readers or a
                                                       live lease--> doomed --> freed

Eviction: a reserve that would push usage above the high watermark, or that
finds no fitting free range, evicts least-recently-used objects (get, acquire,
locate and commit count as use) until usage, new object included, is at most the
low watermark (or nothing evictable is left) and the object fits. Pinned, leased,
WRITING and acquired objects
are never evicted. If no choice of evictions makes the object fit, NoSpaceError
is raised and nothing is evicted. The evict callback sees each victim's bytes
before they are freed (for demotion to SSD).

The segment is anonymous shared memory (kvstore.tiers.shm): `close` unmaps it,
and the kernel frees it once no process maps it, however the process ends.
`segment.serve()` lets same-host peers map it (by fd, see `locate`).

Thread-safe with one lock. Copies and the evict callback run under it: a slow
callback stalls the tier, and it must not call back into the tier (deadlock).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence

from kvstore.buffers import byte_view
from kvstore.errors import BadRequestError, KVStoreError, TooLargeError
from kvstore.tiers.base import BytesLike, EvictCallback, TierStats
from kvstore.tiers.dram_index import DramConfig, DramEntry, DramIndex
from kvstore.tiers.shm import SharedSegment, new_segment_name
from kvstore.types import ObjectKey, Tier, check_key

__all__ = ["DramConfig", "DramReadHandle", "DramTier", "DramWriteHandle"]

log = logging.getLogger(__name__)


class DramTier:
    """Byte objects by key in one shared-memory segment (implements ObjectTier)."""

    tier = Tier.DRAM

    def __init__(self, config: DramConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self._config = config
        self._clock = clock
        name = config.segment_name or new_segment_name("kvstore-dram")
        self._segment = SharedSegment.create(name, config.capacity_bytes)
        self._view: memoryview = self._segment.buffer
        self._index = DramIndex(config, clock, self._on_evict)
        self._lock = threading.Lock()
        self._evict_callback: EvictCallback | None = None
        self._callback_errors = 0
        self._closed = False

    @property
    def config(self) -> DramConfig:
        return self._config

    @property
    def segment(self) -> SharedSegment:
        return self._segment

    # -- two-phase writes ---------------------------------------------------------------

    def reserve(self, key: ObjectKey, size: int) -> DramWriteHandle:
        """Allocate an invisible object of `size` bytes to fill, then commit or abort."""
        key = check_key(key)
        check_size(size, self._config.capacity_bytes)
        with self._lock:
            self._check_open()
            entry = self._index.new_entry(key, size)
            view = self._view[entry.offset : entry.offset + size]
            return DramWriteHandle(self, entry, view)

    def commit(self, handle: DramWriteHandle) -> None:
        """Make a reserved object visible."""
        with self._lock:
            self._index.commit(self._writing_entry(handle))
            handle._finish()

    def abort(self, handle: DramWriteHandle) -> None:
        """Drop a reserved object and free its space."""
        with self._lock:
            self._index.abort(self._writing_entry(handle))
            handle._finish()

    def put(self, key: ObjectKey, value: BytesLike) -> None:
        """Store a new object (ExistsError if the key is present or being written)."""
        key = check_key(key)
        src = byte_view(value, what="value")
        check_size(src.nbytes, self._config.capacity_bytes)
        with self._lock:
            self._check_open()
            entry = self._index.new_entry(key, src.nbytes)
            self._view[entry.offset : entry.offset + entry.size] = src
            self._index.commit(entry)

    # -- reads ----------------------------------------------------------------------------

    def get(self, key: ObjectKey) -> bytes | None:
        """A copy of the object, or None if absent (NotReadyError while WRITING)."""
        key = check_key(key)
        with self._lock:
            entry = self._index.read(key)
            if entry is None:
                return None
            return bytes(self._view[entry.offset : entry.offset + entry.size])

    def get_into(self, key: ObjectKey, out: memoryview) -> int | None:
        """Copy the object into `out`; its size, or None if absent."""
        key = check_key(key)
        dst = byte_view(out, writable=True, what="out")
        with self._lock:
            entry = self._index.visible(key)
            if entry is None:
                self._index.counters.misses += 1
                return None
            if dst.nbytes < entry.size:
                raise TooLargeError(f"{key!r} has {entry.size} bytes, out holds {dst.nbytes}")
            self._index.touch(entry)
            dst[: entry.size] = self._view[entry.offset : entry.offset + entry.size]
            return entry.size

    def acquire(self, key: ObjectKey) -> DramReadHandle | None:
        """Hold the object against eviction and freeing; None if absent."""
        key = check_key(key)
        with self._lock:
            entry = self._index.read(key)
            if entry is None:
                return None
            entry.readers += 1
            view = self._view[entry.offset : entry.offset + entry.size].toreadonly()
            return DramReadHandle(entry.key, entry.size, view, lambda: self._release(entry))

    def locate(self, key: ObjectKey) -> tuple[str, int, int] | None:
        """(segment name, offset, length) of a committed object for a one-sided peer
        read; None if absent. Lease the key so it is not evicted during the read. A
        same-host peer maps the segment with SharedSegment.attach(name, address),
        `address` being what `segment.serve()` returned."""
        key = check_key(key)
        with self._lock:
            entry = self._index.visible(key)
            if entry is None:
                return None
            self._index.lru.move_to_end(key)
            return self._segment.name, entry.offset, entry.size

    def size_of(self, key: ObjectKey) -> int | None:
        """The size of a committed object; None if absent or still WRITING."""
        key = check_key(key)
        with self._lock:
            entry = self._index.lru.get(key)
            return None if entry is None else entry.size

    def exists(self, key: ObjectKey) -> bool:
        """Whether a committed object exists (WRITING objects are invisible)."""
        key = check_key(key)
        with self._lock:
            return key in self._index.lru

    def keys(self) -> list[ObjectKey]:
        """Committed keys, least recently used first."""
        with self._lock:
            return list(self._index.lru)

    # -- removal and protection -----------------------------------------------------------

    def remove(self, key: ObjectKey) -> bool:
        """Remove a committed object; False if absent, NotReadyError if WRITING. Its
        space is freed at once, or at the last release / lease end if it has readers
        or a live lease. Pins only guard against eviction: remove drops them."""
        key = check_key(key)
        with self._lock:
            return self._index.remove(key)

    def pin(self, key: ObjectKey) -> bool:
        """Protect an object (WRITING or COMMITTED) from eviction; pins nest."""
        key = check_key(key)
        with self._lock:
            return self._index.pin(key)

    def unpin(self, key: ObjectKey) -> bool:
        """Undo one pin; False if absent or not pinned."""
        key = check_key(key)
        with self._lock:
            return self._index.unpin(key)

    def lease(self, key: ObjectKey, ttl_s: float) -> bool:
        """Protect an object from eviction and freeing for `ttl_s` seconds of the
        tier's clock (leases only extend); False if absent."""
        key = check_key(key)
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float):
            raise BadRequestError(f"ttl_s must be a number, got {type(ttl_s).__name__}")
        if not 0 < ttl_s < math.inf:
            raise BadRequestError(f"ttl_s must be positive and finite, got {ttl_s}")
        with self._lock:
            return self._index.lease(key, ttl_s)

    # -- batches ----------------------------------------------------------------------------

    def batch_put(self, items: Sequence[tuple[ObjectKey, BytesLike]]) -> list[Exception | None]:
        """Put each (key, value); per item None or the typed error it raised."""
        results: list[Exception | None] = []
        for item in items:
            try:
                key, value = item
            except (TypeError, ValueError):
                results.append(BadRequestError("batch item must be a (key, value) pair"))
                continue
            try:
                self.put(key, value)
                results.append(None)
            except KVStoreError as exc:
                results.append(exc)
        return results

    def batch_get(self, keys: Sequence[ObjectKey]) -> list[bytes | None]:
        """A copy per key; None for absent or still-WRITING keys."""
        checked = [check_key(key) for key in keys]
        index, view = self._index, self._view
        with self._lock:
            out: list[bytes | None] = []
            for key in checked:
                entry = index.objects.get(key)
                if entry is None or not entry.committed:
                    index.counters.misses += entry is None
                    out.append(None)
                    continue
                index.touch(entry)
                out.append(bytes(view[entry.offset : entry.offset + entry.size]))
            return out

    def batch_exists(self, keys: Sequence[ObjectKey]) -> list[bool]:
        checked = [check_key(key) for key in keys]
        with self._lock:
            return [key in self._index.lru for key in checked]

    # -- admin ------------------------------------------------------------------------------

    def set_evict_callback(self, callback: EvictCallback | None) -> None:
        """Called with (key, read-only bytes) before each eviction; see the module doc."""
        with self._lock:
            self._evict_callback = callback

    def stats(self) -> TierStats:
        with self._lock:
            index, alloc = self._index, self._index.alloc.stats()
            counters = index.counters
            return TierStats(
                tier=Tier.DRAM,
                capacity=alloc.capacity,
                used=alloc.used,
                objects=len(index.lru),
                hits=counters.hits,
                misses=counters.misses,
                evictions=counters.evictions,
                bytes_written=counters.bytes_written,
                bytes_read=counters.bytes_read,
                extra={
                    "fragmentation": alloc.fragmentation,
                    "largest_free": float(alloc.largest_free),
                    "writing": float(len(index.objects) - len(index.lru)),
                    "doomed": float(len(index.doomed)),
                    "evict_callback_errors": float(self._callback_errors),
                },
            )

    def check_integrity(self) -> None:
        """Raise AssertionError unless entries, LRU and allocator agree."""
        with self._lock:
            self._index.check_integrity(self._closed)

    def close(self) -> None:
        """Drop every object and unmap the segment (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._index.clear()
            self._segment.close()

    def __enter__(self) -> DramTier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DramTier({self._segment.name!r}, capacity={self._config.capacity_bytes})"

    # -- internals (lock held) ----------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise BadRequestError("DRAM tier is closed")

    def _on_evict(self, entry: DramEntry) -> None:
        callback = self._evict_callback
        if callback is None:
            return
        view = self._view[entry.offset : entry.offset + entry.size].toreadonly()
        try:
            callback(entry.key, view)
        except Exception:
            self._callback_errors += 1
            log.exception("evict callback failed for %r; evicting anyway", entry.key)
        finally:
            with contextlib.suppress(BufferError):  # the callback kept an export of it
                view.release()

    def _release(self, entry: DramEntry) -> None:
        with self._lock:
            if not self._closed:
                self._index.release(entry)

    def _writing_entry(self, handle: DramWriteHandle) -> DramEntry:
        if not isinstance(handle, DramWriteHandle) or handle._owner is not self:
            raise BadRequestError("not an open write handle of this tier")
        self._check_open()
        return handle._entry


class DramWriteHandle:
    """A reserved object: fill `buffer` (exactly `size` bytes), then commit or abort
    it through the tier that made it (`owner`)."""

    __slots__ = ("_entry", "_owner", "_view", "key", "size")

    def __init__(self, owner: object, entry: DramEntry, view: memoryview) -> None:
        self.key = entry.key
        self.size = entry.size
        self._owner: object | None = owner
        self._entry = entry
        self._view: memoryview | None = view

    @property
    def buffer(self) -> memoryview:
        if self._view is None:
            raise BadRequestError(f"write handle of {self.key!r} is already committed or aborted")
        return self._view

    def _finish(self) -> None:
        self._owner = None
        self._view = None

    def __repr__(self) -> str:
        state = "open" if self._view is not None else "finished"
        return f"DramWriteHandle({self.key!r}, size={self.size}, {state})"


class DramReadHandle:
    """A committed object held against eviction and freeing until `release`, which
    calls `on_release` once (as the SSD and HBM read handles do)."""

    __slots__ = ("_on_release", "_view", "key", "size")

    def __init__(
        self, key: ObjectKey, size: int, view: memoryview, on_release: Callable[[], None]
    ) -> None:
        self.key = key
        self.size = size
        self._view: memoryview | None = view
        self._on_release: Callable[[], None] | None = on_release

    @property
    def buffer(self) -> memoryview:
        """The object's bytes, read-only, valid until `release`."""
        if self._view is None:
            raise BadRequestError(f"read handle of {self.key!r} is released")
        return self._view

    def release(self) -> None:
        """Drop the hold (idempotent)."""
        on_release, self._on_release, self._view = self._on_release, None, None
        if on_release is not None:
            on_release()

    def __enter__(self) -> DramReadHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "held" if self._view is not None else "released"
        return f"DramReadHandle({self.key!r}, size={self.size}, {state})"


def check_size(size: object, capacity: int) -> int:
    """A valid object size: a positive int no larger than the tier."""
    if not isinstance(size, int) or isinstance(size, bool):
        raise BadRequestError(f"size must be an int, got {type(size).__name__}")
    if size <= 0:
        raise BadRequestError(f"size must be positive, got {size}")
    if size > capacity:
        raise TooLargeError(f"{size} bytes exceed the tier's capacity of {capacity}")
    return size
