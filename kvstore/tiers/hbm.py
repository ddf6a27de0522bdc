"""The HBM tier: one object = one KV block (all layers, K and V) in a device pool.

Objects follow the state machine of kvstore.tiers.base: reserve -> WRITING ->
commit -> COMMITTED -> remove/evict. Each object owns one pool block (ref count
1); every ReadHandle adds a reference, so a removed object with readers keeps
its block until the last release. When no block is free the least recently used
committed object that is neither pinned nor acquired is evicted, after the evict
callback has seen its bytes (so the tiered store can demote it to DRAM).
`batch_get`/`batch_put` move all their blocks with one batched offload/onload.

A lock serializes all calls; the evict callback runs under it.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from kvstore.errors import (
    BadRequestError,
    ExistsError,
    KVStoreError,
    NoSpaceError,
    NotReadyError,
    TooLargeError,
    UnavailableError,
)
from kvstore.tiers.base import BytesLike, EvictCallback, TierStats
from kvstore.tiers.block_pool import BlockPool
from kvstore.tiers.hbm_handles import HbmReadHandle, HbmWriteHandle
from kvstore.tiers.kv_layout import (
    HbmConfig,
    KVLayout,
    as_byte_array,
    block_to_bytes,
    bytes_into_block,
    writable_block,
)
from kvstore.tiers.kv_pool import HbmKVPool
from kvstore.types import ObjectKey, Tier, check_key

__all__ = [
    "BlockPool",
    "HbmConfig",
    "HbmKVPool",
    "HbmReadHandle",
    "HbmTier",
    "HbmWriteHandle",
    "KVLayout",
]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Entry:
    block_id: int
    committed: bool = False
    pinned: bool = False


class HbmTier:
    """ObjectTier over an HbmKVPool: fixed-size block objects with LRU eviction."""

    tier = Tier.HBM

    def __init__(self, config: HbmConfig) -> None:
        self.config = config
        self.layout = config.layout
        self.kv = HbmKVPool(config)
        self._pool = self.kv.pool
        self._entries: dict[ObjectKey, _Entry] = {}
        self._lru: OrderedDict[ObjectKey, None] = OrderedDict()  # committed, oldest first
        self._held: dict[int, int] = {}  # block id -> outstanding read handles
        self._callback: EvictCallback | None = None
        self._stats = TierStats(tier=Tier.HBM, capacity=config.capacity_bytes)
        self._lock = threading.RLock()
        self._closed = False

    # -- writes -----------------------------------------------------------------

    def reserve(self, key: ObjectKey, size: int) -> HbmWriteHandle:
        key = check_key(key)
        self._check_size(size)
        with self._lock:
            self._check_open()
            block_id = self._claim(key)
            host = self.kv.new_host_buffer(1)[0]
            return HbmWriteHandle(self, key, block_id, host)

    def commit(self, handle: HbmWriteHandle) -> None:
        with self._lock:
            self._check_handle(handle)
            self.kv.onload(handle.host.unsqueeze(0), [handle.block_id])
            handle.done = True
            self._publish(handle.key)

    def abort(self, handle: HbmWriteHandle) -> None:
        with self._lock:
            self._check_handle(handle)
            handle.done = True
            del self._entries[handle.key]
            self._pool.decref(handle.block_id)

    def put(self, key: ObjectKey, value: BytesLike) -> None:
        error = self.batch_put([(key, value)])[0]
        if error is not None:
            raise error

    def batch_put(self, items: Sequence[tuple[ObjectKey, BytesLike]]) -> list[Exception | None]:
        """Put each item; one onload for all accepted ones. Returns an error or None per item."""
        with self._lock:
            self._check_open()
            results: list[Exception | None] = [None] * len(items)
            staged: list[tuple[ObjectKey, int, np.ndarray]] = []
            for i, (key, value) in enumerate(items):
                try:
                    staged.append(self._stage(key, value))
                except KVStoreError as exc:
                    results[i] = exc
            self._write_staged(staged)
            return results

    # -- reads ------------------------------------------------------------------

    def get(self, key: ObjectKey) -> bytes | None:
        with self._lock:
            entry = self._lookup(key)
            if entry is None:
                return None
            host = self.kv.offload([entry.block_id], out=self.kv.host_staging(1))
            self._stats.bytes_read += self.layout.block_bytes
            return bytes(block_to_bytes(host[0]))

    def get_into(self, key: ObjectKey, out: memoryview) -> int | None:
        target = writable_block(out, self.layout)
        with self._lock:
            entry = self._lookup(key)
            if entry is None:
                return None
            self.kv.offload([entry.block_id], out=target)
            self._stats.bytes_read += self.layout.block_bytes
            return self.layout.block_bytes

    def acquire(self, key: ObjectKey) -> HbmReadHandle | None:
        with self._lock:
            entry = self._lookup(key)
            if entry is None:
                return None
            self._pool.incref(entry.block_id)
            self._held[entry.block_id] = self._held.get(entry.block_id, 0) + 1
            size = self.layout.block_bytes
            return HbmReadHandle(key, size, entry.block_id, self._copy_out, self._release)

    def batch_get(self, keys: Sequence[ObjectKey]) -> list[bytes | None]:
        """Bytes per key (None if absent or still being written); one batched offload."""
        checked = [check_key(k) for k in keys]
        with self._lock:
            self._check_open()
            hits = [(i, e.block_id) for i, e in enumerate(map(self._touch, checked)) if e]
            results: list[bytes | None] = [None] * len(checked)
            step = self.config.staging_blocks
            for start in range(0, len(hits), step):
                chunk = hits[start : start + step]
                host = self.kv.offload([b for _, b in chunk], out=self.kv.host_staging(len(chunk)))
                for j, (i, _) in enumerate(chunk):
                    results[i] = bytes(block_to_bytes(host[j]))
            self._stats.bytes_read += len(hits) * self.layout.block_bytes
            return results

    def size_of(self, key: ObjectKey) -> int | None:
        return self.layout.block_bytes if self.exists(key) else None

    def exists(self, key: ObjectKey) -> bool:
        return self.batch_exists([key])[0]

    def batch_exists(self, keys: Sequence[ObjectKey]) -> list[bool]:
        checked = [check_key(k) for k in keys]
        with self._lock:
            self._check_open()
            return [k in self._lru for k in checked]

    def block_id_of(self, key: ObjectKey) -> int | None:
        """The pool block of a committed key, for in-place use (hold it with `acquire`)."""
        key = check_key(key)
        with self._lock:
            entry = self._entries.get(key)
            return entry.block_id if entry is not None and entry.committed else None

    # -- lifecycle --------------------------------------------------------------

    def remove(self, key: ObjectKey) -> bool:
        """Drop a committed key; its block is freed now or at the last release."""
        key = check_key(key)
        with self._lock:
            self._check_open()
            entry = self._entries.get(key)
            if entry is None:
                return False
            if not entry.committed:
                raise NotReadyError(f"{key!r} is being written")
            self._drop(key, entry)
            return True

    def pin(self, key: ObjectKey) -> bool:
        """Protect a committed key from eviction; False if absent. Idempotent."""
        return self._set_pin(key, True)

    def unpin(self, key: ObjectKey) -> bool:
        """Make a committed key evictable again; False if absent."""
        return self._set_pin(key, False)

    def keys(self) -> list[ObjectKey]:
        """Committed keys, least recently used first."""
        with self._lock:
            return list(self._lru)

    def set_evict_callback(self, callback: EvictCallback | None) -> None:
        with self._lock:
            self._callback = callback

    def stats(self) -> TierStats:
        with self._lock:
            s = self._stats
            extra = {"free_blocks": float(self._pool.free_count), "writing": float(self._writing())}
            return TierStats(
                tier=Tier.HBM,
                capacity=s.capacity,
                used=self._pool.used_count * self.layout.block_bytes,
                objects=len(self._lru),
                hits=s.hits,
                misses=s.misses,
                evictions=s.evictions,
                bytes_written=s.bytes_written,
                bytes_read=s.bytes_read,
                extra=extra,
            )

    def check_integrity(self) -> None:
        """Entries, LRU, read holds and pool ref counts agree."""
        with self._lock:
            self._pool.check_integrity()
            owned = {e.block_id for e in self._entries.values()}
            if len(owned) != len(self._entries):
                raise AssertionError("two keys share a block")
            if set(self._lru) != {k for k, e in self._entries.items() if e.committed}:
                raise AssertionError("LRU differs from the committed keys")
            if any(e.pinned and not e.committed for e in self._entries.values()):
                raise AssertionError("a WRITING key is pinned")
            for block_id in owned | set(self._held):
                want = (block_id in owned) + self._held.get(block_id, 0)
                if self._pool.ref_count(block_id) != want:
                    raise AssertionError(f"block {block_id}: ref count != {want}")
            if self._pool.used_count != len(owned | set(self._held)):
                raise AssertionError("pool has in-use blocks nobody owns")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._entries.clear()
            self._lru.clear()
            self._held.clear()
            self.kv.close()

    # -- internals --------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise UnavailableError("HBM tier is closed")

    def _check_size(self, size: int) -> None:
        if not isinstance(size, int) or isinstance(size, bool):
            raise BadRequestError(f"size must be an int, got {type(size).__name__}")
        if size > self.layout.block_bytes:
            raise TooLargeError(f"{size} bytes > one HBM block ({self.layout.block_bytes})")
        if size != self.layout.block_bytes:
            raise BadRequestError(f"HBM objects are exactly {self.layout.block_bytes} bytes")

    def _check_handle(self, handle: HbmWriteHandle) -> None:
        self._check_open()
        if not isinstance(handle, HbmWriteHandle) or handle.owner is not self or handle.done:
            raise BadRequestError("not an open write handle of this tier")

    def _claim(self, key: ObjectKey) -> int:
        """Take a block for a new WRITING key, evicting if needed."""
        if key in self._entries:
            raise ExistsError(f"{key!r} already exists")
        ids = self._pool.allocate(1)
        while ids is None:
            self._evict_one()
            ids = self._pool.allocate(1)
        self._entries[key] = _Entry(ids[0])
        return ids[0]

    def _stage(self, key: ObjectKey, value: BytesLike) -> tuple[ObjectKey, int, np.ndarray]:
        key = check_key(key)
        data = as_byte_array(value)
        self._check_size(data.nbytes)
        return key, self._claim(key), data

    def _write_staged(self, staged: list[tuple[ObjectKey, int, np.ndarray]]) -> None:
        """Copy staged values into host staging and onload them, a chunk at a time."""
        try:
            step = self.config.staging_blocks
            for start in range(0, len(staged), step):
                chunk = staged[start : start + step]
                host = self.kv.host_staging(len(chunk))
                for j, (_, _, data) in enumerate(chunk):
                    bytes_into_block(data, host[j])
                self.kv.onload(host, [block_id for _, block_id, _ in chunk])
        except BaseException:
            for key, block_id, _ in staged:
                del self._entries[key]
                self._pool.decref(block_id)
            raise
        for key, _, _ in staged:
            self._publish(key)

    def _publish(self, key: ObjectKey) -> None:
        self._entries[key].committed = True
        self._lru[key] = None
        self._stats.bytes_written += self.layout.block_bytes

    def _evict_one(self) -> None:
        for key in self._lru:
            entry = self._entries[key]
            if not entry.pinned and self._pool.ref_count(entry.block_id) == 1:
                self._notify_evict(key, entry.block_id)
                self._drop(key, entry)
                self._stats.evictions += 1
                return
        raise NoSpaceError("HBM tier full: every block is pinned, acquired or being written")

    def _notify_evict(self, key: ObjectKey, block_id: int) -> None:
        if self._callback is None:
            return
        host = self.kv.offload([block_id], out=self.kv.host_staging(1))
        try:
            self._callback(key, block_to_bytes(host[0]))
        except Exception:  # the contract: a failing callback aborts nothing
            log.exception("evict callback failed for %r", key)

    def _drop(self, key: ObjectKey, entry: _Entry) -> None:
        del self._entries[key]
        self._lru.pop(key, None)
        self._pool.decref(entry.block_id)

    def _lookup(self, key: ObjectKey) -> _Entry | None:
        """Committed entry (touched, counted) or None; NotReadyError if WRITING."""
        key = check_key(key)
        self._check_open()
        entry = self._entries.get(key)
        if entry is not None and not entry.committed:
            raise NotReadyError(f"{key!r} is being written")
        return self._touch(key)

    def _touch(self, key: ObjectKey) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is None or not entry.committed:
            self._stats.misses += 1
            return None
        self._lru.move_to_end(key)
        self._stats.hits += 1
        return entry

    def _set_pin(self, key: ObjectKey, pinned: bool) -> bool:
        key = check_key(key)
        with self._lock:
            self._check_open()
            entry = self._entries.get(key)
            if entry is None or not entry.committed:
                return False
            entry.pinned = pinned
            return True

    def _writing(self) -> int:
        return sum(not e.committed for e in self._entries.values())

    def _copy_out(self, block_id: int) -> torch.Tensor:
        with self._lock:
            self._check_open()
            return self.kv.offload([block_id])[0]

    def _release(self, block_id: int) -> None:
        with self._lock:
            if self._closed:
                return
            self._held[block_id] -= 1
            if not self._held[block_id]:
                del self._held[block_id]
            self._pool.decref(block_id)
