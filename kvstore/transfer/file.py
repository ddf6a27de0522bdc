"""FileEngine: same-host transfers to SSD segments through the slab file's own fd.

A storage node's SSD segment is one slab file (kvstore.tiers.ssd_segment). A peer on
the same host asks the node's fd server for the slab's fd once (the descriptor's
`shm_socket`, as for shared memory; a secured node hands it only for a live
capability of that segment, to an allowed uid) and then preads/pwrites the ranges
the master allocated itself: the bytes go between the caller's buffer and the
device, with no TCP copy and no node thread in between. The fd shares the node's
open file, O_DIRECT included: direct I/O needs page-aligned memory, offsets and
lengths, so pieces of the caller's buffer that are not aligned (and the padded tail
of an object) go through a reused aligned staging buffer. A buffered slab (where the
filesystem refuses O_DIRECT) is written as is and fdatasync'd, as the node does.

Objects are cut into 1 MiB pieces that run in parallel on a small thread pool
(pwritev/preadv and the numpy copies release the GIL); a batch of one piece runs in
the caller's thread. As with shared memory, a peer holding the fd can reach the whole
slab: same-host peers are trusted at segment granularity (docs/security.md).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from kvstore.buffers import address_of
from kvstore.errors import BadRequestError, KVStoreError, TransferError
from kvstore.tiers.direct_io import CHUNK_BYTES, DIRECT, BufferPool, SlabFile, round_up
from kvstore.tiers.shm import fetch_fd
from kvstore.transfer.base import (
    SegmentDescriptor,
    TransferEngine,
    TransferHandle,
    TransferOp,
    TransferRequest,
)

PAGE = 4096  # O_DIRECT alignment of memory, offsets and lengths (the slab's allocation unit)


def file_reachable(remote: SegmentDescriptor) -> bool:
    """Whether `remote` is a slab file whose fd this host may ask for."""
    return remote.file and bool(remote.shm_socket) and remote.same_host


class _Request:
    """One request's pieces in flight; completes its handle slot at the last one."""

    __slots__ = ("error", "handle", "index", "left", "lock", "slab", "write")

    def __init__(
        self, handle: TransferHandle, index: int, pieces: int, slab: SlabFile, write: bool
    ) -> None:
        self.handle, self.index, self.left = handle, index, pieces
        self.slab, self.write = slab, write
        self.error: Exception | None = None
        self.lock = threading.Lock()

    def piece_done(self, error: Exception | None) -> None:
        with self.lock:
            self.error = self.error or error
            self.left -= 1
            if self.left:
                return
        if self.error is None and self.write:
            try:
                self.slab.sync()  # a no-op for O_DIRECT
            except KVStoreError as exc:
                self.error = exc
        self.handle.complete(self.index, self.error)


class FileEngine(TransferEngine):
    """One-sided READ/WRITE by pread/pwrite on same-host peers' SSD slab fds."""

    kind = "file"

    def __init__(self, io_threads: int = 4, staging_bytes: int = 64 << 20) -> None:
        super().__init__()
        self._slabs: dict[tuple[str, str], SlabFile] = {}
        self._refused: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(io_threads, thread_name_prefix="kvstore-file")
        self._staging = BufferPool(staging_bytes)

    # ---- slabs ----------------------------------------------------------------

    def usable(self, remote: SegmentDescriptor, capability: bytes = b"") -> bool:
        """Whether `remote`'s slab is open here, opening it now if need be. A refusal
        (an older node that serves no slab fd, a gate that says no) is remembered, so
        the caller goes over TCP from then on without asking again."""
        key = (remote.shm_socket, remote.name)
        with self._lock:
            if key in self._slabs:
                return True
            if key in self._refused:
                return False
        try:
            self._slab(remote, capability)
        except KVStoreError:
            with self._lock:
                self._refused.add(key)
            return False
        return True

    def _slab(self, remote: SegmentDescriptor, capability: bytes) -> SlabFile:
        key = (remote.shm_socket, remote.name)
        with self._lock:
            slab = self._slabs.get(key)
        if slab is None:
            fd = fetch_fd(remote.shm_socket, remote.name, capability=capability)
            try:
                slab = SlabFile.of_fd(fd, remote.name, PAGE)
            except BaseException:
                os.close(fd)
                raise
            with self._lock:
                kept = self._slabs.setdefault(key, slab)
            if kept is not slab:  # another thread opened it meanwhile
                slab.close()
                slab = kept
        if slab.capacity < remote.size:
            raise BadRequestError(
                f"slab {remote.name!r} has {slab.capacity} bytes, descriptor says {remote.size}"
            )
        return slab

    # ---- transfers --------------------------------------------------------------

    def submit(self, batch: Sequence[TransferRequest]) -> TransferHandle:
        views = self.check_batch(batch)
        for req in batch:
            if not file_reachable(req.remote):
                raise BadRequestError(f"segment {req.remote.name!r} is not a slab on this host")
        handle = TransferHandle(len(batch))
        work: list[tuple[_Request, int, memoryview]] = []
        for index, (req, local) in enumerate(zip(batch, views, strict=True)):
            try:
                slab = self._slab(req.remote, req.capability)
                self._check_range(slab, req)
            except KVStoreError as exc:
                handle.complete(index, exc)
                continue
            if not req.length:
                handle.complete(index)
                continue
            starts = range(0, req.length, CHUNK_BYTES)
            state = _Request(handle, index, len(starts), slab, req.op == TransferOp.WRITE)
            work += [(state, req.remote_offset + i, local[i : i + CHUNK_BYTES]) for i in starts]
        if len(work) == 1:  # one piece: no thread hand-off
            self._piece(*work[0])
        else:
            for item in work:
                self._pool.submit(self._piece, *item)
        return handle

    @staticmethod
    def _check_range(slab: SlabFile, req: TransferRequest) -> None:
        padded = round_up(req.length, PAGE) if slab.mode == DIRECT else req.length
        if slab.mode == DIRECT and req.remote_offset % PAGE:
            raise BadRequestError(f"offset {req.remote_offset} of {slab.path!r} is not aligned")
        if req.remote_offset + padded > slab.capacity:
            raise BadRequestError(
                f"range [{req.remote_offset}, +{req.length}) is outside slab {slab.path!r}"
            )

    def _piece(self, state: _Request, offset: int, local: memoryview) -> None:
        """Move one piece: straight from/to `local` when the slab is buffered or
        `local` is aligned, else through a staging buffer padded to the page."""
        error: Exception | None = None
        try:
            n = local.nbytes
            if state.slab.mode != DIRECT or (address_of(local) % PAGE == 0 and n % PAGE == 0):
                part, staging = local, None
            else:
                staging = self._staging.take(round_up(n, PAGE))
                part = staging.view
            try:
                if state.write:
                    state.slab.copy_and_write(offset, part, None if staging is None else local)
                else:
                    state.slab.read_and_copy(offset, part, None if staging is None else local)
            finally:
                if staging is not None:
                    staging.close()
        except KVStoreError as exc:
            error = exc
        except (OSError, ValueError) as exc:
            error = TransferError(f"slab I/O on {state.slab.path!r} failed: {exc}")
        state.piece_done(error)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        with self._lock:
            slabs, self._slabs = list(self._slabs.values()), {}
        for slab in slabs:
            slab.close()
        self._staging.clear()
