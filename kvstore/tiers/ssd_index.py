"""The SSD tier's index: object key -> (offset, length, checksum, generation) in RocksDB.

Bound through `rocksdict` with `Options(raw_mode=True)` (bytes in, bytes out, no
pickling) and the write-ahead log on: an entry whose `put` returned survives a
kill -9 of the process (measured: with the WAL off RocksDB lost 20-28 completed
puts per kill; with it on, none). See docs/ssd.md for the binding choice.

An entry is written only after its bytes are in the slab file, and deleted
before its space is freed, so the index never names bytes that are not there.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from rocksdict import Options, Rdict, WriteOptions

from kvstore.errors import KVStoreError, NoSpaceError

_ENTRY = struct.Struct("<QQQQ")  # offset, length, checksum (xxh3_64), generation


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


class SsdIndexError(KVStoreError):
    """RocksDB failed a read or write of the index."""

    grpc_code = "INTERNAL"


def _map_error(exc: Exception, what: str) -> KVStoreError:
    text = str(exc)
    if "No space left" in text or "ENOSPC" in text:
        return NoSpaceError(f"index {what}: no space left on device")
    return SsdIndexError(f"index {what}: {text}")


class SsdIndex:
    """A durable map of str keys to IndexEntry, one RocksDB database."""

    def __init__(self, path: str, sync: bool = False) -> None:
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        try:
            self._db = Rdict(path, options)
        except Exception as exc:
            raise _map_error(exc, f"open {path}") from exc
        self._write = WriteOptions()
        self._write.disable_wal = False
        self._write.sync = sync

    def put(self, key: str, entry: IndexEntry) -> None:
        try:
            self._db.put(key.encode(), entry.encode(), self._write)
        except Exception as exc:
            raise _map_error(exc, f"put {key!r}") from exc

    def delete(self, key: str) -> None:
        try:
            self._db.delete(key.encode(), self._write)
        except Exception as exc:
            raise _map_error(exc, f"delete {key!r}") from exc

    def items(self) -> Iterator[tuple[str, IndexEntry | None]]:
        """Every (key, entry) pair; entry is None for an undecodable value."""
        for raw_key, raw_value in self._db.items():
            yield bytes(raw_key).decode(), IndexEntry.decode(bytes(raw_value))

    def close(self) -> None:
        self._db.close()
