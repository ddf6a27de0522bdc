"""The SSD tier's index: object key -> (offset, length, checksum, generation) in RocksDB.

Bound through `rocksdict` with `Options(raw_mode=True)` (bytes in, bytes out, no
pickling) and the write-ahead log on: an entry whose `put` returned survives a
kill -9 of the process (measured: with the WAL off RocksDB lost 20-28 completed
puts per kill; with it on, none). See docs/ssd.md for the binding choice.

An entry is written only after its bytes are in the slab file, and deleted
before its space is freed, so the index never names bytes that are not there.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import xxhash
from rocksdict import Options, Rdict, WriteOptions

from kvstore.errors import IOFaultError, KVStoreError, NoSpaceError

_ENTRY = struct.Struct("<QQQQ")  # offset, length, checksum (xxh3_64), generation

HEAL_FREE_BYTES = 1 << 20

checksum_of = xxhash.xxh3_64_intdigest  # 43 GB/s here vs 4 GB/s for zlib.crc32


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """Where one committed object lives in the slab file, and its checksum."""

    offset: int
    length: int
    checksum: int
    generation: int

    def encode(self) -> bytes:
        return _ENTRY.pack(self.offset, self.length, self.checksum, self.generation)

    @classmethod
    def decode(cls, raw: bytes) -> IndexEntry | None:
        """None when `raw` is not an entry of this format."""
        if len(raw) != _ENTRY.size:
            return None
        return cls(*_ENTRY.unpack(raw))


class SsdIndexError(IOFaultError):
    """RocksDB failed a read or write of the index."""


def _map_error(exc: Exception, what: str) -> KVStoreError:
    text = str(exc)
    if "No space left" in text or "ENOSPC" in text:
        return NoSpaceError(f"index {what}: no space left on device")
    return SsdIndexError(f"index {what}: {text}")


def _free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class SsdIndex:
    """A durable map of str keys to IndexEntry, one RocksDB database.

    A failed write (e.g. ENOSPC on the WAL) leaves RocksDB refusing all writes,
    and the failed record may or may not be in the WAL. So the index remembers
    how to undo it, and before the next write reopens the database and applies
    the undo: the entries on disk again match what the tier believes.
    """

    def __init__(self, path: str, sync: bool = False) -> None:
        self._path = path
        self._write = WriteOptions()
        # properties at run time (rocksdict's stub declares disable_wal a method)
        self._write.disable_wal = False  # type: ignore[method-assign, assignment]
        self._write.sync = sync
        self._undo: list[tuple[str, IndexEntry | None]] = []  # (key, entry to restore)
        self._db: Rdict | None = self._open()

    def _open(self) -> Rdict:
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        try:
            return Rdict(self._path, options)
        except Exception as exc:
            raise _map_error(exc, f"open {self._path}") from exc

    def put(self, key: str, entry: IndexEntry) -> None:
        """Make `key` name `entry` (durable against a process crash once returned)."""
        self._write_one(key, entry, undo=None)

    def delete(self, key: str, entry: IndexEntry | None) -> None:
        """Remove `key`, whose current entry is `entry` (restored if this fails)."""
        self._write_one(key, None, undo=entry)

    def _write_one(self, key: str, entry: IndexEntry | None, undo: IndexEntry | None) -> None:
        self._heal()
        try:
            self._apply(key, entry)
        except Exception as exc:
            self._undo.append((key, undo))
            raise _map_error(exc, f"{'put' if entry else 'delete'} {key!r}") from exc

    def _apply(self, key: str, entry: IndexEntry | None) -> None:
        assert self._db is not None
        if entry is None:
            self._db.delete(key.encode(), self._write)
        else:
            self._db.put(key.encode(), entry.encode(), self._write)

    def _heal(self) -> None:
        """After a failed write: reopen RocksDB and undo what may have reached the WAL.

        Reopening writes new files, so it is not tried on a full disk: the old
        handle stays open (reads work) and the write fails with NoSpaceError.
        """
        if not self._undo:
            return
        if self._db is not None:
            if _free_bytes(self._path) < HEAL_FREE_BYTES:
                raise NoSpaceError(f"index {self._path}: disk still full")
            with contextlib.suppress(Exception):  # a failed DB reports its error again
                self._db.close()
            self._db = None
        self._db = self._open()
        while self._undo:
            key, entry = self._undo[0]
            try:
                self._apply(key, entry)
            except Exception as exc:
                raise _map_error(exc, f"undo of {key!r}") from exc
            self._undo.pop(0)

    def get(self, key: str) -> IndexEntry | None:
        """The entry of `key`; None when absent or undecodable."""
        if self._db is None:
            self._heal()
        assert self._db is not None
        raw = self._db.get(key.encode())
        return None if raw is None else IndexEntry.decode(bytes(raw))

    def items(self) -> Iterator[tuple[str, IndexEntry | None]]:
        """Every (key, entry) pair; entry is None for an undecodable value."""
        if self._db is None:
            self._heal()
        assert self._db is not None
        for raw_key, raw_value in self._db.items():
            yield bytes(raw_key).decode(), IndexEntry.decode(bytes(raw_value))  # type: ignore[arg-type]

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
