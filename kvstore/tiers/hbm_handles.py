"""Write and read handles of the HBM tier (see kvstore.tiers.base for the contract)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from kvstore.errors import BadRequestError
from kvstore.tiers.kv_layout import block_to_bytes
from kvstore.types import ObjectKey


class HbmWriteHandle:
    """A reserved block: fill `buffer` (a host staging tensor), then commit or abort."""

    def __init__(self, owner: object, key: ObjectKey, block_id: int, host: torch.Tensor) -> None:
        self.key = key
        self.size = host.numel() * host.element_size()
        self.block_id = block_id
        self.owner = owner
        self.host = host
        self.done = False

    @property
    def buffer(self) -> memoryview:
        return block_to_bytes(self.host)


class HbmReadHandle:
    """A committed block held against eviction; `block_id` can be used in place."""

    def __init__(
        self,
        key: ObjectKey,
        size: int,
        block_id: int,
        copy_out: Callable[[int], torch.Tensor],
        release: Callable[[int], None],
    ) -> None:
        self.key = key
        self.size = size
        self.block_id = block_id
        self._copy_out = copy_out
        self._release = release
        self._host: torch.Tensor | None = None
        self._released = False

    @property
    def buffer(self) -> memoryview:
        """The block's bytes, copied to host on first access."""
        if self._released:
            raise BadRequestError("read handle already released")
        if self._host is None:
            self._host = self._copy_out(self.block_id)
        return block_to_bytes(self._host)

    def release(self) -> None:
        """Drop the hold; idempotent."""
        if not self._released:
            self._released = True
            self._release(self.block_id)

    def __enter__(self) -> HbmReadHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
