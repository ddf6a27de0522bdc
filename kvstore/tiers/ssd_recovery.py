"""Rebuild the SSD tier's state from its index when it opens.

The index is the only truth: a slab range is allocated iff an entry names it,
so bytes of a write that was killed before its index entry are free space.
Entries that cannot be right (undecodable, out of range, overlapping another)
are dropped as invalid; with verification on, entries whose bytes fail their
checksum are dropped as corrupt. Both drops are deleted from the index.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from kvstore.errors import KVStoreError
from kvstore.tiers.allocator import OffsetAllocator
from kvstore.tiers.ssd_handles import SsdObject
from kvstore.tiers.ssd_index import IndexEntry, SsdIndex
from kvstore.types import check_key

# (offset, padded, length, checksum) -> do the slab bytes match?
ReadChecked = Callable[[int, int, int, int], bool]


@dataclass(slots=True)
class RecoveryReport:
    """What open() found: surviving objects (oldest first) and what it dropped."""

    objects: list[tuple[str, SsdObject]] = field(default_factory=list)
    next_generation: int = 0
    dropped_invalid: int = 0
    dropped_corrupt: int = 0

    def counters(self) -> dict[str, float]:
        return {
            "recovered": float(len(self.objects)),
            "dropped_invalid": float(self.dropped_invalid),
            "dropped_corrupt": float(self.dropped_corrupt),
        }


def recover(
    index: SsdIndex, alloc: OffsetAllocator, read_checked: ReadChecked, verify: bool
) -> RecoveryReport:
    """Claim every indexed range in `alloc`; return the objects in LRU order."""
    report = RecoveryReport()
    placed: list[tuple[str, SsdObject]] = []
    bad: list[str] = []
    entries = sorted(index.items(), key=lambda item: item[1].offset if item[1] else -1)
    for key, entry in entries:
        obj = _place(key, entry, alloc)
        if obj is None:
            bad.append(key)
        else:
            placed.append((key, obj))
    report.dropped_invalid = len(bad)
    if verify:
        placed, corrupt = _verify(placed, read_checked)
        for _key, obj in corrupt:
            alloc.free(obj.offset)
        bad += [key for key, _ in corrupt]
        report.dropped_corrupt = len(corrupt)
    for key in bad:
        index.delete(key)
    placed.sort(key=lambda item: item[1].generation)
    report.objects = placed
    report.next_generation = max((obj.generation for _, obj in placed), default=0)
    return report


def _place(key: str, entry: IndexEntry | None, alloc: OffsetAllocator) -> SsdObject | None:
    """Claim the entry's range; None if the entry cannot be a committed object."""
    if entry is None or entry.length <= 0:
        return None
    try:
        check_key(key)
        padded = alloc.aligned(entry.length)
        alloc.allocate_at(entry.offset, padded)
    except KVStoreError:
        return None
    return SsdObject(entry.offset, entry.length, padded, entry.checksum, entry.generation)


def _verify(
    placed: list[tuple[str, SsdObject]], read_checked: ReadChecked
) -> tuple[list[tuple[str, SsdObject]], list[tuple[str, SsdObject]]]:
    """Split objects into (intact, corrupt) by reading them, a few at a time."""

    def intact(item: tuple[str, SsdObject]) -> bool:
        obj = item[1]
        try:
            return read_checked(obj.offset, obj.padded, obj.length, obj.checksum)
        except KVStoreError:
            return False

    with ThreadPoolExecutor(4, thread_name_prefix="ssd-verify") as pool:
        flags = list(pool.map(intact, placed))
    good = [item for item, ok in zip(placed, flags, strict=True) if ok]
    corrupt = [item for item, ok in zip(placed, flags, strict=True) if not ok]
    return good, corrupt
