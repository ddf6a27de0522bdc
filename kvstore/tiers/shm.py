"""Named shared-memory segments in /dev/shm that other processes on the host can map.

Built on os.open + ftruncate + mmap rather than multiprocessing.shared_memory,
whose resource tracker unlinks a segment when any attaching process exits.
Only the creator (owner) unlinks; `close` only unmaps this process's view.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import uuid
from types import TracebackType

import numpy as np

from kvstore.errors import BadRequestError, ExistsError, NoSpaceError, NotFoundError

_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux only; elsewhere fault lazily

SHM_DIR = "/dev/shm"
MAX_NAME_BYTES = 255


def new_segment_name(prefix: str = "kvstore") -> str:
    """A fresh, unique segment name such as 'kvstore-3f2a...'."""
    return check_segment_name(f"{prefix}-{uuid.uuid4().hex}")


def check_segment_name(name: object) -> str:
    """Validate a segment name: a non-empty str without '/' or NUL, at most 255 bytes."""
    if not isinstance(name, str) or not name or name in (".", ".."):
        raise BadRequestError(f"segment name must be a non-empty str, got {name!r}")
    if "/" in name or "\0" in name or len(name.encode()) > MAX_NAME_BYTES:
        raise BadRequestError(f"bad segment name {name!r}: no '/', NUL, or > 255 bytes")
    return name


def _path(name: str) -> str:
    return os.path.join(SHM_DIR, check_segment_name(name))


class SharedSegment:
    """One mapped /dev/shm file. Create (owner) or attach (peer), then read/write
    through `buffer` or `numpy()`. Close unmaps; the owner's `unlink` removes it."""

    def __init__(self, name: str, mapping: mmap.mmap, size: int, owner: bool) -> None:
        self._name = name
        self._mmap: mmap.mmap | None = mapping
        self._view: memoryview | None = memoryview(mapping)
        self._size = size
        self._owner = owner

    @classmethod
    def create(cls, name: str, size: int, populate: bool = True) -> SharedSegment:
        """Create a new segment of `size` bytes (ExistsError if the name is taken).

        `populate` reserves the memory now (posix_fallocate), so a full /dev/shm
        fails here with NoSpaceError instead of a SIGBUS on first write, and maps
        it with MAP_POPULATE, so the first copy into each page does not pay a page
        fault (a cold segment ran at 2.3 GB/s against 12.6 GB/s warm).
        """
        path = _path(name)
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise BadRequestError(f"segment size must be a positive int, got {size!r}")
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        except FileExistsError:
            raise ExistsError(f"shared segment {name!r} already exists") from None
        try:
            os.ftruncate(fd, size)
            if populate:
                _reserve(fd, size, name)
            flags = mmap.MAP_SHARED | (_MAP_POPULATE if populate else 0)
            mapping = mmap.mmap(fd, size, flags, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise
        os.close(fd)
        return cls(name, mapping, size, owner=True)

    @classmethod
    def attach(cls, name: str, writable: bool = False, populate: bool = False) -> SharedSegment:
        """Map an existing segment (NotFoundError if absent); read-only by default.
        `populate` pre-faults the mapping (MAP_POPULATE) for peers that will copy a lot."""
        path = _path(name)
        try:
            fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        except FileNotFoundError:
            raise NotFoundError(f"shared segment {name!r} not found") from None
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                raise BadRequestError(f"shared segment {name!r} is empty")
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            flags = mmap.MAP_SHARED | (_MAP_POPULATE if populate else 0)
            mapping = mmap.mmap(fd, size, flags, prot)
        finally:
            os.close(fd)
        return cls(name, mapping, size, owner=False)

    @property
    def name(self) -> str:
        return self._name

    @property
    def size(self) -> int:
        return self._size

    @property
    def owner(self) -> bool:
        return self._owner

    @property
    def closed(self) -> bool:
        return self._view is None

    @property
    def buffer(self) -> memoryview:
        """The whole segment as bytes (read-only when attached read-only)."""
        if self._view is None:
            raise BadRequestError(f"shared segment {self._name!r} is closed")
        return self._view

    def _mapping(self) -> mmap.mmap:
        if self._mmap is None:
            raise BadRequestError(f"shared segment {self._name!r} is closed")
        return self._mmap

    def numpy(self) -> np.ndarray:
        """A uint8 array over the whole segment (shares memory, no copy)."""
        return np.frombuffer(self._mapping(), dtype=np.uint8)

    def close(self) -> None:
        """Drop this process's mapping. Views still held elsewhere keep the pages
        mapped (never dangling) until they are garbage collected. Idempotent."""
        view, mapping = self._view, self._mmap
        self._view = self._mmap = None
        with contextlib.suppress(BufferError):  # exported views: unmapped when they die
            if view is not None:
                view.release()
            if mapping is not None:
                mapping.close()

    def unlink(self) -> None:
        """Remove the name from /dev/shm (mappings stay valid). Idempotent."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_path(self._name))

    def __enter__(self) -> SharedSegment:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
        if self._owner:
            self.unlink()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"SharedSegment({self._name!r}, size={self._size}, owner={self._owner}, {state})"


def _reserve(fd: int, size: int, name: str) -> None:
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise NoSpaceError(f"no room in {SHM_DIR} for {size} bytes ({name!r})") from exc
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
