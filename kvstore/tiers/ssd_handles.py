"""Config, per-object state and the write/read handles of the SSD tier."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvstore.buffers import byte_view
from kvstore.errors import BadRequestError, TooLargeError
from kvstore.tiers.direct_io import AlignedBuffer, round_up
from kvstore.tiers.ssd_index import IndexEntry
from kvstore.types import ObjectKey


@dataclass(frozen=True, slots=True)
class SsdConfig:
    """One SSD tier: a slab file of `capacity_bytes` and its index under `directory`.

    `sync_index` also fsyncs RocksDB's WAL on each index write: needed to survive
    power loss, not a process crash (the WAL alone covers kill -9).
    """

    directory: str
    capacity_bytes: int
    alignment: int = 4096
    io_threads: int = 4
    direct_io: bool = True
    verify_on_open: bool = True
    sync_index: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.directory, str) or not self.directory:
            raise BadRequestError(f"directory must be a non-empty str, got {self.directory!r}")
        a = self.alignment
        if type(a) is not int or a < 512 or a & (a - 1):
            raise BadRequestError(f"alignment must be a power of two >= 512, got {a!r}")
        c = self.capacity_bytes
        if type(c) is not int or c <= 0 or c % a:
            raise BadRequestError(f"capacity_bytes must be a positive multiple of {a}, got {c!r}")
        if type(self.io_threads) is not int or not 1 <= self.io_threads <= 64:
            raise BadRequestError(f"io_threads must be in 1..64, got {self.io_threads!r}")

    def padded_size(self, size: int) -> int:
        """The slab bytes an object of `size` takes; typed errors for bad sizes."""
        if type(size) is not int or size <= 0:
            raise BadRequestError(f"size must be a positive int, got {size!r}")
        padded = round_up(size, self.alignment)
        if padded > self.capacity_bytes:
            raise TooLargeError(f"{size} bytes exceed the SSD tier ({self.capacity_bytes})")
        return padded


def as_bytes(value: object) -> memoryview:
    """A flat byte view of a non-empty value (what kvstore.buffers.byte_view accepts:
    bytes-like, numpy, CPU torch); BadRequestError otherwise."""
    data = byte_view(value, what="value")
    if not data.nbytes:
        raise BadRequestError("zero-length value")
    return data


@dataclass(slots=True)
class SsdObject:
    """A committed object: its slab range, checksum, and who holds it."""

    offset: int
    length: int
    padded: int
    checksum: int
    generation: int
    readers: int = 0
    pins: int = 0
    doomed: bool = False  # removed while read: freed at the last release

    def entry(self) -> IndexEntry:
        """What the index holds for this object."""
        return IndexEntry(self.offset, self.length, self.checksum, self.generation)


class SsdWriteHandle:
    """A reserved object: fill `buffer` (page-aligned staging), then commit or abort."""

    __slots__ = ("closing", "key", "offset", "padded", "size", "staging")

    def __init__(self, key: ObjectKey, size: int, offset: int, padded: int) -> None:
        self.key = key
        self.size = size
        self.offset = offset
        self.padded = padded
        self.staging: AlignedBuffer | None = None
        self.closing = False

    @property
    def buffer(self) -> memoryview:
        if self.staging is None:
            raise BadRequestError(f"write handle of {self.key!r} is closed")
        return self.staging.view[: self.size]

    def close(self) -> None:
        if self.staging is not None:
            self.staging.close()
            self.staging = None


class SsdReadHandle:
    """A committed object's bytes, read and verified, held against eviction."""

    __slots__ = ("_on_release", "_staging", "key", "size")

    def __init__(
        self,
        key: ObjectKey,
        size: int,
        staging: AlignedBuffer,
        on_release: Callable[[], None],
    ) -> None:
        self.key = key
        self.size = size
        self._staging: AlignedBuffer | None = staging
        self._on_release: Callable[[], None] | None = on_release

    @property
    def buffer(self) -> memoryview:
        if self._staging is None:
            raise BadRequestError(f"read handle of {self.key!r} is released")
        return self._staging.view[: self.size]

    def release(self) -> None:
        """Drop the hold; idempotent."""
        if self._on_release is not None:
            self._on_release()
            self._on_release = None
        if self._staging is not None:
            self._staging.close()
            self._staging = None

    def __enter__(self) -> SsdReadHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
