"""`alloc_from_mem_pool`: host memory a Mooncake caller writes into and registers.

Mooncake's dummy client maps one shared-memory region per call (memfd, populated at
once) that its real-client process can reach. Here a call maps private anonymous
memory with MAP_NORESERVE: the size is only reserved address space, a page gets memory
when first touched, so a large request costs nothing until it is used. The mappings
live until the store's `close()` (Mooncake frees them with the client too).
"""

from __future__ import annotations

import ctypes
import mmap
import threading

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]  # fmt: skip
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value
_FLAGS = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0x4000)


class MemPool:
    """Lazily backed anonymous mappings handed out by address; all unmapped at `release`."""

    def __init__(self) -> None:
        self._maps: dict[int, int] = {}  # address -> size
        self._lock = threading.Lock()

    def alloc(self, size: int) -> int:
        """The address of `size` fresh zeroed bytes, or 0 (Mooncake's "no memory")."""
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            return 0
        addr = _libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, _FLAGS, -1, 0)
        if addr is None or addr == _MAP_FAILED:
            return 0
        with self._lock:
            self._maps[int(addr)] = size
        return int(addr)

    def allocated(self) -> int:
        """Bytes of address space handed out (not resident memory)."""
        with self._lock:
            return sum(self._maps.values())

    def release(self) -> None:
        """Unmap every allocation (the caller must no longer use them)."""
        with self._lock:
            maps, self._maps = self._maps, {}
        for addr, size in maps.items():
            _libc.munmap(addr, size)
