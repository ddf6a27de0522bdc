"""A storage node's SSD segment: the SSD tier's slab file and index, lent to the pool.

The same persistent half as the in-process `SsdTier` (`SlabStore`: one O_DIRECT
slab file with a buffered fallback, a RocksDB index with its WAL on, xxh3 per
object), but the master places objects in it: peers write and read byte ranges
at offsets the master allocated (multiples of `alignment`), through staging
buffers, over TCP (`read_range` / `write_range`, see TransferServer).

Durability follows the master's commit, never the raw writes:

    write_range(offset)     bytes on disk; (length, checksum) kept in memory only
    persist(key, offset)    the index names key -> (offset, length, checksum):
                            from here on a restart announces the object
    forget(key, offset)     the index entry goes (the object left this segment)

so bytes written by a put that was never committed are free space after a
restart, and a committed object survives a SIGKILL of the node. At open,
`recover()` rebuilds from the index and verifies every object's checksum
(corrupt ones are dropped from the index), returning what to announce.

The directory records which node owns it (`node.json`): opening it under
another node id is refused, so two nodes never serve one slab.

Same-host peers may also get the slab's fd (`serve`: the node's fd server, gated
like its DRAM segments' in secured mode) and pread/pwrite their ranges themselves
(kvstore.transfer.file): no TCP copy and no node thread in between. Such writes
leave no record here, so `persist` then records the checksum the writer committed
without reading the bytes back; every read verifies it and a reopen verifies it
again, so bytes that do not match are never served.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvstore.errors import BadRequestError, CorruptError, IOFaultError, KVStoreError, NotFoundError
from kvstore.tiers.allocator import OffsetAllocator
from kvstore.tiers.direct_io import copy_bytes
from kvstore.tiers.ssd_handles import SsdConfig
from kvstore.tiers.ssd_index import IndexEntry, checksum_of
from kvstore.tiers.ssd_store import SlabStore
from kvstore.types import Tier

if TYPE_CHECKING:
    from kvstore.tiers.shm import FdServer

IDENTITY_FILE = "node.json"


class PayloadError(KVStoreError):
    """Marker mix-in: the failing request's payload was already read off the socket."""

    payload_consumed = True


class SsdWriteError(PayloadError, IOFaultError):
    """The bytes arrived but could not be written to the slab."""


@dataclass(frozen=True, slots=True)
class Survivor:
    """A committed object found at open: what the node announces to the master."""

    key: str
    offset: int
    length: int
    checksum: int


class SsdSegment:
    """Slab + index in `directory`, `capacity` bytes, owned by `node_id`."""

    tier = Tier.SSD
    shm = False

    def __init__(
        self, directory: str, capacity: int, node_id: str, *, alignment: int = 4096,
        direct_io: bool = True, io_threads: int = 4, name: str | None = None,
    ) -> None:  # fmt: skip
        check_directory(directory)
        claim_directory(directory, node_id, capacity, alignment)
        padded = capacity - capacity % alignment
        config = SsdConfig(directory, padded, alignment, io_threads, direct_io, True)
        self.config = config
        self.node_id = node_id
        self.name = name or f"kvs-{_safe(node_id)}-ssd"
        self.store = SlabStore(config)
        self._lock = threading.Lock()
        self._written: dict[int, tuple[int, int]] = {}  # offset -> (length, checksum)
        self._generation = 0
        self.survivors: list[Survivor] = []
        self.dropped_at_open = 0
        self._server: FdServer | None = None
        self.closed = False

    owner = True  # FdServer's word for "this process opened it" (SharedSegment's too)

    @property
    def nbytes(self) -> int:
        return self.config.capacity_bytes

    @property
    def size(self) -> int:
        return self.config.capacity_bytes

    @property
    def alignment(self) -> int:
        return self.config.alignment

    @property
    def io_mode(self) -> str:
        return self.store.mode

    # ---- open -------------------------------------------------------------------

    def recover(self) -> list[Survivor]:
        """Rebuild from the index, verifying every checksum; the objects that survive."""
        alloc = OffsetAllocator(self.config.capacity_bytes, self.config.alignment)
        report = self.store.recover(alloc)
        self._generation = report.next_generation
        self.dropped_at_open = report.dropped_invalid + report.dropped_corrupt
        self.survivors = [
            Survivor(key, obj.offset, obj.length, obj.checksum) for key, obj in report.objects
        ]
        return self.survivors

    # ---- the data plane (TransferServer) ---------------------------------------

    def _check(self, offset: int, length: int) -> int:
        """The padded length of a valid range, else BadRequestError."""
        if offset % self.config.alignment:
            raise BadRequestError(f"offset {offset} is not a multiple of {self.alignment}")
        padded = self.config.padded_size(length)
        if offset + padded > self.config.capacity_bytes:
            raise BadRequestError(f"range [{offset}, +{length}) is outside the SSD segment")
        return padded

    def read_range(self, offset: int, length: int) -> tuple[memoryview, Callable[[], None]]:
        """Read [offset, offset+length) from the slab into a staging buffer."""
        padded = self._check(offset, length)
        staging = self.store.buffers.take(padded)
        try:
            self.store.slab.read(offset, staging.view[:padded], self.store.pool)
        except BaseException:
            staging.close()
            raise
        return staging.view[:length], staging.close

    def write_range(self, offset: int, length: int, fill: Callable[[memoryview], None]) -> None:
        """`fill` the staging buffer (from the socket), then write it to the slab."""
        padded = self._check(offset, length)
        with self._lock:
            self._written.pop(offset, None)  # a failed write must not leave an old record
        staging = self.store.buffers.take(padded)
        try:
            fill(staging.view[:length])
            try:
                checksum = self.store.write(offset, staging, length, None)
            except KVStoreError as exc:
                raise SsdWriteError(f"SSD write at {offset}: {exc}") from exc
        finally:
            staging.close()
        with self._lock:
            self._written[offset] = (length, checksum)

    def write_from(self, offset: int, source: memoryview) -> int:
        """Write `source` (node-local memory: an offload) at `offset`; its checksum."""
        padded = self._check(offset, source.nbytes)
        staging = self.store.buffers.take(padded)
        try:
            checksum = self.store.write(offset, staging, source.nbytes, source)
        finally:
            staging.close()
        with self._lock:
            self._written[offset] = (source.nbytes, checksum)
        return checksum

    def read_into(self, offset: int, out: memoryview) -> int:
        """Read the object at `offset` into `out` (a promotion); its checksum."""
        view, release = self.read_range(offset, out.nbytes)
        try:
            copy_bytes(out, view)
            return checksum_of(view)
        finally:
            release()

    # ---- same-host peers (fd) --------------------------------------------------

    def serve(self, server: FdServer) -> str:
        """Hand the slab's fd to same-host peers through `server`; its address."""
        if self._server is None:
            server.add(self)
            self._server = server
        return server.address

    @property
    def served(self) -> bool:
        """Whether same-host peers may ask for the slab's fd (`serve` was called)."""
        return self._server is not None

    @property
    def fd_socket(self) -> str:
        """The address of the fd server that hands out the slab's fd ("" = none)."""
        return self._server.address if self._server is not None else ""

    def dup_fd(self) -> int:
        """A new fd of the slab (O_DIRECT when the slab is) for the fd server to send."""
        if self.closed:
            raise NotFoundError(f"SSD segment {self.name!r} is closed")
        return self.store.slab.dup_fd()

    # ---- durability -------------------------------------------------------------

    def persist(self, key: str, offset: int, length: int, checksum: int) -> int:
        """Record `key` at `offset` in the index once its bytes match `checksum` (0 =
        take what is there). Returns the checksum recorded; CorruptError on mismatch."""
        got = self._written_checksum(offset, length, checksum)
        if got is None and checksum:  # written by a peer through the fd: see the module doc
            got = checksum
        elif got is None or (checksum and got != checksum):
            # unrecorded and no checksum to trust, or a record that disagrees (a stale
            # one, left by an uncommitted TCP write at this offset): the disk decides
            got = self._checksum_on_disk(offset, length)
        if checksum and got != checksum:
            raise CorruptError(f"{key!r}: bytes at SSD offset {offset} fail their checksum")
        with self._lock:
            self._generation += 1
            generation = self._generation
        self.store.index.put(key, IndexEntry(offset, length, got, generation))
        return got

    def _checksum_on_disk(self, offset: int, length: int) -> int:
        view, release = self.read_range(offset, length)
        try:
            return checksum_of(view)
        finally:
            release()

    def _written_checksum(self, offset: int, length: int, checksum: int) -> int | None:
        """The checksum of [offset, +length) from what this process wrote, or None.

        One write of the whole object: its own checksum (compared by the caller). A
        large object arrives as several chunk writes (the TCP engine splits it) whose
        checksums do not compose: when they cover the range exactly, the object's
        recorded checksum is taken; readers verify every read against it and a
        reopen verifies it again, so a lying writer is caught, never served."""
        with self._lock:
            seen = self._written.get(offset)
            if seen is not None and seen[0] == length:
                del self._written[offset]
                return seen[1]
            pieces, pos = [], offset
            while pos < offset + length:
                piece = self._written.get(pos)
                if piece is None:
                    return None
                pieces.append(pos)
                pos += piece[0]
            if pos != offset + length or not checksum:
                return None
            for start in pieces:
                del self._written[start]
        return checksum

    def forget(self, key: str, offset: int) -> bool:
        """Drop `key` from the index if it still names `offset`; whether it did."""
        entry = self.store.index.get(key)
        if entry is None or entry.offset != offset:
            return False
        self.store.index.delete(key, entry)
        return True

    def indexed(self) -> dict[str, IndexEntry]:
        """Every index entry (tests and `kvstore tiers`)."""
        return {k: e for k, e in self.store.index.items() if e is not None}

    def close(self) -> None:
        if self._server is not None:
            self._server.remove(self.name, self)
            self._server = None
        self.closed = True
        with contextlib.suppress(Exception):
            self.store.close()


def _safe(node_id: str) -> str:
    return node_id.replace("/", "_").replace("\0", "_")[:160]


def check_directory(directory: str) -> None:
    """A typed error unless `directory` exists and this process may write in it."""
    if not os.path.isdir(directory):
        raise NotFoundError(f"SSD directory {directory!r} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise BadRequestError(f"SSD directory {directory!r} is not writable")


def claim_directory(directory: str, node_id: str, capacity: int, alignment: int) -> None:
    """Record the owner in `node.json`, or refuse a directory another node owns."""
    path = os.path.join(directory, IDENTITY_FILE)
    want = {"node_id": node_id, "capacity": capacity, "alignment": alignment}
    try:
        with open(path) as f:
            have = json.load(f)
    except FileNotFoundError:
        have = None
    except (OSError, ValueError) as exc:
        raise BadRequestError(f"unreadable {path!r}: {exc}") from exc
    if have is None:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(want, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # atomic: never a half-written identity
        return
    if have.get("node_id") != node_id:
        raise BadRequestError(
            f"SSD directory {directory!r} belongs to node {have.get('node_id')!r}, "
            f"not {node_id!r}: start that node, or give this one its own directory"
        )
    if (have.get("capacity"), have.get("alignment")) != (capacity, alignment):
        raise BadRequestError(
            f"SSD directory {directory!r} was created with capacity {have.get('capacity')} "
            f"and alignment {have.get('alignment')}, not {capacity} and {alignment}"
        )
