"""ShmEngine: same-host transfers by mapping the peer's shared-memory segment.

The remote segment is mapped once (mappings cached): its fd is fetched from the
owner's fd server (the descriptor's `shm_socket`, see kvstore.tiers.shm), mapped
and closed. Bytes then move by one memcpy (memoryview slice assignment), no
socket and no copy through the peer process. Only segments whose descriptor says
`shm`, names an fd socket and carries this host's id can be reached. Transfers
run in the caller's thread; `submit` returns a completed handle.

Secured mode: the request's capability goes with the fd request, and a secured node's
fd server (`fd_gate`) hands the fd only for a live capability of that segment to a
peer of an allowed uid. A mapping is the whole segment, so same-host shm peers are
trusted at segment granularity: per-range enforcement between mutually untrusted
local processes needs `transport="tcp"` (docs/security.md).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Sequence

from kvstore.errors import BadRequestError, KVStoreError, PermissionDeniedError, TransferError
from kvstore.security.capabilities import Keyring
from kvstore.tiers.shm import SharedSegment
from kvstore.transfer.base import (
    SegmentDescriptor,
    TransferEngine,
    TransferHandle,
    TransferOp,
    TransferRequest,
)


def shm_reachable(remote: SegmentDescriptor) -> bool:
    """Whether this process can map `remote` directly."""
    return remote.shm and bool(remote.shm_socket) and remote.same_host


class ShmEngine(TransferEngine):
    """One-sided READ/WRITE by memcpy into/out of mapped peer segments. A segment is
    mapped with a background pre-fault (`prefault`, kvstore.tiers.prefault,
    ClientConfig.shm_prefault), or else lazily (each page faults in on first touch)."""

    kind = "shm"

    def __init__(self, prefault: bool = True) -> None:
        super().__init__()
        self.prefault = prefault
        self._maps: dict[tuple[str, str], SharedSegment] = {}
        self._lock = threading.Lock()

    def submit(self, batch: Sequence[TransferRequest]) -> TransferHandle:
        views = self.check_batch(batch)
        for req in batch:
            if not shm_reachable(req.remote):
                raise BadRequestError(
                    f"segment {req.remote.name!r} is not a shared segment on this host"
                )
        handle = TransferHandle(len(batch))
        for index, (req, local) in enumerate(zip(batch, views, strict=True)):
            handle.complete(index, self._copy(req, local))
        return handle

    def _copy(self, req: TransferRequest, local: memoryview) -> Exception | None:
        try:
            mem = self._segment(req.remote, req.capability)
            remote = mem[req.remote_offset : req.remote_offset + req.length]
            if req.op == TransferOp.READ:
                local[:] = remote
            else:
                remote[:] = local
        except KVStoreError as e:
            return e
        except (OSError, ValueError) as e:
            return TransferError(f"shm transfer on {req.remote.name!r} failed: {e}")
        return None

    def _segment(self, desc: SegmentDescriptor, capability: bytes = b"") -> memoryview:
        """The mapped peer segment (attached once, writable). A segment re-created
        under the same name by a restarted owner comes from another fd socket: the
        cache is keyed by both."""
        key = (desc.shm_socket, desc.name)
        with self._lock:
            seg = self._maps.get(key)
            if seg is None or seg.size < desc.size:
                if seg is not None:
                    seg.close()
                seg = self._maps[key] = SharedSegment.attach(
                    desc.name, desc.shm_socket, writable=True, populate=self.prefault,
                    capability=capability,
                )  # fmt: skip
        if seg.size < desc.size:
            raise BadRequestError(
                f"segment {desc.name!r} has {seg.size} bytes, descriptor says {desc.size}"
            )
        return seg.buffer

    def mapped(self, desc: SegmentDescriptor, capability: bytes = b"") -> memoryview:
        """The whole peer segment as memory (mapped once): for callers that copy and
        checksum in one pass instead of submitting a READ."""
        if not shm_reachable(desc):
            raise BadRequestError(f"segment {desc.name!r} is not a shared segment on this host")
        return self._segment(desc, capability)

    def detach(self, name: str) -> bool:
        """Drop the cached mappings of segment `name` (e.g. after its owner removed it)."""
        with self._lock:
            keys = [key for key in self._maps if key[1] == name]
            segs = [self._maps.pop(key) for key in keys]
        for seg in segs:
            seg.close()
        return bool(segs)

    def close(self) -> None:
        with self._lock:
            maps, self._maps = list(self._maps.values()), {}
        for seg in maps:
            seg.close()


def fd_gate(keyring: Keyring, uids: Iterable[int] = ()) -> Callable[[str, bytes, int], None]:
    """A secured node's fd-server check (kvstore.tiers.shm.FdServer `authorize`): the
    peer's SO_PEERCRED uid is this process's (or root, or one of `uids`), and it
    presents a live capability `keyring` verifies for the segment it asks for."""
    allowed = frozenset({0, os.getuid(), *uids})

    def authorize(name: str, capability: bytes, uid: int) -> None:
        if uid not in allowed:
            keyring.refused += 1
            raise PermissionDeniedError(f"fd of {name!r}: uid {uid} is not allowed")
        keyring.check_segment(name, capability)

    return authorize
