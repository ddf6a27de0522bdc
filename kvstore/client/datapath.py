"""The client's data plane: one batch of one-sided transfers per call, no copies.

Local memory is found in the buffers registered by the user (by address, so any
slice of a registered array works) or registered for the duration of the batch.
Each batch is submitted once and waited on once; the engine's own per-chunk I/O
timeout (`timeout_s`) fails a hung peer, the wait (twice that) is a safety net.
"""

from __future__ import annotations

import bisect
import itertools
import ssl
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvstore.buffers import address_of, byte_view
from kvstore.client.buffers import engine_view
from kvstore.errors import BadRequestError, KVStoreError, NotFoundError
from kvstore.transfer.base import (
    BufferDescriptor,
    SegmentDescriptor,
    TransferOp,
    TransferRequest,
)
from kvstore.transfer.select import choose_kind, make_engine
from kvstore.transfer.shm import ShmEngine, shm_reachable
from kvstore.transfer.tcp import TcpConfig


@dataclass(frozen=True, slots=True)
class Transfer:
    """Move `view` (local) to/from remote[remote_offset : remote_offset + view.nbytes]."""

    remote: SegmentDescriptor
    remote_offset: int
    view: memoryview
    capability: bytes = b""  # the master's grant for this range (secured mode)


@dataclass(frozen=True, slots=True)
class BatchResult:
    """A result per transfer; `settled` False when some may still be in flight."""

    errors: list[Exception | None]
    settled: bool


@dataclass(frozen=True, slots=True)
class _Region:
    start: int
    end: int
    desc: BufferDescriptor
    owner: object  # keeps the user's buffer alive while registered


class DataPath:
    """A transfer engine plus the user's registered buffers."""

    def __init__(
        self, transport: str, timeout_s: float, tls: ssl.SSLContext | None = None,
        server_name: str = "", shm_prefault: bool = True,
    ) -> None:  # fmt: skip
        tcp = TcpConfig(
            connect_timeout=min(5.0, timeout_s), io_timeout=timeout_s, tls=tls,
            server_name=server_name,
        )  # fmt: skip
        self.transport = transport
        self.engine = make_engine(transport, tcp=tcp, shm_prefault=shm_prefault)
        self._timeout = timeout_s
        self._regions: list[_Region] = []  # sorted by start, non-overlapping
        self._starts: list[int] = []  # region starts, for bisect
        self._lock = threading.Lock()
        self._names = itertools.count()
        # Segments this process lends (its contributed node's DRAM), by segment name: a
        # transfer to or from one is a memcpy in place, with no engine and no second
        # mapping of the same memory (`adopt_local`).
        self._local: dict[str, memoryview] = {}

    @classmethod
    def for_config(cls, config: Any) -> DataPath:
        """The data path of a ClientConfig: TLS to the nodes when its credential is mTLS
        (kvstore.security.credentials.data_plane_client)."""
        tls, name = None, ""
        if config.credentials is not None:
            from kvstore.security.credentials import data_plane_client
            from kvstore.security.process import security_of

            sec = security_of(config)
            tls, name = data_plane_client(sec), sec.server_name
        return cls(config.transport, config.timeout_s, tls, name, config.shm_prefault)

    # -- registered buffers ----------------------------------------------------

    def register(self, buffer: object) -> None:
        """Register `buffer` for zero-copy *_from / *_into calls (any slice of it works)."""
        view = byte_view(buffer)
        start = address_of(view)
        if not view.nbytes:
            raise BadRequestError("cannot register an empty buffer")
        with self._lock:
            i = bisect.bisect_left(self._starts, start)
            near = self._regions[max(0, i - 1) : i + 1]
            if any(r.start < start + view.nbytes and start < r.end for r in near):
                raise BadRequestError("buffer overlaps a registered buffer")
            desc = self.engine.register(f"r{next(self._names)}", engine_view(view))
            self._regions.insert(i, _Region(start, start + view.nbytes, desc, buffer))
            self._starts.insert(i, start)

    def unregister(self, buffer: object) -> None:
        """Forget a registered buffer (NotFoundError if it was not registered)."""
        start = address_of(byte_view(buffer))
        with self._lock:
            for i, region in enumerate(self._regions):
                if region.start == start:
                    del self._regions[i], self._starts[i]
                    self.engine.unregister(region.desc.name)
                    return
        raise NotFoundError("buffer is not registered")

    def _find(self, view: memoryview) -> tuple[BufferDescriptor, int] | None:
        if not self._starts:
            return None
        start = address_of(view)
        with self._lock:
            i = bisect.bisect_right(self._starts, start) - 1
            if i >= 0 and start + view.nbytes <= self._regions[i].end:
                region = self._regions[i]
                return region.desc, start - region.start
        return None

    def check_integrity(self) -> None:
        """Regions sorted and disjoint; the engine holds exactly their buffers (no temp
        registration outlives its batch)."""
        with self._lock:
            assert self._starts == [r.start for r in self._regions], "start index is stale"
            for a, b in zip(self._regions, self._regions[1:], strict=False):
                assert a.end <= b.start, "registered buffers overlap"
            names = sorted(r.desc.name for r in self._regions)
        assert sorted(self.engine.buffers.names()) == names, "leaked engine registrations"

    # -- segments of this process -------------------------------------------------

    def adopt_local(self, name: str, buffer: memoryview) -> None:
        """`buffer` is segment `name`, lent by this very process: move its bytes by memcpy."""
        self._local[name] = buffer

    def drop_local(self) -> None:
        """Forget the adopted segments (before their owner unmaps them)."""
        self._local.clear()

    def _local_copy(self, op: TransferOp, t: Transfer, mem: memoryview) -> Exception | None:
        end = t.remote_offset + t.view.nbytes
        if t.remote_offset < 0 or end > mem.nbytes:
            return BadRequestError(f"range [{t.remote_offset}, {end}) is outside {t.remote.name!r}")
        if op == TransferOp.READ:
            t.view[:] = mem[t.remote_offset : end]
        else:
            mem[t.remote_offset : end] = t.view
        return None

    # -- transfers --------------------------------------------------------------

    def run(
        self, op: TransferOp, transfers: Sequence[Transfer],
        meanwhile: Callable[[], object] | None = None,
    ) -> BatchResult:  # fmt: skip
        """Submit every transfer as one batch and wait; an error per transfer.
        `meanwhile` runs in this thread while the batch is in flight (engines that move
        bytes on their own threads: TCP, the slab fd), or after it (inline ones)."""
        errors: list[Exception | None] = [None] * len(transfers)
        temps: list[str] = []
        reqs, index = [], []
        reachable: set[int] = set()  # ids of the remote descriptors checked in this batch
        try:
            for i, t in enumerate(transfers):
                local = self._local.get(t.remote.name) if self._local else None
                if local is not None:
                    errors[i] = self._local_copy(op, t, local)
                    continue
                try:
                    if id(t.remote) not in reachable:
                        self._check_reachable(t.remote)
                        reachable.add(id(t.remote))
                    reqs.append(self._request(op, t, temps))
                    index.append(i)
                except KVStoreError as exc:
                    errors[i] = exc
            if not reqs:
                if meanwhile is not None:
                    meanwhile()
                return BatchResult(errors, True)
            handle = self.engine.submit(reqs)
            if meanwhile is not None:
                meanwhile()
            for i, err in zip(index, handle.wait(2 * self._timeout), strict=True):
                errors[i] = err
            return BatchResult(errors, handle.done())
        finally:
            for name in temps:
                self.engine.unregister(name)

    def _request(self, op: TransferOp, t: Transfer, temps: list[str]) -> TransferRequest:
        found = self._find(t.view)
        if found is None:
            name = f"t{next(self._names)}"
            desc = self.engine.register(name, engine_view(t.view))
            temps.append(name)
            found = desc, 0
        desc, offset = found
        return TransferRequest(
            op, t.remote, t.remote_offset, t.view.nbytes, desc, offset, t.capability
        )

    def _check_reachable(self, remote: SegmentDescriptor) -> None:
        if self.transport == "shm" and not shm_reachable(remote):
            raise BadRequestError(f"segment {remote.name!r} cannot be mapped from this host")
        if self.transport == "tcp" and not remote.endpoint:
            raise BadRequestError(f"segment {remote.name!r} has no TCP endpoint")
        if self.transport == "auto":
            choose_kind(remote)

    def mapped(self, remote: SegmentDescriptor, capability: bytes = b"") -> memoryview | None:
        """`remote` as mapped memory when this data path reaches it by shared memory
        (`capability`: the grant a secured node's fd server asks for)."""
        local = self._local.get(remote.name) if self._local else None
        if local is not None:
            return local
        if self.transport not in ("shm", "auto") or not shm_reachable(remote):
            return None
        engine = self.engine
        shm = engine if isinstance(engine, ShmEngine) else engine.engine("shm")  # type: ignore[attr-defined]
        try:
            return shm.mapped(remote, capability)
        except KVStoreError:
            return None

    def close(self) -> None:
        self.engine.close()
