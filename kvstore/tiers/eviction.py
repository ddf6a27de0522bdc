"""Choosing LRU victims that make room for one allocation, without evicting yet.

Planning first lets a tier raise NoSpaceError with nothing changed when even
evicting every evictable object would not make the new object fit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from kvstore.tiers.allocator import OffsetAllocator

T = TypeVar("T")


class FitPlanner:
    """Tracks the free runs that freeing a growing set of allocations would leave,
    so `fits` tells whether `size` bytes would then be allocatable (O(1) per add)."""

    def __init__(self, allocator: OffsetAllocator, size: int) -> None:
        self._alloc = allocator
        self._size = size
        self._start_by_end: dict[int, int] = {}
        self._end_by_start: dict[int, int] = {}
        self.fits = allocator.largest_free() >= size

    def add(self, offset: int, length: int) -> None:
        """Pretend the allocation [offset, offset + length) were freed."""
        start, end = offset, offset + length
        run_start = self._start_by_end.pop(start, None)
        if run_start is not None:
            del self._end_by_start[run_start]
            start = run_start
        else:
            free_start = self._alloc.free_start_before(start)
            start = start if free_start is None else free_start
        run_end = self._end_by_start.pop(end, None)
        if run_end is not None:
            del self._start_by_end[run_end]
            end = run_end
        else:
            end += self._alloc.free_size_at(end)
        self._start_by_end[end] = start
        self._end_by_start[start] = end
        if end - start >= self._size:
            self.fits = True


def choose_victims(
    candidates: Iterable[T],
    span: Callable[[T], tuple[int, int]],
    allocator: OffsetAllocator,
    size: int,
    target_used: int,
) -> list[T] | None:
    """The shortest prefix of `candidates` (evictable, oldest first) whose eviction
    lets `size` bytes be allocated and brings usage, new object included, to at
    most `target_used`; fewer if usage cannot get that low; None if it never fits.

    `span(candidate)` is its (offset, allocated length).
    """
    planner = FitPlanner(allocator, size)
    used = allocator.used
    victims: list[T] = []
    for candidate in candidates:
        if planner.fits and used + size <= target_used:
            break
        offset, length = span(candidate)
        planner.add(offset, length)
        used -= length
        victims.append(candidate)
    return victims if planner.fits else None
