"""The SSD tier's persistent half: slab file, index, staging buffers, I/O threads.

`SsdTier` keeps the object state machine and the LRU; this class moves bytes
and checksums them. It knows nothing of readers, pins or eviction.
"""

from __future__ import annotations

import contextlib
import functools
import os
from concurrent.futures import ThreadPoolExecutor

from kvstore.errors import CorruptError
from kvstore.tiers.allocator import OffsetAllocator
from kvstore.tiers.direct_io import AlignedBuffer, BufferPool, SlabFile
from kvstore.tiers.ssd_handles import SsdConfig, SsdObject
from kvstore.tiers.ssd_index import SsdIndex, checksum_of
from kvstore.tiers.ssd_recovery import RecoveryReport, recover

STAGING_CACHE_BYTES = 256 << 20  # staging buffers kept for reuse (see BufferPool)


class SlabStore:
    """Opens `<directory>/slab.dat` and `<directory>/index`; closes both if either fails."""

    def __init__(self, config: SsdConfig) -> None:
        self.config = config
        self.buffers = BufferPool(min(config.capacity_bytes, STAGING_CACHE_BYTES))
        with contextlib.ExitStack() as undo:
            os.makedirs(config.directory, exist_ok=True)
            path = os.path.join(config.directory, "slab.dat")
            self.slab = SlabFile(path, config.capacity_bytes, config.alignment, config.direct_io)
            undo.callback(self.slab.close)
            self.index = SsdIndex(os.path.join(config.directory, "index"), config.sync_index)
            undo.callback(self.index.close)
            self.pool = ThreadPoolExecutor(config.io_threads, thread_name_prefix="ssd-io")
            undo.pop_all()

    @property
    def mode(self) -> str:
        """'direct' (O_DIRECT) or 'buffered' (fallback where the filesystem refuses it)."""
        return self.slab.mode

    def recover(self, alloc: OffsetAllocator) -> RecoveryReport:
        """Rebuild `alloc` from the index; see ssd_recovery."""
        read = functools.partial(self.slab.read_new, pool=self.pool, buffers=self.buffers)
        try:
            return recover(self.index, alloc, read, self.config.verify_on_open)
        except BaseException:
            self.close()
            raise

    def write(
        self, offset: int, staging: AlignedBuffer, size: int, source: memoryview | None
    ) -> int:
        """Write an object (copying `source` into `staging` on the way); its checksum,
        computed while the chunks are in flight."""
        data = staging.view[:size] if source is None else source
        checksum: list[int] = []
        self.slab.write(
            offset, staging.view, self.pool, source, lambda: checksum.append(checksum_of(data))
        )
        return checksum[0]

    def read(self, key: str, obj: SsdObject, out: memoryview | None) -> AlignedBuffer:
        """Read and verify an object into a staging buffer (and on into `out`)."""
        staging = self.buffers.take(obj.padded)
        try:
            self.slab.read(obj.offset, staging.view, self.pool, out)
            got = checksum_of(staging.view[: obj.length] if out is None else out)
        except BaseException:
            staging.close()
            raise
        if got != obj.checksum:
            staging.close()
            raise CorruptError(f"{key!r}: checksum mismatch at slab offset {obj.offset}")
        return staging

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.index.close()
        self.slab.close()
        self.buffers.clear()
