"""The SSD tier: objects in one preallocated slab file, located by a RocksDB index.

Commit protocol (why a kill -9 never exposes a partial object):

    reserve: allocate a slab range (in memory only; invisible)
    commit:  write the bytes (O_DIRECT, or buffered + fdatasync)
             -> put key -> (offset, length, xxh3_64, generation) in the index (WAL on)
             -> visible
    remove:  delete the index entry -> free the range (at the last reader's release)

At open the allocator is rebuilt from the index alone, so bytes written without
an index entry are free space; with `verify_on_open` every checksum is checked
and bad entries are dropped. This is the last tier: when full it evicts the
least recently used object that is neither pinned nor being read.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from kvstore.buffers import byte_view
from kvstore.errors import (
    BadRequestError,
    CorruptError,
    ExistsError,
    KVStoreError,
    NoSpaceError,
    NotReadyError,
    TooLargeError,
    UnavailableError,
)
from kvstore.tiers.allocator import OffsetAllocator
from kvstore.tiers.base import BytesLike, EvictCallback, TierStats
from kvstore.tiers.direct_io import DIRECT, AlignedBuffer
from kvstore.tiers.ssd_batch import BatchRunner
from kvstore.tiers.ssd_handles import (
    SsdConfig,
    SsdObject,
    SsdReadHandle,
    SsdWriteHandle,
    as_bytes,
)
from kvstore.tiers.ssd_recovery import check_consistency
from kvstore.tiers.ssd_store import SlabStore
from kvstore.types import ObjectKey, Tier, check_key

__all__ = ["SsdConfig", "SsdTier"]


class SsdTier:
    """Byte objects by key on local SSD; implements `ObjectTier`. Thread-safe."""

    tier = Tier.SSD

    def __init__(self, config: SsdConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._objects: OrderedDict[ObjectKey, SsdObject] = OrderedDict()  # LRU first
        self._writing: dict[ObjectKey, SsdWriteHandle | None] = {}
        self._doomed: dict[int, SsdObject] = {}
        self._evict_cb: EvictCallback | None = None
        self._stats = TierStats(tier=Tier.SSD, capacity=config.capacity_bytes)
        self._closed = False
        self._alloc = OffsetAllocator(config.capacity_bytes, config.alignment)
        self._store = SlabStore(config)
        report = self._store.recover(self._alloc)
        self._objects.update((ObjectKey(key), obj) for key, obj in report.objects)
        self._generation = report.next_generation
        self._stats.extra.update(report.counters())
        self._batch = BatchRunner(config.io_threads, "ssd-batch")

    def reserve(self, key: ObjectKey, size: int) -> SsdWriteHandle:
        """Claim space for `size` bytes under `key` (not visible until commit)."""
        key = check_key(key)
        padded = self.config.padded_size(size)
        with self._lock:
            self._check_open()
            if key in self._writing or key in self._objects:
                raise ExistsError(f"{key!r} is already stored or being written")
            self._writing[key] = None
        try:
            handle = SsdWriteHandle(key, size, self._allocate(padded), padded)
        except BaseException:
            with self._lock:
                del self._writing[key]
            raise
        try:
            handle.staging = self._store.buffers.take(padded)
        except BaseException:
            self._drop_writing(handle)
            raise
        with self._lock:
            self._writing[key] = handle
        return handle

    def commit(self, handle: SsdWriteHandle) -> None:
        """Write the staged bytes to the slab, then index them: now visible."""
        self._commit(handle, None)

    def abort(self, handle: SsdWriteHandle) -> None:
        """Give up a reservation; its space is free at once."""
        self._claim(handle)
        self._drop_writing(handle)

    def put(self, key: ObjectKey, value: BytesLike) -> None:
        """Store a copy of `value` under `key` (ExistsError if the key is taken)."""
        data = as_bytes(value)
        self._commit(self.reserve(key, data.nbytes), data)

    def acquire(self, key: ObjectKey) -> SsdReadHandle | None:
        """Read and verify `key` into an aligned buffer held until release."""
        key = check_key(key)
        obj = self._begin_read(key)
        if obj is None:
            return None
        staging = self._read_held(key, obj, None)
        return SsdReadHandle(key, obj.length, staging, lambda: self._end_read(obj))

    def get(self, key: ObjectKey) -> bytes | None:
        handle = self.acquire(key)
        if handle is None:
            return None
        with handle:
            return bytes(handle.buffer)

    def get_into(self, key: ObjectKey, out: memoryview) -> int | None:
        """Read `key` into `out` (chunks copied as they arrive); its size, or None."""
        key = check_key(key)
        out = byte_view(out, writable=True, what="out")
        obj = self._begin_read(key)
        if obj is None:
            return None
        if obj.length > out.nbytes:
            self._end_read(obj)
            raise TooLargeError(f"{key!r} has {obj.length} bytes, out holds {out.nbytes}")
        self._read_held(key, obj, out[: obj.length]).close()
        self._end_read(obj)
        return obj.length

    def size_of(self, key: ObjectKey) -> int | None:
        key = check_key(key)
        with self._lock:
            obj = self._objects.get(key)
            return obj.length if obj else None

    def exists(self, key: ObjectKey) -> bool:
        key = check_key(key)
        with self._lock:
            return key in self._objects

    def remove(self, key: ObjectKey) -> bool:
        """Delete `key`: index entry first, then its space (at the last release)."""
        key = check_key(key)
        with self._lock:
            self._check_open()
            if key in self._writing:
                raise NotReadyError(f"{key!r} is still being written")
            obj = self._objects.get(key)
            if obj is None:
                return False
            self._remove_locked(key, obj)
            return True

    def batch_put(self, items: Sequence[tuple[ObjectKey, BytesLike]]) -> list[Exception | None]:
        """Put each pair in parallel; per item None or the error it raised."""
        return self._batch.put_all(self.put, items)

    def batch_get(self, keys: Sequence[ObjectKey]) -> list[bytes | None]:
        """Get each key in parallel; None for absent, still written or corrupt (dropped)."""
        checked = [check_key(key) for key in keys]
        return self._batch.get_all(self.get, checked)

    def batch_exists(self, keys: Sequence[ObjectKey]) -> list[bool]:
        checked = [check_key(key) for key in keys]
        with self._lock:
            return [key in self._objects for key in checked]

    def pin(self, key: ObjectKey) -> bool:
        """Protect `key` from eviction; False if absent."""
        key = check_key(key)
        with self._lock:
            obj = self._objects.get(key)
            if obj is None:
                return False
            obj.pins += 1
            return True

    def unpin(self, key: ObjectKey) -> bool:
        """Undo one pin; False if absent or not pinned."""
        key = check_key(key)
        with self._lock:
            obj = self._objects.get(key)
            if obj is None or obj.pins == 0:
                return False
            obj.pins -= 1
            return True

    def keys(self) -> list[ObjectKey]:
        """Committed keys, least recently used first."""
        with self._lock:
            return list(self._objects)

    def set_evict_callback(self, callback: EvictCallback | None) -> None:
        self._evict_cb = callback

    def stats(self) -> TierStats:
        with self._lock:
            s = self._stats
            extra = dict(s.extra, direct_io=float(self._store.mode == DIRECT))
            extra.update(writing=float(len(self._writing)), doomed=float(len(self._doomed)))
            return TierStats(
                Tier.SSD, s.capacity, self._alloc.used, len(self._objects), s.hits,
                s.misses, s.evictions, s.bytes_written, s.bytes_read, extra,
            )  # fmt: skip

    @property
    def io_mode(self) -> str:
        """'direct' (O_DIRECT) or 'buffered' (fallback where the filesystem refuses it)."""
        return self._store.mode

    def check_integrity(self) -> None:
        """Raise AssertionError unless memory, allocator and index agree."""
        with self._lock:
            check_consistency(
                self._objects, self._doomed, self._writing, self._alloc, self._store.index
            )

    def close(self) -> None:
        """Close the slab file and the index; later calls raise UnavailableError."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._batch.shutdown()
        self._store.close()

    # ---- internals ----------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise UnavailableError("SSD tier is closed")

    def _claim(self, handle: SsdWriteHandle) -> None:
        """Take a write handle out of the open state, once."""
        if not isinstance(handle, SsdWriteHandle):
            raise BadRequestError(f"not an SSD write handle: {type(handle).__name__}")
        with self._lock:
            if self._writing.get(handle.key) is not handle or handle.closing:
                raise BadRequestError(f"write handle of {handle.key!r} is not open")
            handle.closing = True

    def _drop_writing(self, handle: SsdWriteHandle) -> None:
        """Roll a reservation back: forget it and free its space."""
        with self._lock:
            if self._writing.get(handle.key) in (handle, None):
                self._writing.pop(handle.key, None)
            self._alloc.free(handle.offset)
        handle.close()

    def _allocate(self, padded: int) -> int:
        """Free space for `padded` bytes, evicting LRU objects as needed."""
        while True:
            with self._lock:
                self._check_open()
                offset = self._alloc.allocate(padded)
                if offset is not None:
                    return offset
                key, obj = self._pick_victim(padded)
                if self._evict_cb is None:
                    self._evict_locked(key, obj)
                    continue
                obj.readers += 1  # held while the callback reads it
            self._offer(key, obj)

    def _pick_victim(self, padded: int) -> tuple[ObjectKey, SsdObject]:
        for key, obj in self._objects.items():
            if obj.readers == 0 and obj.pins == 0:
                return key, obj
        raise NoSpaceError(f"SSD tier full: no evictable object to make room for {padded} bytes")

    def _offer(self, key: ObjectKey, obj: SsdObject) -> None:
        """Show a victim to the evict callback, then evict it unless now held."""
        try:
            staging = self._read_verified(key, obj)
            try:
                if self._evict_cb is not None:
                    self._evict_cb(key, staging.view[: obj.length])
            except Exception:  # the contract: a failing callback aborts nothing
                pass
            finally:
                staging.close()
        except KVStoreError:
            pass  # unreadable: evict it anyway
        with self._lock:
            obj.readers -= 1
            if obj.doomed:
                self._free_doomed_locked(obj)
            elif self._objects.get(key) is obj and obj.readers == 0 and obj.pins == 0:
                self._evict_locked(key, obj)

    def _evict_locked(self, key: ObjectKey, obj: SsdObject) -> None:
        self._remove_locked(key, obj)
        self._stats.evictions += 1

    def _remove_locked(self, key: ObjectKey, obj: SsdObject) -> None:
        self._store.index.delete(key, obj.entry())
        del self._objects[key]
        if obj.readers:
            obj.doomed = True
            self._doomed[obj.offset] = obj
        else:
            self._alloc.free(obj.offset)

    def _free_doomed_locked(self, obj: SsdObject) -> None:
        if obj.readers == 0 and self._doomed.pop(obj.offset, None) is obj:
            self._alloc.free(obj.offset)

    def _begin_read(self, key: ObjectKey) -> SsdObject | None:
        with self._lock:
            self._check_open()
            if key in self._writing:
                raise NotReadyError(f"{key!r} is still being written")
            obj = self._objects.get(key)
            if obj is None:
                self._stats.misses += 1
                return None
            self._objects.move_to_end(key)
            obj.readers += 1
            self._stats.hits += 1
            return obj

    def _end_read(self, obj: SsdObject) -> None:
        with self._lock:
            obj.readers -= 1
            if obj.doomed:
                self._free_doomed_locked(obj)

    def _commit(self, handle: SsdWriteHandle, source: memoryview | None) -> None:
        """Checksum, write (copying `source` in chunk by chunk, if given), index."""
        self._claim(handle)
        try:
            staging = handle.staging
            if staging is None:
                raise BadRequestError(f"write handle of {handle.key!r} is closed")
            checksum = self._store.write(handle.offset, staging, handle.size, source)
            with self._lock:
                self._generation += 1
                obj = SsdObject(
                    handle.offset, handle.size, handle.padded, checksum, self._generation
                )
                self._store.index.put(handle.key, obj.entry())
                del self._writing[handle.key]
                self._objects[handle.key] = obj
                self._stats.bytes_written += handle.size
        except BaseException:
            self._drop_writing(handle)
            raise
        handle.close()

    def _read_held(self, key: ObjectKey, obj: SsdObject, out: memoryview | None) -> AlignedBuffer:
        """Read an object this thread holds; on failure let go (and drop it if corrupt)."""
        try:
            return self._read_verified(key, obj, out)
        except BaseException as exc:
            self._end_read(obj)
            if isinstance(exc, CorruptError):
                self._drop_corrupt(key, obj)
            raise

    def _read_verified(
        self, key: ObjectKey, obj: SsdObject, out: memoryview | None = None
    ) -> AlignedBuffer:
        staging = self._store.read(key, obj, out)
        with self._lock:
            self._stats.bytes_read += obj.length
        return staging

    def _drop_corrupt(self, key: ObjectKey, obj: SsdObject) -> None:
        with self._lock:
            if self._objects.get(key) is obj:
                self._remove_locked(key, obj)
                extra = self._stats.extra
                extra["dropped_corrupt"] = extra.get("dropped_corrupt", 0.0) + 1
