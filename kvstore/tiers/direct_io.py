"""Aligned buffers and one preallocated slab file read and written with O_DIRECT.

O_DIRECT bypasses the page cache, so large objects move at device speed without
evicting everything else from host memory. It needs page-aligned buffers,
offsets and lengths; anonymous mmaps are page-aligned. Filesystems without
O_DIRECT (tmpfs) refuse it with EINVAL at open or at the first I/O: the slab
then falls back to buffered I/O plus `os.fdatasync` after each write.

Large transfers are cut into chunks issued from a thread pool (os.pwritev and
os.preadv release the GIL), so several I/Os are in flight at once.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Executor

from kvstore.errors import KVStoreError, NoSpaceError

DIRECT = "direct"
BUFFERED = "buffered"
CHUNK_BYTES = 1 << 20

IoOp = Callable[[int, Sequence[memoryview], int], int]


class SsdIOError(KVStoreError):
    """The OS failed an I/O on the SSD tier (EIO and friends): a device fault."""

    grpc_code = "INTERNAL"


def map_os_error(exc: OSError, what: str) -> KVStoreError:
    """Turn an OSError into a typed kvstore error (ENOSPC/EDQUOT -> NoSpaceError)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return NoSpaceError(f"{what}: no space left on device")
    return SsdIOError(f"{what}: {exc.strerror or exc}")


def round_up(n: int, alignment: int) -> int:
    """The smallest multiple of `alignment` >= n (alignment a power of two)."""
    return (n + alignment - 1) & ~(alignment - 1)


class AlignedBuffer:
    """A page-aligned anonymous mmap; `view` is its whole length, writable."""

    __slots__ = ("_map", "view")

    def __init__(self, size: int) -> None:
        self._map = mmap.mmap(-1, max(size, mmap.PAGESIZE))
        self.view = memoryview(self._map)[:size]

    def close(self) -> None:
        """Unmap now, or at garbage collection if a caller still holds a slice."""
        self.view.release()
        with contextlib.suppress(BufferError):
            self._map.close()


class SlabFile:
    """A fixed-size file of `capacity` bytes for aligned reads and writes."""

    def __init__(self, path: str, capacity: int, alignment: int, want_direct: bool) -> None:
        self.path = path
        self.capacity = capacity
        self.alignment = alignment
        self.mode = BUFFERED
        self._fd = self._open(want_direct)
        self._preallocate()
        if self.mode == DIRECT and not self._probe_direct():
            os.close(self._fd)
            self.mode = BUFFERED
            self._fd = os.open(path, os.O_RDWR)

    def _open(self, want_direct: bool) -> int:
        flags = os.O_RDWR | os.O_CREAT
        if want_direct and hasattr(os, "O_DIRECT"):
            try:
                fd = os.open(self.path, flags | os.O_DIRECT, 0o600)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise map_os_error(exc, f"open {self.path}") from exc
            else:
                self.mode = DIRECT
                return fd
        try:
            return os.open(self.path, flags, 0o600)
        except OSError as exc:
            raise map_os_error(exc, f"open {self.path}") from exc

    def _preallocate(self) -> None:
        """Reserve the blocks now so that writes never hit ENOSPC later."""
        try:
            if os.fstat(self._fd).st_size > self.capacity:
                os.ftruncate(self._fd, self.capacity)
            os.posix_fallocate(self._fd, 0, self.capacity)
        except OSError as exc:
            os.close(self._fd)
            raise map_os_error(exc, f"preallocate {self.capacity} bytes in {self.path}") from exc

    def _probe_direct(self) -> bool:
        """Some filesystems accept O_DIRECT at open and refuse it at I/O time."""
        buf = AlignedBuffer(self.alignment)
        try:
            os.preadv(self._fd, [buf.view], 0)
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                return False
            raise map_os_error(exc, f"read {self.path}") from exc
        finally:
            buf.close()
        return True

    def write(self, offset: int, data: memoryview, pool: Executor | None) -> None:
        """Write aligned `data` at `offset` (both multiples of the alignment)."""
        self._run(os.pwritev, offset, data, pool)
        if self.mode == BUFFERED:
            try:
                os.fdatasync(self._fd)
            except OSError as exc:
                raise map_os_error(exc, f"fdatasync {self.path}") from exc

    def read(self, offset: int, out: memoryview, pool: Executor | None) -> None:
        """Fill aligned `out` from `offset`."""
        self._run(os.preadv, offset, out, pool)

    def read_new(self, offset: int, size: int, pool: Executor | None) -> AlignedBuffer:
        """Read `size` aligned bytes from `offset` into a new AlignedBuffer."""
        buf = AlignedBuffer(size)
        try:
            self.read(offset, buf.view, pool)
        except BaseException:
            buf.close()
            raise
        return buf

    def _run(self, op: IoOp, offset: int, view: memoryview, pool: Executor | None) -> None:
        if offset % self.alignment or len(view) % self.alignment:
            raise ValueError(f"unaligned I/O offset={offset} length={len(view)}")
        if offset + len(view) > self.capacity:
            raise ValueError(f"I/O past the end: offset={offset} length={len(view)}")
        chunks = [(offset + i, view[i : i + CHUNK_BYTES]) for i in range(0, len(view), CHUNK_BYTES)]
        if pool is None or len(chunks) == 1:
            for off, part in chunks:
                self._io_full(op, off, part)
            return
        futures = [pool.submit(self._io_full, op, off, part) for off, part in chunks[1:]]
        first_error: BaseException | None = None
        try:
            self._io_full(op, *chunks[0])
        except BaseException as exc:  # wait for the rest before reporting
            first_error = exc
        for fut in futures:
            exc = fut.exception()
            first_error = first_error or exc
        if first_error is not None:
            raise first_error

    def _io_full(self, op: IoOp, offset: int, view: memoryview) -> None:
        """One pwritev/preadv, repeated until the whole view moved (short I/O)."""
        done = 0
        while done < len(view):
            try:
                n = op(self._fd, [view[done:]], offset + done)
            except OSError as exc:
                raise map_os_error(exc, f"{op.__name__} {self.path}@{offset + done}") from exc
            if n == 0:
                raise SsdIOError(f"{op.__name__} {self.path}@{offset + done}: end of file")
            done += n

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
