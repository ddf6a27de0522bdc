"""Mooncake's `BufferPool` / `BufferLease`: registered host buffers handed out by size.

The behaviour of Mooncake's native pool (mooncake-integration/store/buffer_pool.cpp at
3b5a594): its arguments and defaults, capacity `max_bytes` (0: twice the store's
`local_buffer_size`, else at least that), `max_regions` leases at once, blocking or not
(`block_on_exhaustion`, `block`, `timeout`), RuntimeError with Mooncake's messages for
what it refuses, a lease that cannot be released while views of it exist, and a pool that
cannot be closed while leases are out. Unlike the pool methods of the store, these raise:
Mooncake's do.

Mooncake carves leases out of the store's local buffer first and registers an aligned
overflow allocation past it; the facade has no local buffer (docs/mooncake_compat.md), so
every lease is its own page-aligned anonymous mapping (zeroed, backed when touched),
registered with the store for its lifetime.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import threading
import time
from typing import Any

PAGE = mmap.PAGESIZE


class BufferLease:
    """One registered buffer: `ptr`, `size`, `buffer` (a new memoryview each time);
    `release()` (or leaving a `with` block, or the lease's garbage collection) returns it."""

    def __init__(self, pool: BufferPool, memory: mmap.mmap, ptr: int, size: int) -> None:
        self._pool: BufferPool | None = pool
        self._memory: mmap.mmap | None = memory
        self._ptr = ptr
        self._size = size

    @property
    def ptr(self) -> int:
        if self._memory is None:
            raise RuntimeError("buffer lease is closed")
        return self._ptr

    @property
    def size(self) -> int:
        return self._size

    @property
    def buffer(self) -> memoryview:
        if self._memory is None:
            raise RuntimeError("buffer lease is closed")
        return memoryview(self._memory)[: self._size]

    def release(self) -> None:
        self._release(check_views=True)

    def _release(self, check_views: bool) -> None:
        pool, memory = self._pool, self._memory
        if pool is None or memory is None:
            return
        if check_views:
            try:
                memory.close()  # BufferError while any memoryview of it is alive
            except BufferError:
                raise RuntimeError("cannot release buffer while exported views exist") from None
        self._pool = self._memory = None
        pool._release(self._ptr)

    def __enter__(self) -> BufferLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # a destructor must not raise (Mooncake's neither)
            self._release(check_views=False)


class BufferPool:
    """Hands out registered buffers of `size` bytes, up to `max_bytes` and `max_regions`."""

    def __init__(self, store: Any, max_bytes: int = 0, min_size_class: int = 64 * 1024,
                 max_size_class: int | None = None, alignment: int = 8 * 1024 * 1024,
                 block_on_exhaustion: bool = True, default_timeout: float | None = None,
                 max_regions: int | None = None, prewarm_size: int | None = None,
                 prewarm_count: int = 0) -> None:  # fmt: skip
        if store is None or getattr(store, "_client", None) is None:
            raise RuntimeError("MooncakeDistributedStore is not initialized")
        if min_size_class <= 0 or alignment <= 0:
            raise RuntimeError("min_size_class and alignment must be positive")
        if alignment < ctypes.sizeof(ctypes.c_void_p) or alignment & (alignment - 1):
            raise RuntimeError("alignment must be a power of two and at least sizeof(void*)")
        local = int(getattr(store, "_local_buffer", 0))
        if local <= 0:
            raise RuntimeError("BufferPool requires a store configured with a local buffer")
        self._store = store
        self._max_bytes = 2 * local if max_bytes == 0 else max(int(max_bytes), local)
        self._max_size_class = self._max_bytes if max_size_class is None else max_size_class
        self._block = bool(block_on_exhaustion)
        self._timeout = default_timeout
        self._max_regions = max_regions
        self._regions: dict[int, tuple[mmap.mmap, int]] = {}  # ptr -> (memory, bytes)
        self._total = 0
        self._closed = False
        self._cond = threading.Condition()
        if prewarm_size is not None and prewarm_count > 0:
            self.prewarm(prewarm_size, prewarm_count)

    def acquire(self, size: int, block: bool | None = None,
                timeout: float | None = None) -> BufferLease:  # fmt: skip
        """A registered lease of `size` bytes (0 allowed). Past capacity: wait (`block`,
        default `block_on_exhaustion`) up to `timeout` seconds, else RuntimeError."""
        should_block = self._block if block is None else bool(block)
        timeout_s = self._timeout if timeout is None else timeout
        if timeout_s is not None and timeout_s < 0:
            raise RuntimeError("timeout must be non-negative")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        need = max(int(size), 1)
        if need > self._max_bytes:
            raise RuntimeError("requested buffer size exceeds pool capacity")
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("buffer pool is closed")
                if self._has_room(need):
                    return self._lease(need, int(size))
                if not should_block:
                    raise RuntimeError("buffer pool is exhausted")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise RuntimeError("timed out waiting for buffer")
                self._cond.wait(left)

    buffer = acquire

    def prewarm(self, size: int, count: int) -> None:
        """Nothing to warm (Mooncake's is a no-op too): leases are mapped on demand."""

    def close(self) -> None:
        """Close the pool; RuntimeError while leases are out (release them first)."""
        with self._cond:
            if self._closed:
                return
            if self._regions:
                raise RuntimeError("cannot close buffer pool with active leases")
            self._closed = True
            self._cond.notify_all()

    def check_integrity(self) -> None:
        with self._cond:
            assert self._total == sum(n for _, n in self._regions.values()), "byte count drifted"
            assert self._total <= self._max_bytes, "leases exceed max_bytes"
            assert self._max_regions is None or len(self._regions) <= self._max_regions
            assert all(ptr % PAGE == 0 for ptr in self._regions), "a lease is misaligned"

    # -- internals (called with self._cond held, except _release) -----------------

    def _has_room(self, need: int) -> bool:
        if self._total + need > self._max_bytes:
            return False
        return self._max_regions is None or len(self._regions) < self._max_regions

    def _lease(self, need: int, size: int) -> BufferLease:
        memory = mmap.mmap(-1, need, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        anchor = ctypes.c_char.from_buffer(memory)
        ptr = ctypes.addressof(anchor)
        del anchor  # its export of `memory` goes with it (release() checks for exports)
        code = self._store.register_buffer(ptr, need)
        if code != 0:
            memory.close()
            raise RuntimeError(f"overflow buffer registration failed ({code})")
        self._regions[ptr] = (memory, need)
        self._total += need
        return BufferLease(self, memory, ptr, size)

    def _release(self, ptr: int) -> None:
        with self._cond:
            region = self._regions.pop(ptr, None)
            if region is None:
                raise RuntimeError("buffer lease is not active")
            self._total -= region[1]
            self._cond.notify_all()
        code = self._store.unregister_buffer(ptr)
        if code != 0:
            raise RuntimeError(f"overflow buffer unregistration failed ({code})")
