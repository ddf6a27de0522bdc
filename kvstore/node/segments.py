"""Memory a process lends to the pool: a DRAM segment (anonymous shared memory that
same-host peers map by fd; the kernel frees it when the last user exits) or an SSD
segment (a preallocated file on disk, mmap'd, served over TCP only).

Both expose `buffer`, a writable memoryview over the whole segment, which the
TransferServer serves one-sided; the master allocates inside it.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import uuid
from dataclasses import dataclass

from kvstore.errors import BadRequestError, ExistsError, NoSpaceError
from kvstore.tiers.shm import SharedSegment, check_segment_name
from kvstore.types import Tier


def segment_name(owner: str, tier: Tier) -> str:
    """A fresh name, unique on the host: "kvs-<owner>-<tier>-<uuid8>" ('/' replaced)."""
    safe = owner.replace("/", "_").replace("\0", "_")[:160]
    return check_segment_name(f"kvs-{safe}-{tier.name.lower()}-{uuid.uuid4().hex[:8]}")


@dataclass(slots=True)
class LocalSegment:
    """One lent segment: its name, tier, memory and how to release it."""

    name: str
    tier: Tier
    buffer: memoryview
    shm: bool  # True: shared memory that same-host peers may map (by fd, see shm_socket)
    _shared: SharedSegment | None = None
    _mmap: mmap.mmap | None = None
    _path: str | None = None

    @property
    def size(self) -> int:
        return self.buffer.nbytes

    @property
    def shm_socket(self) -> str:
        """Address of the fd server that hands this segment to peers ("" for SSD)."""
        return self._shared.address if self._shared is not None else ""

    def close(self) -> None:
        """Unmap (DRAM: stop serving its fd too) and remove the backing file. Idempotent."""
        if self._shared is not None:
            self._shared.close()
            self._shared = None
        if self._mmap is not None:
            with contextlib.suppress(BufferError):  # views still held: unmapped when they die
                self.buffer.release()
                self._mmap.close()
            self._mmap = None
        if self._path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path)
            self._path = None


def create_dram(owner: str, size: int) -> LocalSegment:
    """A new shared-memory segment of `size` bytes, reserved now (NoSpaceError if memory
    is short), served by fd to same-host peers through this process's fd server."""
    shared = SharedSegment.create(segment_name(owner, Tier.DRAM), size)
    try:
        shared.serve()
    except BaseException:
        shared.close()
        raise
    return LocalSegment(shared.name, Tier.DRAM, shared.buffer, True, _shared=shared)


def create_ssd(owner: str, directory: str, size: int) -> LocalSegment:
    """A new preallocated file of `size` bytes in `directory`, mapped shared."""
    if size <= 0:
        raise BadRequestError(f"SSD segment size must be > 0, got {size}")
    name = segment_name(owner, Tier.SSD)
    path = os.path.join(directory, name + ".seg")
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except FileExistsError:
        raise ExistsError(f"SSD segment file {path!r} already exists") from None
    try:
        _preallocate(fd, size, path)
        mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)
    return LocalSegment(name, Tier.SSD, memoryview(mapping), False, _mmap=mapping, _path=path)


def _preallocate(fd: int, size: int, path: str) -> None:
    os.ftruncate(fd, size)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise NoSpaceError(f"no room for {size} bytes in {path!r}") from exc
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
