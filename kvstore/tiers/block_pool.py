"""Ref-counted block ids with a FIFO free list (after vLLM v1's block pool).

A block is free (ref count 0, in the free list) or in use (ref count >= 1, not in
the free list). `allocate` is all-or-nothing; `decref` to zero returns the block
to the tail of the free list, so the least recently freed block is reused first.
This module is pure Python (no torch): it only hands out integers.
"""

from __future__ import annotations

from collections import deque

from kvstore.errors import BadRequestError


class BlockPool:
    """Block ids 0..num_blocks-1, each with a reference count."""

    def __init__(self, num_blocks: int) -> None:
        if not isinstance(num_blocks, int) or isinstance(num_blocks, bool) or num_blocks <= 0:
            raise BadRequestError(f"num_blocks must be a positive int, got {num_blocks!r}")
        self._refs = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_blocks(self) -> int:
        return len(self._refs)

    @property
    def free_count(self) -> int:
        return len(self._free)

    @property
    def used_count(self) -> int:
        return self.num_blocks - len(self._free)

    def allocate(self, n: int) -> list[int] | None:
        """Take `n` free blocks (ref count 1 each), or None when fewer are free."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise BadRequestError(f"block count must be a non-negative int, got {n!r}")
        if n > len(self._free):
            return None
        ids = [self._free.popleft() for _ in range(n)]
        for block_id in ids:
            self._refs[block_id] = 1
        return ids

    def ref_count(self, block_id: int) -> int:
        return self._refs[self._check(block_id)]

    def incref(self, block_id: int) -> int:
        """Add a reference to an in-use block; returns the new count."""
        if self._refs[self._check(block_id)] == 0:
            raise BadRequestError(f"incref of free block {block_id}")
        self._refs[block_id] += 1
        return self._refs[block_id]

    def decref(self, block_id: int) -> bool:
        """Drop a reference; True when the block became free."""
        if self._refs[self._check(block_id)] == 0:
            raise BadRequestError(f"decref of free block {block_id}")
        self._refs[block_id] -= 1
        if self._refs[block_id]:
            return False
        self._free.append(block_id)
        return True

    def check_integrity(self) -> None:
        """Free list holds each free block once and no block in use."""
        free = set(self._free)
        if len(free) != len(self._free):
            raise AssertionError("free list holds a block twice")
        for block_id, refs in enumerate(self._refs):
            if refs < 0:
                raise AssertionError(f"block {block_id} has ref count {refs}")
            if (refs == 0) != (block_id in free):
                raise AssertionError(f"block {block_id}: ref count {refs} vs free list")

    def _check(self, block_id: int) -> int:
        if not isinstance(block_id, int) or isinstance(block_id, bool):
            raise BadRequestError(f"block id must be an int, got {type(block_id).__name__}")
        if not 0 <= block_id < len(self._refs):
            raise BadRequestError(f"block id {block_id} out of range 0..{len(self._refs) - 1}")
        return block_id
