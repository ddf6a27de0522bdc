"""Pre-faulting a peer's mapping of a shared segment in the background.

A process that maps a same-host node's segment (kvstore.tiers.shm `attach`) copies
into and out of it with memcpy; every page it touches first costs a page fault. Mapping
with MAP_POPULATE moves those faults into the mmap call, but for the whole segment at
once: a client's first put into a 1.3 GiB node segment took 146 ms here, against 3 ms
for the next ones (a 64-object benchmark's mean put grew by 2.3 ms from it alone).
`Prefaulter` instead maps lazily and has a thread populate the mapping in 4 MiB steps,
lowest offsets first (where a bump allocator places first), with
madvise(MADV_POPULATE_WRITE or _READ) (Linux 5.14+), which faults the pages in without
touching their bytes and releases the GIL (a ctypes call). A copy that runs ahead of it
takes its own faults, as without populating. Where the kernel refuses the advice,
`supported()` is False and the caller maps with MAP_POPULATE as before.

Why small steps: each step holds the process's memory map (mmap_lock) for reading, and
every mmap/munmap of the process (a large malloc) waits for the step to end. In 64 MiB
steps (~15 ms each here) the caller's own allocations stalled: Mooncake's harness,
which builds a fresh payload per put, spent ~3 ms more per 16 MiB put and ~0.4 ms more
per 1 MiB put around our calls. In 4 MiB steps that is gone and the copies still find
their pages mapped (docs/performance.md). Not populating at all costs every first touch
of a page a fault: a 16 MiB put into a fresh range then took ~8.7 ms against ~4 ms.

The thread holds the mmap object, so the range cannot be unmapped (and reused by
another mapping) under it; `stop()` makes it end after its current step and waits.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import mmap
import threading

import numpy as np

MADV_POPULATE_READ, MADV_POPULATE_WRITE = 22, 23  # <linux/mman.h>, since 5.14
STEP_BYTES = 4 << 20

_libc = ctypes.CDLL(None, use_errno=True)
_madvise = _libc.madvise
_madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_madvise.restype = ctypes.c_int


def _advise(address: int, length: int, advice: int) -> int:
    """madvise(); 0 or the errno."""
    if _madvise(address, length, advice) == 0:
        return 0
    return ctypes.get_errno() or errno.EINVAL


@functools.cache
def supported() -> bool:
    """Whether this kernel takes MADV_POPULATE_READ/WRITE (probed once on a scratch page)."""
    scratch = mmap.mmap(-1, mmap.PAGESIZE)
    try:
        return _advise(_address(scratch), mmap.PAGESIZE, MADV_POPULATE_WRITE) == 0
    finally:
        scratch.close()


def _address(mapping: mmap.mmap) -> int:
    # through a numpy view (read-only mappings too), dropped at once so that the
    # mapping can still be closed
    return int(np.frombuffer(mapping, np.uint8).ctypes.data)


class Prefaulter:
    """Populates `mapping` (writable or not) on a daemon thread; see the module doc."""

    def __init__(self, mapping: mmap.mmap, size: int, writable: bool, name: str) -> None:
        self.done = threading.Event()  # set when the thread ended, whole or stopped
        self.populated = 0  # bytes populated so far
        self._stop = threading.Event()
        advice = MADV_POPULATE_WRITE if writable else MADV_POPULATE_READ
        self._thread = threading.Thread(
            target=self._run, args=(mapping, _address(mapping), size, advice),
            name=f"kvstore-prefault-{name[:32]}", daemon=True,
        )  # fmt: skip
        self._thread.start()

    def _run(self, mapping: mmap.mmap, address: int, size: int, advice: int) -> None:
        try:
            while self.populated < size and not self._stop.is_set():
                step = min(STEP_BYTES, size - self.populated)
                if _advise(address + self.populated, step, advice):
                    return  # out of memory, or refused: the copies fault as they go
                self.populated += step
        finally:
            del mapping  # (held until here: the range stays mapped while advised)
            self.done.set()

    def stop(self) -> None:
        """End after the current step; returns once the thread has ended."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
