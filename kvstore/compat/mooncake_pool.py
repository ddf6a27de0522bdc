"""Mooncake's `BufferPool` / `BufferLease`: registered host buffers handed out by size.

Mooncake's pool carves leases out of large registered regions; this one allocates
one page-aligned numpy buffer per lease and registers it with the store (enough
for callers such as Mooncake's store_kv_bench, which takes one lease up front).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from kvstore.errors import BadRequestError, NoSpaceError

PAGE = 4096


class BufferLease:
    """One registered buffer: `ptr`, `size`, `buffer` (a memoryview); `release()` returns it."""

    def __init__(self, pool: BufferPool, memory: np.ndarray, size: int) -> None:
        self._pool = pool
        self._memory = memory
        self.size = size
        self.ptr = int(memory.ctypes.data)
        self.buffer = memoryview(memory)[:size]

    def release(self) -> None:
        self._pool._release(self)


class BufferPool:
    """Hands out registered buffers of at least `size` bytes, up to `max_bytes` in all."""

    def __init__(self, store: Any, max_bytes: int = 0, **_options: Any) -> None:
        self._store = store
        self._max_bytes = max_bytes
        self._leased: dict[int, BufferLease] = {}
        self._lock = threading.Lock()

    def acquire(self, size: int, block: object = None, timeout: object = None) -> BufferLease:
        """A new registered lease; NoSpaceError past `max_bytes` (never blocks)."""
        if size <= 0:
            raise BadRequestError(f"lease size must be > 0, got {size}")
        with self._lock:
            used = sum(lease.size for lease in self._leased.values())
            if self._max_bytes and used + size > self._max_bytes:
                raise NoSpaceError(f"pool of {self._max_bytes} bytes has {used} leased")
            raw = np.zeros(size + PAGE, dtype=np.uint8)
            start = (-raw.ctypes.data) % PAGE
            lease = BufferLease(self, raw[start : start + size], size)
            code = self._store.register_buffer(lease.ptr, size)
            if code != 0:
                raise BadRequestError(f"register_buffer failed with {code}")
            self._leased[lease.ptr] = lease
        return lease

    buffer = acquire

    def prewarm(self, size: int, count: int) -> None:
        """Nothing to warm: leases are allocated on demand."""

    def _release(self, lease: BufferLease) -> None:
        with self._lock:
            if self._leased.pop(lease.ptr, None) is not None:
                self._store.unregister_buffer(lease.ptr)

    def close(self) -> None:
        for lease in list(self._leased.values()):
            lease.release()

    def check_integrity(self) -> None:
        with self._lock:
            used = sum(lease.size for lease in self._leased.values())
            assert not self._max_bytes or used <= self._max_bytes, "leases exceed max_bytes"
            for ptr, lease in self._leased.items():
                assert ptr == lease.ptr and ptr % PAGE == 0, f"lease at {ptr:#x} misindexed"
