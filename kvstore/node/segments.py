"""DRAM a process lends to the pool: anonymous shared memory that same-host peers map
by fd (the kernel frees it when the last user exits).

`buffer` is a writable memoryview over the whole segment, which the TransferServer
serves one-sided; the master allocates inside it. The SSD and HBM segments a node
lends are the tiers' own classes (kvstore.tiers.ssd_segment, kvstore.tiers.hbm_segment).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from kvstore.tiers.shm import FdServer, SharedSegment, check_segment_name
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

    @property
    def size(self) -> int:
        return self.buffer.nbytes

    @property
    def shm_socket(self) -> str:
        """Address of the fd server that hands this segment to peers."""
        return self._shared.address if self._shared is not None else ""

    def close(self) -> None:
        """Unmap and stop serving its fd. Idempotent."""
        if self._shared is not None:
            self._shared.close()
            self._shared = None


def create_dram(owner: str, size: int, server: FdServer | None = None) -> LocalSegment:
    """A new shared-memory segment of `size` bytes, reserved now (NoSpaceError if memory
    is short), served by fd to same-host peers through `server` (default: this
    process's fd server; a secured node passes its own, gated one)."""
    shared = SharedSegment.create(segment_name(owner, Tier.DRAM), size)
    try:
        shared.serve(server)
    except BaseException:
        shared.close()
        raise
    return LocalSegment(shared.name, Tier.DRAM, shared.buffer, True, _shared=shared)
